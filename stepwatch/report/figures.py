"""The report's figures, each rendered to PNG bytes with matplotlib (Agg, no display)."""

from __future__ import annotations

import io
from collections import defaultdict
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from stepwatch.extras import require
from stepwatch.report.data import ReportData, Rows
from stepwatch.report.goodput import LABELS, Badput, Breakdown

DPI = 110


def _plt() -> Any:
    require("matplotlib", what="the post-mortem report")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _png(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, bbox_inches="tight")
    _plt().close(fig)
    return buf.getvalue()


def _when(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, UTC)


def heat_map(data: ReportData) -> bytes:
    plt = _plt()
    import numpy as np
    from matplotlib import ticker

    ranks = sorted({int(r["rank"]) for r in data.heat})
    steps = sorted({int(r["step_bucket"]) for r in data.heat})
    grid = np.full((len(ranks), len(steps)), np.nan)
    ri = {r: i for i, r in enumerate(ranks)}
    si = {s: i for i, s in enumerate(steps)}
    for row in data.heat:
        if row["compute_s"] is not None:
            grid[ri[int(row["rank"])], si[int(row["step_bucket"])]] = float(row["compute_s"])
    fig, ax = plt.subplots(figsize=(11, max(3.0, min(9.0, 0.12 * len(ranks) + 2))))
    extent = (steps[0], steps[-1] + 1, ranks[-1] + 0.5, ranks[0] - 0.5) if steps else None
    # colour scale from the bulk of the run: warm-up steps would wash out a 10 % straggler
    # (a straggler is tens of percent slower): from the 1st percentile to 1.6 x the median
    finite = np.isfinite(grid).any()
    low = float(np.nanpercentile(grid, 1)) if finite else 0.0
    high = 1.6 * float(np.nanmedian(grid)) if finite else 1.0
    img = ax.imshow(grid, aspect="auto", cmap="magma", interpolation="nearest", extent=extent,
                    vmin=low, vmax=high)
    fig.colorbar(img, ax=ax, label="compute time (s)", extend="max")
    ax.set_xlabel("step")
    ax.set_ylabel("rank")
    ax.yaxis.set_major_locator(ticker.MaxNLocator(integer=True))  # ranks are whole numbers
    ax.set_title(f"{data.job}: compute time per rank and step (forward + backward + optimizer)")
    _mark_detections(ax, data.detections, horizontal=True)
    return _png(fig)


def _mark_detections(ax: Any, detections: Rows, *, horizontal: bool) -> None:
    for d in detections:
        if d["state"] == "open" and d.get("rank") is not None and horizontal:
            ax.axhline(int(d["rank"]), color="cyan", lw=0.6, ls=":")


def step_time(data: ReportData) -> bytes:
    plt = _plt()
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 6), sharex=True)
    t = [_when(float(s["start"])) for s in data.steps]
    top.plot(t, [float(s["step_s"]) for s in data.steps], lw=1, label="median over ranks")
    top.plot(t, [float(s["step_max_s"]) for s in data.steps], lw=0.8, alpha=0.6, label="slowest rank")
    top.set_ylabel("step time (s)")
    top.legend(loc="upper left")
    tput = [float(s["tokens"]) / float(s["step_s"]) if float(s["step_s"]) > 0 else 0.0
            for s in data.steps]
    bottom.plot(t, tput, color="tab:green", lw=1)
    bottom.set_ylabel("throughput (tokens/s)")
    bottom.set_xlabel("time (UTC)")
    for ax in (top, bottom):
        _timeline_marks(ax, data)
    top.set_title(f"{data.job}: step time and throughput")
    fig.autofmt_xdate()
    return _png(fig)


def _timeline_marks(ax: Any, data: ReportData) -> None:
    for d in data.detections:
        if d["state"] == "open":
            ax.axvline(_when(float(d["ts"])), color="red", lw=0.8, ls="--")


def goodput_bar(b: Breakdown, job: str) -> bytes:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(11, 2.4))
    left = 0.0
    colors = {Badput.PRODUCTIVE: "tab:green", Badput.DATA_LOADING: "tab:orange",
              Badput.CHECKPOINT: "tab:blue", Badput.DISRUPTION: "tab:red", Badput.OTHER: "tab:gray"}
    for kind in Badput:
        share = 100 * b.fraction(kind)
        ax.barh([0], [share], left=left, color=colors[kind], label=f"{LABELS[kind]} {share:.1f} %")
        left += share
    ax.set_xlim(0, 100)
    ax.set_yticks([])
    ax.set_xlabel("share of available rank-seconds (%)")
    ax.set_title(f"{job}: goodput {100 * b.goodput:.1f} % of {b.available_s:,.0f} rank-seconds")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.45), ncol=3, fontsize=8)
    return _png(fig)


def timeline(data: ReportData) -> bytes:
    plt = _plt()
    lanes: list[tuple[str, Rows, Callable[[dict[str, Any]], str], str]] = [
        ("events", [e for e in data.events if e["type"] not in ("job_start", "job_end")],
         lambda e: str(e["type"]), "tab:gray"),
        ("detections", data.detections, lambda d: f"{d['type']} {d['state']}", "tab:red"),
        ("alerts", data.alerts, lambda a: f"{a['alertname']} {a['status']}", "tab:orange"),
        ("actions", data.actions, lambda a: f"{a['action']} {a['status']}", "tab:blue"),
    ]
    fig, ax = plt.subplots(figsize=(11, 3.2))
    for y, (_name, rows, label, color) in enumerate(lanes):
        for row in rows[:60]:
            ax.plot(_when(float(row["ts"])), y, "o", color=color, ms=5)
            ax.annotate(label(row), (_when(float(row["ts"])), y), xytext=(3, 5),
                        textcoords="offset points", fontsize=6, rotation=20)
        if not rows:
            ax.text(0.01, y, "none", transform=ax.get_yaxis_transform(), va="center", fontsize=8)
    if data.steps:
        ax.set_xlim(_when(float(data.steps[0]["start"])), _when(float(data.steps[-1]["end"])))
    ax.set_yticks(range(len(lanes)), [name for name, *_ in lanes])
    ax.set_ylim(-0.5, len(lanes) - 0.3)
    ax.set_xlabel("time (UTC)")
    ax.set_title(f"{data.job}: events, detections, alerts and actions")
    fig.autofmt_xdate()
    return _png(fig)


def gpu_signals(data: ReportData, host: str) -> bytes:
    fields = (("sm_clock_mhz", "SM clock (MHz)"), ("temp_gpu_c", "GPU temperature (°C)"),
              ("power_w", "power (W)"), ("util_gpu_pct", "utilisation (%)"))
    series = _series(data.gpu, host, lambda r: f"gpu{r['gpu']}")
    return _host_signals(data, series, fields, f"GPU signals of flagged host {host}")


def nic_signals(data: ReportData, host: str) -> bytes:
    fields = (("xmit_bytes_per_s", "transmit (B/s)"), ("xmit_wait_per_s", "xmit wait (ticks/s)"),
              ("np_ecn_marked_roce_packets_per_s", "ECN marked (pkt/s)"),
              ("symbol_error_per_s", "symbol errors (/s)"))
    series = _series(data.ports, host, lambda r: f"{r['device']}/{r['port']}")
    return _host_signals(data, series, fields, f"NIC signals of flagged host {host}")


def _host_signals(data: ReportData, series: dict[str, Rows],
                  fields: tuple[tuple[str, str], ...], title: str) -> bytes:
    """One panel per column, one line per GPU or port, detections marked."""
    plt = _plt()
    fig, axes = plt.subplots(len(fields), 1, figsize=(11, 8), sharex=True)
    for ax, (col, label) in zip(axes, fields, strict=True):
        for name, rows in series.items():
            ax.plot([_when(float(r["ts"])) for r in rows],
                    [_num(r[col]) for r in rows], lw=0.8, label=name)
        ax.set_ylabel(label, fontsize=8)
        _timeline_marks(ax, data)
    axes[0].legend(ncol=8, fontsize=6, loc="lower left")
    axes[0].set_title(f"{data.job}: {title}")
    axes[-1].set_xlabel("time (UTC)")
    fig.autofmt_xdate()
    return _png(fig)


def _series(rows: Rows, host: str, name: Callable[[dict[str, Any]], str]) -> dict[str, Rows]:
    out: dict[str, Rows] = defaultdict(list)
    for r in rows:
        if r["host"] == host:
            out[name(r)].append(r)
    return dict(out)


def _num(value: Any) -> float:
    return float("nan") if value is None else float(value)

"""The report's figures, each rendered to PNG bytes with matplotlib (Agg, no display)."""

from __future__ import annotations

import io
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from stepwatch.extras import require
from stepwatch.report.data import ReportData, Rows
from stepwatch.report.goodput import CATEGORIES, LABELS, Breakdown

DPI = 110
COINCIDE = 0.01  # slowest rank within 1 % of the median on every step: the lines coincide


def _plt() -> Any:
    require("matplotlib", what="the post-mortem report")
    import matplotlib

    matplotlib.use("Agg")
    # text is text: job ids, host, GPU and NIC names are the senders' (a ``$\nope$`` in a
    # NIC name was read as math and its unknown symbol failed the whole report)
    matplotlib.rcParams["text.parse_math"] = False
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
    """Compute time per rank over time (the x axis of every other figure): one column per
    step bucket, as wide as the time the bucket took, so a hang is a gap, not a squeeze."""
    plt = _plt()
    import numpy as np
    from matplotlib import dates as mdates
    from matplotlib import ticker

    ranks = sorted({int(r["rank"]) for r in data.heat})
    buckets = sorted({int(r["step_bucket"]) for r in data.heat})
    start = {
        b: min(float(r["start"]) for r in data.heat if int(r["step_bucket"]) == b) for b in buckets
    }
    end = max((float(r["end"]) for r in data.heat), default=0.0)
    grid = np.full((len(ranks), len(buckets)), np.nan)
    ri = {r: i for i, r in enumerate(ranks)}
    bi = {b: i for i, b in enumerate(buckets)}
    for row in data.heat:
        if row["compute_s"] is not None:
            grid[ri[int(row["rank"])], bi[int(row["step_bucket"])]] = float(row["compute_s"])
    fig, ax = plt.subplots(figsize=(11, max(3.0, min(9.0, 0.12 * len(ranks) + 2))))
    edges = [mdates.date2num(_when(start[b])) for b in buckets] + [mdates.date2num(_when(end))]
    yedges = [r - 0.5 for r in ranks] + [ranks[-1] + 0.5] if ranks else [0.0]
    # colour scale from the bulk of the run: warm-up steps would wash out a 10 % straggler
    # (a straggler is tens of percent slower): from the 1st percentile to 1.6 x the median
    finite = np.isfinite(grid).any()
    low = float(np.nanpercentile(grid, 1)) if finite else 0.0
    high = 1.6 * float(np.nanmedian(grid)) if finite else 1.0
    img = ax.pcolormesh(
        edges, yedges, np.ma.masked_invalid(grid), cmap="magma", vmin=low, vmax=high, shading="flat"
    )
    fig.colorbar(img, ax=ax, label="compute time (s)", extend="max")
    ax.xaxis_date()
    ax.invert_yaxis()
    ax.set_xlabel("time (UTC)")
    ax.set_ylabel("rank")
    ax.yaxis.set_major_locator(ticker.MaxNLocator(integer=True))  # ranks are whole numbers
    steps = f"steps {buckets[0]}-{buckets[-1]}" if buckets else "no steps"
    ax.set_title(
        f"{data.job}: compute time per rank over time (forward + backward + optimizer; {steps})"
    )
    _mark_detections(ax, data.detections, horizontal=True)
    _timeline_marks(ax, data)
    fig.autofmt_xdate()
    return _png(fig)


def _mark_detections(ax: Any, detections: Rows, *, horizontal: bool) -> None:
    for d in detections:
        if d["state"] == "open" and d.get("rank") is not None and horizontal:
            ax.axhline(int(d["rank"]), color="cyan", lw=0.6, ls=":")


def step_time(data: ReportData, b: Breakdown | None = None) -> bytes:
    """Median and slowest rank's step time (distinct styles; said so when they coincide),
    the straggler-free baseline, and throughput, over time."""
    plt = _plt()
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 6), sharex=True)
    t = [_when(float(s["start"])) for s in data.steps]
    median = [float(s["step_s"]) for s in data.steps]
    slowest = [float(s["step_max_s"]) for s in data.steps]
    top.plot(t, slowest, color="tab:red", lw=1.6, ls="--", alpha=0.8, label=_slowest_label(data))
    top.plot(t, median, color="tab:blue", lw=1.0, label="median over ranks (the step time)")
    if b is not None and b.baseline_s:
        top.axhline(
            b.baseline_s,
            color="tab:green",
            lw=1,
            ls=":",
            label=f"straggler-free baseline {b.baseline_s:.3f} s",
        )
    top.set_ylabel("step time (s)")
    top.legend(loc="upper left", fontsize=7)
    tput = [
        float(s["tokens"]) / float(s["step_s"]) if float(s["step_s"]) > 0 else 0.0
        for s in data.steps
    ]
    bottom.plot(t, tput, color="tab:green", lw=1)
    bottom.set_ylabel("throughput (tokens/s)")
    bottom.set_xlabel("time (UTC)")
    for ax in (top, bottom):
        _timeline_marks(ax, data)
    step = f"step time {b.step_s:.3f} s" if b is not None and b.step_s else "step time"
    top.set_title(f"{data.job}: {step} and throughput")
    fig.autofmt_xdate()
    return _png(fig)


def _slowest_label(data: ReportData) -> str:
    """Names the rank that was slowest most often; says so when it equals the median."""
    ranks = Counter(int(s["slowest_rank"]) for s in data.steps if s.get("slowest_rank") is not None)
    who = f"rank {ranks.most_common(1)[0][0]} most often" if ranks else "rank unknown"
    gaps = [
        float(s["step_max_s"]) / float(s["step_s"]) - 1
        for s in data.steps
        if float(s["step_s"]) > 0
    ]
    if bool(gaps) and max(gaps) < COINCIDE:
        return (
            f"slowest rank's wall time ({who}): equal to the median within {COINCIDE:.0%}\n"
            "(synchronous steps end together: a straggler shows in compute, see the heat map)"
        )
    return f"slowest rank's wall time ({who})"


def _timeline_marks(ax: Any, data: ReportData) -> None:
    """Detection openings as red dashed lines; the x axis the run's span (every figure alike)."""
    for d in data.detections:
        if d["state"] == "open":
            ax.axvline(_when(float(d["ts"])), color="red", lw=0.8, ls="--")
    if data.steps:
        ax.set_xlim(_when(float(data.steps[0]["start"])), _when(float(data.steps[-1]["end"])))


def goodput_bar(b: Breakdown, job: str) -> bytes:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(11, 2.4))
    left = 0.0
    colors = dict(
        zip(
            CATEGORIES,
            (
                "tab:green",
                "tab:orange",
                "tab:blue",
                "tab:red",
                "tab:purple",
                "tab:brown",
                "tab:pink",
                "tab:gray",
            ),
            strict=True,
        )
    )
    for kind in CATEGORIES:
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
        (
            "events",
            [e for e in data.events if e["type"] not in ("job_start", "job_end")],
            lambda e: str(e["type"]),
            "tab:gray",
        ),
        ("detections", data.detections, lambda d: f"{d['type']} {d['state']}", "tab:red"),
        ("alerts", data.alerts, lambda a: f"{a['alertname']} {a['status']}", "tab:orange"),
        ("actions", data.actions, lambda a: f"{a['action']} {a['status']}", "tab:blue"),
    ]
    fig, ax = plt.subplots(figsize=(11, 3.2))
    span = float(data.steps[-1]["end"]) - float(data.steps[0]["start"]) if data.steps else 0.0
    for y, (_name, rows, label, color) in enumerate(lanes):
        for ts, text in _merge(rows[:60], label, span / 100):
            ax.plot(_when(ts), y, "o", color=color, ms=5)
            ax.annotate(
                text,
                (_when(ts), y),
                xytext=(3, 5),
                textcoords="offset points",
                fontsize=6,
                rotation=20,
            )
        if not rows:
            ax.text(0.01, y, "none", transform=ax.get_yaxis_transform(), va="center", fontsize=8)
    _timeline_marks(ax, data)
    ax.set_yticks(range(len(lanes)), [name for name, *_ in lanes])
    ax.set_ylim(-0.5, len(lanes) - 0.3)
    ax.set_xlabel("time (UTC)")
    ax.set_title(f"{data.job}: events, detections, alerts and actions")
    fig.autofmt_xdate()
    return _png(fig)


def _merge(
    rows: Rows, label: Callable[[dict[str, Any]], str], within: float
) -> list[tuple[float, str]]:
    """Marks closer than ``within`` seconds share one point and one label (no overprint)."""
    out: list[tuple[float, list[str]]] = []
    for row in sorted(rows, key=lambda r: float(r["ts"])):
        ts, text = float(row["ts"]), label(row)
        if out and ts - out[-1][0] <= within:
            if text not in out[-1][1]:
                out[-1][1].append(text)
        else:
            out.append((ts, [text]))
    return [(ts, ", ".join(texts)) for ts, texts in out]

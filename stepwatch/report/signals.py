"""The flagged hosts' GPU and NIC figures: each GPU or port a line, on the report's time axis.

The GPU figure names the throttle reason of each flagged GPU (thermal, power, HW
slowdown: NVML clocks-event reasons) and shades when it held; the NIC figure
draws the peer baseline (the median over every port of the job's other hosts)
as a thick grey line next to the flagged host's ports.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping
from typing import Any

from stepwatch.report.data import ReportData, Rows
from stepwatch.report.figures import _plt, _png, _timeline_marks, _when
from stepwatch.streams.core.hostwindow import (
    HW_SLOWDOWN,
    HW_THERMAL,
    POWER_BRAKE,
    SW_POWER_CAP,
    SW_THERMAL,
)

THROTTLE_KINDS = (
    ("thermal", SW_THERMAL | HW_THERMAL),
    ("power", SW_POWER_CAP | POWER_BRAKE),
    ("HW slowdown", HW_SLOWDOWN),
)
GPU_FIELDS = (
    ("sm_clock_mhz", "SM clock (MHz)"),
    ("temp_gpu_c", "GPU temperature (°C)"),
    ("power_w", "power (W)"),
    ("util_gpu_pct", "utilisation (%)"),
)
NIC_FIELDS = (
    ("xmit_bytes_per_s", "transmit (B/s)"),
    ("xmit_wait_per_s", "xmit wait (ticks/s)"),
    ("np_ecn_marked_roce_packets_per_s", "ECN marked (pkt/s)"),
    ("symbol_error_per_s", "symbol errors (/s)"),
)


def throttle_reason(masks: list[int | None]) -> str:
    """The throttle kinds present in ``masks`` with their share of samples, e.g.
    ``thermal 92 %``; empty when none of the samples was throttled."""
    known = [m for m in masks if m is not None]
    parts = []
    for name, bits in THROTTLE_KINDS:
        share = sum(1 for m in known if m & bits) / len(known) if known else 0.0
        if share > 0:
            parts.append(f"{name} {100 * share:.0f} %")
    return ", ".join(parts)


def flagged_gpus(data: ReportData, host: str) -> set[int]:
    return {
        int(d["gpu"]) for d in data.detections if d.get("host") == host and d.get("gpu") is not None
    }


def gpu_signals(data: ReportData, host: str) -> bytes:
    series = _series(data.gpu, host, lambda r: int(r["gpu"]))
    flagged = flagged_gpus(data, host)
    names: dict[Any, str] = {}
    reasons: dict[Any, str] = {}
    for gpu, rows in series.items():
        reason = throttle_reason([r["throttle_reasons"] for r in rows])
        mark = " (flagged)" if gpu in flagged else ""
        names[gpu] = f"gpu{gpu}{mark}" + (
            f": throttled {reason}" if reason and gpu in flagged else ""
        )
        if reason and gpu in flagged:
            reasons[gpu] = reason
    title = f"GPU signals of flagged host {host}"
    if reasons:
        title += "; throttle reason " + "; ".join(
            f"gpu{g}: {r}" for g, r in sorted(reasons.items())
        )
    elif flagged:
        title += "; flagged GPU(s) not throttled"
    fig, axes = _host_signals(data, series, names, GPU_FIELDS, title, emphasis=flagged)
    for gpu in reasons:
        _shade_throttle(axes[0], series[gpu])
    return _png(fig)


def _shade_throttle(ax: Any, rows: Rows) -> None:
    """Shade the SM clock panel while a flagged GPU's clocks were throttled (red: thermal)."""
    span: tuple[float, str] | None = None
    last = 0.0
    for r in [*rows, {"ts": None, "throttle_reasons": 0}]:
        kind = next((n for n, bits in THROTTLE_KINDS if (r["throttle_reasons"] or 0) & bits), "")
        if span is not None and kind != span[1]:
            ax.axvspan(
                _when(span[0]),
                _when(last),
                color="tab:red" if span[1] == "thermal" else "tab:orange",
                alpha=0.2,
                lw=0,
            )
            span = None
        if r["ts"] is None:
            break
        last = float(r["ts"])
        if kind and span is None:
            span = (last, kind)


def nic_signals(data: ReportData, host: str) -> bytes:
    series = _series(data.ports, host, lambda r: f"{r['device']}/{r['port']}")
    names = {k: str(k) for k in series}
    peers = data.peers.get(host, [])
    hosts = max((int(p["hosts"]) for p in peers), default=0)
    title = f"NIC signals of flagged host {host}"
    title += (
        f" vs the median port of the job's {hosts} other host(s)" if peers else " (no peer hosts)"
    )
    fig, axes = _host_signals(data, series, names, NIC_FIELDS, title)
    for ax, (col, _label) in zip(axes, NIC_FIELDS, strict=True):
        if peers:
            ax.plot(
                [_when(float(p["ts"])) for p in peers],
                [_num(p[col]) for p in peers],
                color="black",
                lw=1.6,
                ls="--",
                alpha=0.75,
                zorder=4,
                label="peer baseline (median port of the other hosts)",
            )
    axes[0].legend(ncol=5, fontsize=6, loc="lower left")
    return _png(fig)


def _host_signals(
    data: ReportData,
    series: Mapping[Any, Rows],
    names: Mapping[Any, str],
    fields: tuple[tuple[str, str], ...],
    title: str,
    emphasis: set[Any] | None = None,
) -> tuple[Any, Any]:
    """One panel per column, one line per GPU or port (emphasised ones thick), detections marked."""
    plt = _plt()
    fig, axes = plt.subplots(len(fields), 1, figsize=(11, 8), sharex=True)
    for ax, (col, label) in zip(axes, fields, strict=True):
        for key, rows in series.items():
            thick = emphasis is not None and key in emphasis
            ax.plot(
                [_when(float(r["ts"])) for r in rows],
                [_num(r[col]) for r in rows],
                lw=1.8 if thick else 0.8,
                label=names[key],
                zorder=3 if thick else 2,
            )
        ax.set_ylabel(label, fontsize=8)
        _timeline_marks(ax, data)
    axes[0].legend(ncol=4, fontsize=6, loc="lower left")
    axes[0].set_title(f"{data.job}: {title}", fontsize=9)
    axes[-1].set_xlabel("time (UTC)")
    fig.autofmt_xdate()
    return fig, axes


def _series(rows: Rows, host: str, name: Callable[[dict[str, Any]], Any]) -> dict[Any, Rows]:
    out: dict[Any, Rows] = defaultdict(list)
    for r in rows:
        if r["host"] == host:
            out[name(r)].append(r)
    return dict(sorted(out.items()))


def _num(value: Any) -> float:
    return float("nan") if value is None else float(value)

"""The report as one self-contained HTML file: figures inline as base64 PNG."""

from __future__ import annotations

import base64
import html
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from stepwatch.contract.goodput import MFU_UNKNOWN
from stepwatch.report.data import ReportData, Rows
from stepwatch.report.goodput import CATEGORIES, LABELS, Breakdown

STYLE = """
body{font-family:system-ui,sans-serif;margin:2em;max-width:1200px;color:#222}
table{border-collapse:collapse;margin:.5em 0 1.5em;font-size:13px}
td,th{border:1px solid #ccc;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#f3f3f3} img{max-width:100%;border:1px solid #eee} .none{color:#888}
"""


def _t(ts: Any) -> str:
    return datetime.fromtimestamp(float(ts), UTC).strftime("%Y-%m-%d %H:%M:%S") if ts else ""


def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value))


def table(rows: Rows, columns: Sequence[str], times: Sequence[str] = ("ts",)) -> str:
    if not rows:
        return '<p class="none">none</p>'
    head = "".join(f"<th>{_e(c)}</th>" for c in columns)
    body = "".join(
        "<tr>"
        + "".join(f"<td>{_e(_t(r.get(c)) if c in times else r.get(c))}</td>" for c in columns)
        + "</tr>"
        for r in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def figure(title: str, png: bytes) -> str:
    data = base64.b64encode(png).decode("ascii")
    return f'<h3>{_e(title)}</h3><img alt="{_e(title)}" src="data:image/png;base64,{data}">'


def evidence(detections: Rows) -> str:
    """Each open detection with its cause and the evidence the detector recorded."""
    opened = [d for d in detections if d["state"] == "open"]
    if not opened:
        return '<p class="none">none</p>'
    parts = []
    for d in opened:
        items = "".join(
            f"<tr><td>{_e(k)}</td><td>{_e(v)}</td></tr>"
            for k, v in sorted((d.get("evidence") or {}).items())
        )
        parts.append(
            f"<h4>{_e(d['type'])} {_e(d['id'])}: host {_e(d['host'])} rank {_e(d['rank'])}, "
            f"cause {_e(d['cause'])}</h4><p>{_e(d['summary'])}</p>"
            f"<table><tr><th>evidence</th><th>value</th></tr>{items}</table>"
        )
    return "".join(parts)


def goodput_table(b: Breakdown) -> str:
    rows = [
        {
            "category": LABELS[k],
            "rank-seconds": f"{b.seconds[k]:,.1f}",
            "share": f"{100 * b.fraction(k):.1f} %",
        }
        for k in CATEGORIES
    ]
    return table(rows, ("category", "rank-seconds", "share"))


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _mfu(data: ReportData) -> str:
    """MFU of the median step when the steps carry FLOPs and the GPU model is known;
    otherwise what it needs (the worker's definition: stepwatch.contract.goodput)."""
    from stepwatch.streams.core.config import DetectConfig

    peak = DetectConfig().peak_flops(data.gpu_model) if data.gpu_model else None
    known = [
        float(s["flops"]) / (float(s["step_s"]) * int(s["world"]) * peak)
        for s in data.steps
        if peak and s.get("flops") is not None and float(s["step_s"]) > 0
    ]
    if not known:
        return f"MFU - ({_e(MFU_UNKNOWN)})"
    return f"MFU {100 * sorted(known)[len(known) // 2]:.1f} % (median step, {_e(data.gpu_model)})"


def page(data: ReportData, b: Breakdown, figures: Mapping[str, bytes]) -> str:
    first = _t(data.steps[0]["start"]) if data.steps else "no steps"
    last = _t(data.steps[-1]["end"]) if data.steps else ""
    world = max((int(s["world"]) for s in data.steps), default=0)
    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>stepwatch post-mortem "
        f"{_e(data.job)}</title><style>{STYLE}</style></head><body>",
        f"<h1>Post-mortem: job {_e(data.job)}</h1>",
        f"<p>{first} to {last} UTC, {len(data.steps)} steps, world size {world}; "
        f"step time {_num(b.step_s)} s (median of the steps; straggler-free baseline "
        f"{_num(b.baseline_s)} s); goodput {100 * b.goodput:.1f} %; {_mfu(data)}; flagged hosts: "
        f"{_e(', '.join(data.flagged_hosts) or 'none')}.</p>",
        "<h2>Goodput and badput</h2>",
        goodput_table(b),
    ]
    parts += [figure(title, png) for title, png in figures.items()]
    parts += [
        "<h2>Detections</h2>",
        table(data.detections, ("ts", "type", "state", "host", "rank", "cause", "step", "summary")),
        "<h2>Cause evidence</h2>",
        evidence(data.detections),
        "<h2>Alerts</h2>",
        table(data.alerts, ("ts", "alertname", "status", "severity", "host")),
        "<h2>Remediation actions</h2>",
        table(data.actions, ("ts", "action", "status", "dry_run", "host", "reason")),
        "<h2>Events</h2>",
        table(data.events[:200], ("ts", "host", "type", "gpu", "device", "code", "detail")),
        "</body></html>",
    ]
    return "\n".join(parts)

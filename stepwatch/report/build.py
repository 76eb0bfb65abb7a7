"""Build a post-mortem report: load, figure, write HTML and PNG files."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from stepwatch.errors import StepwatchError
from stepwatch.exporters.clickhouse.store import Store
from stepwatch.report import figures as F
from stepwatch.report import signals as S
from stepwatch.report.data import ReportData, load
from stepwatch.report.goodput import Breakdown, breakdown
from stepwatch.report.html import page

log = logging.getLogger(__name__)


class NoSuchJob(StepwatchError):
    """The store holds no steps of the job."""


@dataclass(frozen=True)
class Written:
    html: Path
    pngs: tuple[Path, ...]


def render(data: ReportData, b: Breakdown | None = None) -> dict[str, bytes]:
    """Figure title -> PNG bytes, in report order (every time axis in UTC)."""
    b = b or breakdown(data.steps, data.detections, data.events)
    out = {
        "Compute time heat map (rank x time)": F.heat_map(data),
        "Step time and throughput": F.step_time(data, b),
        "Goodput breakdown": F.goodput_bar(b, data.job),
        "Timeline": F.timeline(data),
    }
    for host in data.flagged_hosts:
        if any(r["host"] == host for r in data.gpu):
            out[f"GPU signals: {host}"] = S.gpu_signals(data, host)
        if any(r["host"] == host for r in data.ports):
            out[f"NIC signals: {host}"] = S.nic_signals(data, host)
    return out


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-").lower()


def build_report(
    store: Store, job: str, out_dir: Path, progress: Callable[[str], None] | None = None
) -> Written:
    """Build and write the report; ``progress`` is told each stage as it starts."""
    stage = progress or (lambda _text: None)
    stage("reading the job from the store")
    data = load(store, job)
    if not data.steps:
        raise NoSuchJob(f"the store holds no steps of job {job!r}")
    stage("computing goodput")
    b = breakdown(data.steps, data.detections, data.events)
    stage("rendering figures")
    figs = render(data, b)
    stage("writing files")
    out_dir.mkdir(parents=True, exist_ok=True)
    pngs = []
    for i, (title, png) in enumerate(figs.items(), 1):
        path = out_dir / f"{_slug(job)}-{i:02d}-{_slug(title)}.png"
        path.write_bytes(png)
        pngs.append(path)
    html_path = out_dir / f"report-{_slug(job)}.html"
    html_path.write_text(page(data, b, figs), encoding="utf-8")
    log.info("report written job=%s html=%s figures=%d", job, html_path, len(pngs))
    return Written(html_path, tuple(pngs))

"""Render what the demo's tap saw, as a small text screen."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from stepwatch.audit import AuditReport
from stepwatch.contract import DetectionMessage
from stepwatch.demo.alerting import AlertView
from stepwatch.demo.arc import STAGES, Stage
from stepwatch.demo.scrape import JobFigures

KINDS = ("step", "gpu", "port", "event")
# How a detection was scored, not why: the live view leaves these out of its evidence line.
BOOKKEEPING = frozenset(
    {
        "basis",
        "flagged_steps",
        "window_steps",
        "threshold",
        "group_size",
        "phases_longer",
        "nvrx_relative",
        "baseline_step_s",
        "current_step_s",
    }
)


def deciding(evidence: Mapping[str, object], limit: int = 8) -> str:
    """The numbers that decided a detection: the cause's evidence first, then the excess."""
    keys = [k for k in evidence if k not in BOOKKEEPING and evidence[k] is not None]
    cause = [k for k in keys if not k.endswith("_s") and not k.endswith("_excess")]
    excess = [k for k in keys if k.endswith("_excess")]
    return ", ".join(f"{k}={evidence[k]}" for k in (cause + excess)[:limit])


def arc_lines(stages: Sequence[Stage]) -> list[str]:
    """The loop so far, one line per stage, the ones to come marked as waiting."""
    reached = {s.name: s for s in stages}
    out = []
    for name in STAGES:
        stage = reached.get(name)
        if stage is None:
            out.append(f"  {'-':>7}  {name:<14} waiting")
        else:
            out.append(f"  {stage.at:6.1f}s  {name:<14} {stage.detail}")
    return out


def render(
    *,
    elapsed: float,
    report: AuditReport,
    accepted: int,
    spool: dict[str, int | str],
    detections: list[DetectionMessage],
    dlq: int,
    services: Mapping[str, str],
    jobs: Sequence[JobFigures] = (),
    alerting: AlertView | None = None,
    slurm: dict[str, str] | None = None,
    stages: Sequence[Stage] = (),
    job: str = "",
    max_hosts: int = 8,
) -> str:
    lines = [
        f"stepwatch demo   t={elapsed:6.1f}s   broker state={spool.get('state', '?')}   "
        + "   ".join(f"{name}={state.split(' ')[0]}" for name, state in services.items()),
        *(f"  {name} {state}" for name, state in services.items() if state != "up"),
        "",
        "arrived in Kafka: "
        + "  ".join(f"{k}={report.by_kind.get(k, 0)}" for k in KINDS)
        + f"   (published {accepted}, dead letters {dlq})",
        f"sequence audit:   streams={report.streams} missing={report.missing} "
        f"duplicates={report.duplicates} out_of_order={report.out_of_order}",
        f"agent spool:      depth={spool.get('records', 0)} records "
        f"({spool.get('bytes', 0)} B), dropped={spool.get('dropped', 0)}",
        "",
        "the loop (seconds since the demo started):",
        *arc_lines(stages),
        "",
        f"{'host':<12}{'messages':>10}",
    ]
    hosts = sorted(report.by_host.items())
    for host, count in hosts[:max_hosts]:
        lines.append(f"{host:<12}{count:>10}")
    if len(hosts) > max_hosts:
        lines.append(f"... and {len(hosts) - max_hosts} more hosts")
    lines += ["", "jobs:"] + (_job_lines(jobs) or ["  (waiting for the stream worker)"])
    lines += ["", f"detections ({len(detections)} state changes):"]
    for d in detections[-8:]:
        where = f"rank {d.rank}" if d.rank is not None else "job"
        lines.append(
            f"  {d.state:<8} {d.type:<13} {d.job_id} {where:<9} host={d.host} "
            f"cause={d.cause} fault={d.fault} score={_fmt(d.score)}"
        )
        if d.state == "open":
            lines.append(f"           why: {d.summary}")
            evidence = deciding(d.evidence)
            if evidence:
                lines.append(f"           evidence: {evidence}")
    if alerting is not None:
        lines += ["", f"firing alerts ({len(alerting.firing)}):"]
        lines += [f"  {a}" for a in alerting.firing[:8]] or ["  none"]
        breaker = "OPEN (a person must close it)" if alerting.breaker_open else "closed"
        lines += ["", f"remediator decisions (circuit breaker {breaker}):"]
        lines += [f"  {d}" for d in alerting.decisions] or ["  none yet"]
    if slurm:
        lines += ["", "slurm nodes: " + "  ".join(f"{n}={s}" for n, s in sorted(slurm.items()))]
    if job:
        lines.append(f"slurm job:   {job}")
    return "\n".join(lines)


def _job_lines(jobs: Sequence[JobFigures]) -> list[str]:
    out = []
    for job in jobs:
        step, tok = job.get("step_s"), job.get("tokens_per_s")
        mfu, good = job.get("mfu"), job.get("goodput")
        out.append(
            f"  {job.job_id:<12} step {int(job.get('last_step') or 0):>5}  "
            f"step time {_fmt(step)} s  tokens/s {_big(tok)}  MFU {_mfu(mfu)}  "
            f"goodput {_pct(good)}  stragglers {int(job.get('stragglers') or 0)}"
            + ("  HUNG" if job.get("hung") else "")
        )
    return out


def _mfu(value: float | None) -> str:
    if value is None:
        return "- (needs FLOPs per step from the job and the GPUs' peak)"
    return _pct(value)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f} %"


def _big(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value / 1e6:.2f}M" if value >= 1e6 else f"{value:,.0f}"


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"

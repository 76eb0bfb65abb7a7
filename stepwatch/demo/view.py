"""Render what the demo's tap saw, as a small text screen."""

from __future__ import annotations

from stepwatch.audit import AuditReport
from stepwatch.contract import DetectionMessage

KINDS = ("step", "gpu", "port", "event")


def render(
    *,
    elapsed: float,
    report: AuditReport,
    accepted: int,
    spool: dict[str, int | str],
    detections: list[DetectionMessage],
    dlq: int,
    services: dict[str, bool],
    max_hosts: int = 8,
) -> str:
    lines = [
        f"stepwatch demo   t={elapsed:6.1f}s   broker state={spool.get('state', '?')}   "
        + "   ".join(f"{name}={'up' if up else 'DOWN'}" for name, up in services.items()),
        "",
        "arrived in Kafka: " + "  ".join(f"{k}={report.by_kind.get(k, 0)}" for k in KINDS)
        + f"   (published {accepted}, dead letters {dlq})",
        f"sequence audit:   streams={report.streams} missing={report.missing} "
        f"duplicates={report.duplicates} out_of_order={report.out_of_order}",
        f"agent spool:      depth={spool.get('records', 0)} records "
        f"({spool.get('bytes', 0)} B), dropped={spool.get('dropped', 0)}",
        "",
        f"{'host':<12}{'messages':>10}",
    ]
    hosts = sorted(report.by_host.items())
    for host, count in hosts[:max_hosts]:
        lines.append(f"{host:<12}{count:>10}")
    if len(hosts) > max_hosts:
        lines.append(f"... and {len(hosts) - max_hosts} more hosts")
    lines += ["", f"detections ({len(detections)} state changes):"]
    for d in detections[-8:]:
        where = f"rank {d.rank}" if d.rank is not None else "job"
        lines.append(
            f"  {d.state:<8} {d.type:<13} {d.job_id} {where:<9} host={d.host} "
            f"cause={d.cause} fault={d.fault} score={_fmt(d.score)}  {d.summary[:60]}"
        )
    return "\n".join(lines)


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"

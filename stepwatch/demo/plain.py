"""Plain output (no terminal): one line per change, a short status line every ~10 s.

The demo hands :class:`Changes` a snapshot of what it shows (``name -> value``)
each refresh; a new name or a new value prints one line, a name that went away
prints ``name: ended``. Nothing is printed when nothing changed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from stepwatch.contract import DetectionMessage
from stepwatch.demo.alerting import AlertView
from stepwatch.demo.arc import Stage
from stepwatch.demo.view import deciding


@dataclass
class Changes:
    status_every: float = 10.0
    _last: dict[str, str] = field(default_factory=dict)
    _next_status: float = 0.0

    def lines(self, at: float, snapshot: Mapping[str, str], status: str) -> list[str]:
        """What to print for this refresh at ``at`` seconds since the start."""
        stamp = f"[t={at:6.1f}s]"
        out = [
            f"{stamp} {name}: {value}" if value else f"{stamp} {name}"
            for name, value in snapshot.items()
            if self._last.get(name) != value
        ]
        out += [f"{stamp} {name}: ended" for name in self._last if name not in snapshot]
        self._last = dict(snapshot)
        if at >= self._next_status:
            out.append(f"{stamp} status: {status}")
            self._next_status = at + self.status_every
        return out


def snapshot(
    *,
    stages: Sequence[Stage],
    detections: Sequence[DetectionMessage],
    alerting: AlertView | None,
    slurm: Mapping[str, str],
    job: str,
    services: Mapping[str, str],
) -> dict[str, str]:
    """What plain mode watches for changes, as ``name -> value`` (a service: ``up``, or
    ``DOWN (how it ended, when; its log)``)."""
    out = {f"service {name}": state for name, state in services.items()}
    for stage in stages:
        out[f"== {stage.name.upper()} =="] = stage.detail
    for d in detections:  # the last state of each detection wins
        where = f"rank {d.rank}" if d.rank is not None else "job"
        out[f"detection {d.type} {d.job_id} {where} host={d.host}"] = (
            f"{d.state} cause={d.cause} fault={d.fault}"
        )
    for d in detections:
        if d.state == "open":
            out.setdefault(f"  {d.type} {d.id[:8]} why", d.summary)
            out.setdefault(f"  {d.type} {d.id[:8]} evidence", deciding(d.evidence))
    if alerting is not None:
        out.update({f"alert {line}": "firing" for line in alerting.firing})
        for a in alerting.actions:
            name = f"remediator {a.get('kind')} {a.get('node') or ''} (job {a.get('job_id')})"
            out[name] = str(a.get("status"))
        for o in alerting.outcomes:
            out[f"remediator outcome {o.get('action')} {o.get('node')}"] = str(
                o.get("outcome") or "waiting for the alert to resolve"
            )
    if slurm:
        by_state: dict[str, list[str]] = {}
        for node, state in sorted(slurm.items()):
            by_state.setdefault(state, []).append(node)
        out["slurm nodes"] = "  ".join(f"{s}={','.join(n)}" for s, n in sorted(by_state.items()))
    if job:
        out["slurm job"] = job
    return out

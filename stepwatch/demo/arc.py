"""The demo's story so far: healthy, found, paged, drained, requeued, running again, recovered.

:class:`Arc` is fed what the demo sees each refresh (the tap's detections, the
pager's notifications, the remediator's actions, the job's incarnations) and
keeps the first time each stage was reached, in seconds since the demo
started, with one line of detail. A stage is reached once; it never goes back.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from stepwatch.contract import DetectionMessage

STAGES = (
    "healthy",
    "found",
    "paged",
    "drained",
    "requeued",
    "running again",
    "recovered",
    "outcome",
)


@dataclass(frozen=True)
class Stage:
    name: str
    at: float  # seconds since the demo started
    detail: str


@dataclass
class Arc:
    wall0: float = field(default_factory=time.time)  # wall clock at the demo's start
    reached: dict[str, Stage] = field(default_factory=dict)
    detection_id: str = ""
    # where the fault was injected, when the demo knows (the torch job's slow node): a
    # detection elsewhere is not the fault found. Before, a real host_input blip on
    # node01 four steps before the fault began was "found", and its resolution a second
    # later "recovered", while the injected straggler on node02 was still firing.
    fault_hosts: frozenset[str] = frozenset()

    def _since(self, wall: object, at: float) -> float:
        """Seconds since the start of a wall-clock stamp; ``at`` when there is none."""
        try:
            return min(at, max(0.0, float(wall) - self.wall0))  # type: ignore[arg-type]
        except (TypeError, ValueError):
            return at

    def stages(self) -> list[Stage]:
        return [self.reached[name] for name in STAGES if name in self.reached]

    def reach(self, name: str, at: float, detail: str) -> Stage | None:
        """Mark ``name`` reached at ``at``; the new stage, or None when it was reached before."""
        if name in self.reached:
            return None
        stage = self.reached[name] = Stage(name, at, detail)
        return stage

    def observe(
        self,
        at: float,
        *,
        steps: int,
        detections: Sequence[DetectionMessage],
        notifications: Sequence[Any] = (),
        actions: Sequence[Mapping[str, Any]] = (),
        incarnations: Sequence[Any] = (),
        outcomes: Sequence[Mapping[str, Any]] = (),
    ) -> list[Stage]:
        """Feed one refresh; the stages reached by it, in order."""
        new: list[Stage | None] = []
        if steps:
            new.append(
                self.reach(
                    "healthy", at, f"the job reports its steps ({steps} step messages so far)"
                )
            )
        new.append(self._found(at, detections))
        firing = [n for n in notifications if n.status == "firing"]
        if firing and "found" in self.reached:
            n = firing[0]
            new.append(
                self.reach("paged", self._since(n.at, at), f"{n.route}: {', '.join(n.alerts)}")
            )
        new += self._actions(at, actions)
        if len(incarnations) > 1 and "requeued" in self.reached:
            inc = incarnations[-1]
            new.append(
                self.reach(
                    "running again",
                    self._since(inc.started, at),
                    f"from step {inc.first_step} on {_nodes(inc.nodes)}",
                )
            )
        new.append(self._recovered(at, detections, incarnations[-1].nodes if incarnations else ()))
        new.append(self._outcome(at, outcomes))
        return [s for s in new if s is not None]

    def _found(self, at: float, detections: Sequence[DetectionMessage]) -> Stage | None:
        if "found" in self.reached:
            return None
        for d in detections:
            if self.fault_hosts and d.host not in self.fault_hosts:
                continue
            if d.state == "open" and d.fault == "system":
                self.detection_id = d.id
                where = f"rank {d.rank} " if d.rank is not None else ""
                why = d.evidence.get("host_reasons") or d.evidence.get("gpu_reasons")
                said = f"{d.type} {where}host={d.host} cause={d.cause}"
                return self.reach("found", at, f"{said} ({why})" if why else said)
        return None

    def _actions(self, at: float, actions: Sequence[Mapping[str, Any]]) -> list[Stage | None]:
        out: list[Stage | None] = []
        for kind, stage in (("drain", "drained"), ("requeue", "requeued")):
            done = [a for a in actions if a.get("kind") == kind and a.get("status") == "done"]
            if done:
                a = done[0]
                what = a.get("node") if kind == "drain" else f"job {a.get('job_id', '?')}"
                out.append(
                    self.reach(
                        stage, self._since(a.get("updated"), at), f"{kind} {what} by the remediator"
                    )
                )
        return out

    def _recovered(
        self, at: float, detections: Sequence[DetectionMessage], nodes: Sequence[str] = ()
    ) -> Stage | None:
        if "running again" not in self.reached or not self.detection_id:
            return None
        for d in detections:
            if d.id == self.detection_id and d.state == "resolved":
                why = d.summary.rpartition("resolved: ")[2] if "resolved: " in d.summary else ""
                # the detection's host is where the rank ran when it was last seen slow
                on = "now on" if not nodes or d.host in nodes else "was on"
                where = f" (rank {d.rank}, {on} {d.host})" if d.rank is not None else ""
                return self.reach(
                    "recovered", at, f"{d.type} resolved{where}" + (f": {why}" if why else "")
                )
        return None

    def _outcome(self, at: float, outcomes: Sequence[Mapping[str, Any]]) -> Stage | None:
        """The remediator's own verdict on its action (from Alertmanager's resolved notice)."""
        for o in outcomes:
            if o.get("outcome"):
                return self.reach(
                    "outcome",
                    self._since(o.get("decided"), at),
                    f"remediator: {o.get('action')} {o.get('node')} "
                    f"-> {o['outcome']}{_step_times(o)}",
                )
        return None


def _step_times(o: Mapping[str, Any]) -> str:
    before, after = o.get("before"), o.get("after")
    if isinstance(before, int | float) and isinstance(after, int | float):
        return f" (job step time {before:.3f} s before, {after:.3f} s after)"
    return ""


def _nodes(nodes: Sequence[str]) -> str:
    return ",".join(nodes) if len(nodes) <= 4 else f"{nodes[0]}..{nodes[-1]} ({len(nodes)} nodes)"

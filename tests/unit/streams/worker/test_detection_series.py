"""The real detection core over simulated faults: the series the alert rules select
(stepwatch_detection_score) carry the labels the rules and the remediator route on."""

from __future__ import annotations

import pytest

from stepwatch.contract import DetectionMessage
from stepwatch.sim import Fault, FaultKind, Scenario, simulate
from stepwatch.streams.core.engine import Engine
from stepwatch.streams.worker.metrics import DETECTION_LABELS, detection_labels


def detections(kind: FaultKind, rank: int | None) -> list[DetectionMessage]:
    """The last state of every detection the core raised for one injected fault."""
    sc = Scenario(nodes=2, steps=60, faults=(Fault(kind, rank=rank, start_step=15),))
    engine, last, now = Engine(), {}, 0.0
    for message in simulate(sc):
        for d in engine.process(message):
            last[d.id] = d
        if message.ts - now >= 1.0:
            now = message.ts
            for d in engine.tick(now):
                last[d.id] = d
    for d in engine.tick(now + 5):
        last[d.id] = d
    return list(last.values())


def series(kind: FaultKind, rank: int | None) -> list[dict[str, str]]:
    return [
        dict(zip(DETECTION_LABELS, detection_labels(d), strict=True))
        for d in detections(kind, rank)
    ]


@pytest.mark.parametrize(
    ("kind", "rank", "want"),
    [
        # StragglerPersistent, remediation drain (fault system, cause gpu)
        (
            FaultKind.THERMAL_THROTTLE,
            3,
            {
                "type": "straggler",
                "cause": "gpu",
                "fault": "system",
                "rank": "3",
                "gpu": "3",
                "host": "node0000",
            },
        ),
        # NetworkFaultLocalized: cause network with the suspect host and its NIC
        (
            FaultKind.NIC_CONGESTION,
            9,
            {
                "cause": "network",
                "fault": "system",
                "host": "node0001",
                "device": "mlx5_1",
                "port": "1",
            },
        ),
        (
            FaultKind.LINK_FLAP,
            12,
            {"type": "link_flap", "cause": "network", "host": "node0001", "port": "1"},
        ),
        # RankStopped, remediation drain (cause hardware)
        (
            FaultKind.XID48,
            6,
            {
                "type": "rank_missing",
                "cause": "hardware",
                "fault": "system",
                "rank": "6",
                "host": "node0000",
            },
        ),
        # JobUserError: class user, never drained
        (FaultKind.NAN_LOSS, None, {"type": "user_error", "cause": "user", "fault": "user"}),
    ],
)
def test_core_detections_carry_what_the_rules_route_on(kind, rank, want) -> None:
    got = series(kind, rank)
    assert any(want.items() <= s.items() for s in got), got

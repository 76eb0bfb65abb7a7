"""The chaos audit's short form: one kill -9 of each component, then nothing lost,
nothing stored twice, no detection opened twice, no dead letter.

The full run (24+ faults, figures printed) is ``bench/chaos.py``; this runs the
same harness with two agents and four faults (agent, stream worker, sink and
broker, in a seeded order). See bench/chaos.py for how a killed development
broker (memory storage) is accounted for.
"""

from __future__ import annotations

import random
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import chaos
from chaos_audit import audit, read_outboxes

from stepwatch.contract import Topics


@pytest.mark.integration
@pytest.mark.timeout(420)
def test_chaos_short(tmp_path) -> None:
    rng = random.Random(3)
    fleet = chaos.build(tmp_path, agents=2, session_timeout=6.0)
    try:
        chaos.start(fleet)
        time.sleep(8)
        for kind in chaos.schedule(rng, 4):
            time.sleep(rng.uniform(2, 4))
            chaos.inject(fleet, kind, rng, redrive_s=120.0)
        time.sleep(5)
        chaos.finish(fleet)
        topics = Topics(chaos.PREFIX)
        assert fleet.tap is not None
        report = audit(tmp_path / "chdb", read_outboxes(sorted(tmp_path.glob("outbox-*.txt"))),
                       fleet.tap.snapshot(), topics.detections, topics.dlq)
    finally:
        for p in fleet.procs():
            p.kill9()
        if fleet.tap is not None:
            fleet.tap.stop()
        fleet.broker.stop()
    assert sum(fleet.faults.values()) == 4 and set(fleet.faults) == set(chaos.KINDS)
    assert report.produced > 100
    details = (report.lost_examples, report.dup_examples, report.open_examples, fleet.log)
    assert report.lost == 0 and report.partial == 0, details
    assert report.duplicated == 0, details
    assert report.duplicate_opens == 0 and report.reopened == 0, details
    assert report.changes_missing == 0 and report.changes_duplicated == 0, details
    assert report.dlq_topic == 0 and not report.dead_rows, report.dead_rows

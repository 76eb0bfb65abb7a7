"""bench/worker_floor.py measures what it says: core-off still decodes, admits and
counts (a malformed record is a dead letter); layer decodes nothing."""

from __future__ import annotations

import sys
import time

import pytest

from stepwatch.contract import KIND_OF, Topics, encode, message_key
from stepwatch.sim import Scenario, simulate
from stepwatch.streams.worker.processor import Record, StreamProcessor
from tests.support import paths

sys.path.insert(0, str(paths.ROOT / "bench"))
from worker_floor import NullEngine, count_only

pytestmark = pytest.mark.unit

TOPICS = Topics("floor")


def wire() -> list[Record]:
    scenario = Scenario(seed=5, nodes=2, steps=20, job_id="floor-1", start_ts=time.time() - 120)
    sim = list(simulate(scenario))
    out = [
        Record(TOPICS.for_kind(KIND_OF[type(m)]), 0, i, message_key(m), encode(m))
        for i, m in enumerate(sim)
    ]
    out.append(Record(TOPICS.for_kind(KIND_OF[type(sim[0])]), 0, len(out), b"k", b"{not json"))
    return out


def test_core_off_decodes_admits_and_counts_but_finds_nothing() -> None:
    records = wire()
    proc = StreamProcessor(TOPICS, NullEngine)
    out = proc.process_batch(records)
    assert [o.topic for o in out] == [TOPICS.dlq]  # the malformed record, and nothing found
    assert proc.positions[(records[-1].topic, 0)] == records[-1].offset


def test_layer_decodes_nothing_and_counts_every_message() -> None:
    records = wire()
    proc = StreamProcessor(TOPICS, NullEngine)
    assert count_only(proc, records) == []  # the malformed record is not even read
    assert proc.positions[(records[-1].topic, 0)] == records[-1].offset
    counted = {
        s.labels["kind"]: s.value
        for metric in proc.metrics.registry.collect()
        if metric.name == "stepwatch_stream_messages"
        for s in metric.samples
        if s.name.endswith("_total")
    }
    assert sum(counted.values()) == len(records)

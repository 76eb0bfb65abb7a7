"""bench_stream's garbage run measures what it says: the records it mixes in are the
share asked for, and the worker's processor dead-letters every one of them while
processing every valid message as in a clean batch."""

from __future__ import annotations

import sys
import time

import pytest

from stepwatch.contract import KIND_OF, Topics, encode, message_key
from stepwatch.sim import Fault, FaultKind, Scenario, simulate
from stepwatch.streams.core import DetectConfig, Engine
from stepwatch.streams.worker.processor import Record, StreamProcessor
from tests.support import paths

sys.path.insert(0, str(paths.ROOT / "bench"))
from bench_stream import Garbage, with_garbage

pytestmark = pytest.mark.unit

TOPICS = Topics("garbage")


def records(items: list[object]) -> list[Record]:
    out = []
    for i, m in enumerate(items):
        if isinstance(m, Garbage):
            out.append(Record(TOPICS.for_kind(m.kind), 0, i, m.key, m.value))
        else:
            topic = TOPICS.for_kind(KIND_OF[type(m)])  # type: ignore[index]
            out.append(Record(topic, 0, i, message_key(m), encode(m)))  # type: ignore[arg-type]
    return out


@pytest.mark.parametrize("share", [0.1, 0.5])
def test_every_garbage_record_is_a_dead_letter_and_the_valid_ones_count(share: float) -> None:
    slow = Fault(kind=FaultKind.SLOW_GPU, rank=3, start_step=20, severity=0.3)
    start = time.time() - 200
    scenario = Scenario(seed=3, nodes=2, steps=80, job_id="g-1", start_ts=start, faults=(slow,))
    sim = list(simulate(scenario))
    mixed = with_garbage(sim, share)
    bad = [m for m in mixed if isinstance(m, Garbage)]
    assert abs(len(bad) / len(mixed) - share) < 0.01
    assert len({m.value[:12] for m in bad}) > 3  # not one shape of garbage
    clean = StreamProcessor(TOPICS, lambda: Engine(DetectConfig()))
    dirty = StreamProcessor(TOPICS, lambda: Engine(DetectConfig()))
    want = clean.process_batch(records(list(sim)))
    got = dirty.process_batch(records(mixed))
    letters = [o for o in got if o.topic == TOPICS.dlq]
    assert len(letters) == len(bad)
    assert want  # the slow GPU was found
    assert [o.value for o in got if o.topic != TOPICS.dlq] == [o.value for o in want]

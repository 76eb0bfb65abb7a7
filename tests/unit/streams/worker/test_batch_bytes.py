"""Records with random bytes changed never break a batch: each is processed or becomes a
dead letter with a contract reason, and the core never fails on what passes decoding.

A record whose host name held one byte that is not UTF-8 used to raise out of
``process_batch`` (msgspec's UnicodeDecodeError escaped the decoder), and the
worker then dropped the whole batch. About 6 % of random byte changes hit it.
"""

from __future__ import annotations

import random

import pytest

from stepwatch.contract import KIND_OF, Topics, encode, message_key
from stepwatch.sim import Fault, FaultKind, Scenario, simulate
from stepwatch.streams.core import DetectConfig, Engine
from stepwatch.streams.worker.dlq import DlqReason, decode_dead_letter
from stepwatch.streams.worker.processor import Record, StreamProcessor

pytestmark = pytest.mark.unit

TOPICS = Topics("bytes")
T0 = 1_700_000_000.0


@pytest.mark.parametrize("seed", range(4))
def test_a_batch_with_changed_bytes_is_processed_or_dead_lettered(seed: int) -> None:
    rng = random.Random(seed)
    slow = Fault(kind=FaultKind.SLOW_GPU, rank=3, start_step=40, severity=0.3)
    scenario = Scenario(
        seed=seed, nodes=2, steps=80, job_id=f"b{seed}", start_ts=T0, faults=(slow,)
    )
    proc = StreamProcessor(TOPICS, lambda: Engine(DetectConfig()), clock=lambda: T0 + 200)
    records, changed = [], 0
    for i, m in enumerate(simulate(scenario)):
        value = encode(m)
        if rng.random() < 0.15:
            changed += 1
            b = bytearray(value)
            for _ in range(rng.choice((1, 2, 5))):
                b[rng.randrange(len(b))] = rng.randrange(256)
            value = bytes(b)
        records.append(Record(TOPICS.for_kind(KIND_OF[type(m)]), 0, i, message_key(m), value))
    reasons: list[str] = []
    for at in range(0, len(records), 300):
        out = proc.process_batch(records[at : at + 300])  # must not raise
        reasons += [decode_dead_letter(o.value).reason for o in out if o.topic == TOPICS.dlq]
    assert 0 < len(reasons) <= changed
    assert DlqReason.PROCESSING_ERROR.value not in reasons
    assert set(reasons) <= {r.value for r in DlqReason}
    assert proc.positions[(records[-1].topic, 0)] == max(
        r.offset for r in records if r.topic == records[-1].topic
    )

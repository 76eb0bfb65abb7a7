"""The partition a message's key belongs on (murmur2, Kafka's default), checked on arrival."""

from __future__ import annotations

import pytest

from stepwatch.contract import GpuMessage, GpuReading, encode
from stepwatch.streams.worker.dlq import decode_dead_letter
from stepwatch.streams.worker.placement import Placement
from stepwatch.streams.worker.processor import StreamProcessor
from tests.unit.streams.worker.test_processor import T0, TOPICS, FakeEngine, rec, step_msg


@pytest.mark.parametrize(
    ("key", "java"),  # org.apache.kafka.common.utils.Utils.murmur2, Kafka's own test vectors
    [
        (b"21", -973932308),
        (b"foobar", -790332482),
        (b"a-little-bit-long-string", -985981536),
        (b"a-little-bit-longer-string", -1486304829),
        (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
        (b"abc", 479470107),
    ],
)
def test_the_partition_is_javas_murmur2_with_the_sign_bit_cleared(key: bytes, java: int) -> None:
    for n in (1, 3, 8, 64):
        assert Placement(n).of(key) == (java & 0x7FFFFFFF) % n


def test_the_cache_of_keys_is_bounded() -> None:
    placement = Placement(8, max_keys=10)
    first = [placement.of(b"job-%d" % i) for i in range(25)]
    assert len(placement._known) <= 10
    assert [placement.of(b"job-%d" % i) for i in range(25)] == first


def test_a_jobs_messages_on_another_partition_are_refused_before_the_gate() -> None:
    """A healthy job's step messages copied to another partition: that partition's worker
    took them for a second copy of the job and opened 8 rank_missing detections that
    never resolved (red team). Now each is a dead letter, and the engine sees none."""
    placement = Placement(8)
    home = placement.of(b"j")
    away = (home + 1) % 8
    proc = StreamProcessor(
        TOPICS, FakeEngine, worker="w1", clock=lambda: T0 + 10_000, placement=placement
    )
    out = proc.process_batch(
        [rec(TOPICS.steps, step_msg(s), partition=home, offset=s) for s in range(3)]
        + [rec(TOPICS.steps, step_msg(s), partition=away, offset=s) for s in range(3)]
    )
    letters = [decode_dead_letter(o.value) for o in out if o.topic == TOPICS.dlq]
    assert [(x.reason, x.partition) for x in letters] == [("wrong_partition", away)] * 3
    assert f"belongs on partition {home} of 8" in letters[0].detail
    assert len(proc.states[home].engine.seen) == 3  # type: ignore[attr-defined]
    assert away not in proc.states  # nothing of the copies reached a core
    host = GpuMessage(host="n7", ts=T0, gpus=[GpuReading(index=0)])  # no job: keyed by host
    right = rec(TOPICS.gpu, encode(host), partition=placement.of(b"n7"), key=b"n7")
    assert not [o for o in proc.process_batch([right]) if o.topic == TOPICS.dlq]


def test_without_a_placement_nothing_is_checked() -> None:
    proc = StreamProcessor(TOPICS, FakeEngine, clock=lambda: T0 + 10_000)
    out = proc.process_batch([rec(TOPICS.steps, step_msg(s), partition=s) for s in range(8)])
    assert not [o for o in out if o.topic == TOPICS.dlq]

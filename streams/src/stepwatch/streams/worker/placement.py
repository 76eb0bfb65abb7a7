"""Which partition a message belongs on, checked when it arrives.

The contract (:mod:`stepwatch.contract.topics`) places every message by its key
(the job id, else the host) with Kafka's default partitioner: murmur2 of the
key modulo the partition count, as the Java client and aiokafka compute it, and
as ``stepwatch.kafka.PRODUCER_DEFAULTS`` pins for librdkafka
(``partitioner=murmur2_random``). A worker keeps each job's state per
partition, so a job's message on another partition is a second, partial copy
of the job: a red-team run copied 24 of a healthy job's step messages to
another partition, and that partition's worker opened 8 ``rank_missing``
detections on the job that never resolved (its ``job_end`` went to the right
partition). Such a message is refused (``wrong_partition``) before the gate.
"""

from __future__ import annotations

from aiokafka.partitioner import murmur2

from stepwatch.contract import Message
from stepwatch.contract.topics import message_key

MAX_KEYS = 65536  # keys whose partition is remembered (the cache is cleared past it)


class Placement:
    """The partition of each message's key among ``partitions``."""

    def __init__(self, partitions: int, max_keys: int = MAX_KEYS) -> None:
        if partitions < 1:
            raise ValueError(f"partitions must be >= 1, got {partitions}")
        self.partitions = partitions
        self.max_keys = max_keys
        self._known: dict[bytes, int] = {}

    def of(self, key: bytes) -> int:
        """The partition of ``key`` (Kafka's default: murmur2, sign bit cleared)."""
        found = self._known.get(key)
        if found is None:
            if len(self._known) >= self.max_keys:
                self._known.clear()
            found = self._known[key] = (murmur2(key) & 0x7FFFFFFF) % self.partitions
        return found

    def misplaced(self, message: Message, partition: int) -> str | None:
        """Why ``message`` does not belong on ``partition``; None when it does."""
        key = message_key(message)
        expected = self.of(key)
        if expected == partition:
            return None
        return (
            f"key {key.decode(errors='replace')!r} belongs on partition {expected} of "
            f"{self.partitions} (murmur2, Kafka's default partitioner), not {partition}"
        )

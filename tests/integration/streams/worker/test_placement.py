"""The agents' producer places a key where the worker's check expects it.

Real parts: the development broker and a confluent-kafka (librdkafka) producer with
the project's producer settings. librdkafka's own default partitioner (CRC32) puts
most keys on another partition than murmur2 (876 of 1,000 job ids over 8
partitions, red team); the worker would then refuse them as ``wrong_partition``.
"""

from __future__ import annotations

import dataclasses

import pytest

from stepwatch.kafka import ensure_topics, producer_config
from stepwatch.settings import Settings
from stepwatch.streams.worker.placement import Placement

pytestmark = pytest.mark.integration


def delivered_partitions(settings: Settings, keys: list[bytes], **config: str) -> list[int]:
    from confluent_kafka import Producer

    ensure_topics(settings)
    producer = Producer(producer_config(settings, **config))
    got: dict[bytes, int] = {}

    def done(err: object, msg: object) -> None:
        assert err is None, err
        got[msg.key()] = msg.partition()  # type: ignore[attr-defined]

    for key in keys:
        producer.produce(f"{settings.topic_prefix}.steps", b"{}", key=key, on_delivery=done)
    assert producer.flush(30) == 0
    return [got[k] for k in keys]


def test_the_project_producer_places_every_key_where_the_worker_expects_it(
    settings: Settings,
) -> None:
    settings = dataclasses.replace(settings, partitions=8)
    keys = [f"job-{i}".encode() for i in range(200)] + [b"12345", b"gpu-node-0042", b"j"]
    placement = Placement(8)
    assert delivered_partitions(settings, keys) == [placement.of(k) for k in keys]
    # librdkafka's own default would have put most of them elsewhere
    crc = delivered_partitions(settings, keys, partitioner="consistent_random")
    assert sum(c != placement.of(k) for c, k in zip(crc, keys, strict=True)) > len(keys) // 2

"""The development broker and topic set-up against the real Tansu binary."""

from __future__ import annotations

from confluent_kafka.admin import AdminClient

from stepwatch.contract import Topics
from stepwatch.daemons.broker import DevBroker
from stepwatch.kafka import ensure_topics
from stepwatch.settings import Settings


def _topics(bootstrap: str) -> dict[str, int]:
    meta = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10)
    return {name: len(t.partitions) for name, t in meta.topics.items()}


def test_topics_created_with_configured_partitions_and_idempotent(settings: Settings) -> None:
    ensure_topics(settings)
    ensure_topics(settings)  # second call verifies, creates nothing, raises nothing
    found = _topics(settings.bootstrap_servers)
    for name in Topics(settings.topic_prefix).all():
        assert found[name] == settings.partitions


def test_restart_keeps_port(broker: DevBroker, settings: Settings) -> None:
    port = broker.port
    broker.restart()
    assert broker.port == port and broker.running
    ensure_topics(settings)  # a restarted dev broker is empty (memory storage): re-create
    assert Topics(settings.topic_prefix).steps in _topics(broker.bootstrap)


def test_topics_that_are_not_co_partitioned_are_refused(settings: Settings) -> None:
    import pytest
    from confluent_kafka.admin import NewTopic

    from stepwatch.errors import ConfigError

    topics = Topics(settings.topic_prefix)
    admin = AdminClient({"bootstrap.servers": settings.bootstrap_servers})
    for f in admin.create_topics(
        [NewTopic(topics.steps, 2, 1), NewTopic(topics.gpu, 4, 1)]
    ).values():
        f.result(10)
    with pytest.raises(ConfigError) as info:
        ensure_topics(settings)  # partitions=4: the steps topic has 2
    text = str(info.value)
    assert "not co-partitioned" in text and f"{topics.steps}=2" in text and "--partitions" in text
    assert topics.ports not in _topics(settings.bootstrap_servers)  # nothing was created
    with pytest.raises(ConfigError):
        ensure_topics(settings.replace(partitions=2))  # the gpu topic has 4


def test_topics_are_created_with_durability_and_retention_settings(settings: Settings) -> None:
    from stepwatch.kafka import topic_config

    production = Settings.load(env={})
    assert (production.replication_factor, production.min_insync_replicas) == (3, 2)
    assert topic_config(production) == {
        "min.insync.replicas": "2",
        "retention.ms": str(168 * 3_600_000),
    }
    dev = settings.replace(replication_factor=1, min_insync_replicas=2, topic_retention_hours=0)
    assert topic_config(dev) == {"min.insync.replicas": "1"}  # capped at the replication factor
    ensure_topics(settings.replace(topic_retention_hours=2.5))  # the broker accepts the configs
    assert set(_topics(settings.bootstrap_servers)) >= set(Topics(settings.topic_prefix).all())

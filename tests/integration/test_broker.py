"""The development broker and topic set-up against the real Tansu binary."""

from __future__ import annotations

from confluent_kafka.admin import AdminClient

from stepwatch.broker import DevBroker
from stepwatch.contract import Topics
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

"""Integration fixtures: real services on random loopback ports."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from stepwatch.broker import DevBroker
from stepwatch.settings import Settings


@pytest.fixture()
def broker(tmp_path) -> Iterator[DevBroker]:
    """A fresh Kafka-protocol broker (Tansu) on a random loopback port."""
    with DevBroker(log_path=str(tmp_path / "broker.log")) as b:
        yield b


@pytest.fixture()
def settings(broker: DevBroker, tmp_path) -> Settings:
    """Settings pointing at the test broker, with a private spool and store."""
    return Settings.load(
        env={},
        bootstrap_servers=broker.bootstrap,
        topic_prefix="t",
        partitions=4,
        spool_dir=str(tmp_path / "spool"),
        store_path=str(tmp_path / "chdb"),
        agent_socket=str(tmp_path / "agent.sock"),
        metrics_port=0,
        stream_metrics_port=0,
        host="testhost",
    )

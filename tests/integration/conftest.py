"""Integration fixtures: real services on random loopback ports."""

from __future__ import annotations

import pathlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from stepwatch.daemons.alertmanager import Alertmanager
from stepwatch.daemons.broker import DevBroker
from stepwatch.daemons.prometheus import Prometheus
from stepwatch.daemons.slurm import SlurmCluster
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


@pytest.fixture()
def prometheus_factory(tmp_path) -> Iterator[Callable[..., Prometheus]]:
    """Start real Prometheus servers: ``prometheus_factory(targets=[...], rule_files=[...])``.

    Each gets its own directory under ``tmp_path`` and a free loopback port, is
    ready when returned, and is stopped at teardown.
    """
    started: list[Prometheus] = []

    def make(**kwargs: Any) -> Prometheus:
        prom = Prometheus(workdir=tmp_path / f"prometheus{len(started)}", **kwargs)
        started.append(prom)
        return prom.start()

    yield make
    for prom in started:
        prom.stop()


@pytest.fixture()
def alertmanager_factory(tmp_path) -> Iterator[Callable[..., Alertmanager]]:
    """Start real Alertmanagers: ``alertmanager_factory(config=yaml_text_or_path)``."""
    started: list[Alertmanager] = []

    def make(config: str | pathlib.Path, **kwargs: Any) -> Alertmanager:
        am = Alertmanager(workdir=tmp_path / f"alertmanager{len(started)}", config=config, **kwargs)
        started.append(am)
        return am.start()

    yield make
    for am in started:
        am.stop()


@pytest.fixture()
def slurm(tmp_path) -> Iterator[SlurmCluster]:
    """A real 4-node Slurm cluster on this host (root only), stopped with its jobs at teardown."""
    import os

    if os.geteuid() != 0:
        pytest.skip("the one-host Slurm cluster needs root (slurmd runs jobs as their user)")
    with SlurmCluster(tmp_path / "slurm", nodes=4) as cluster:
        yield cluster

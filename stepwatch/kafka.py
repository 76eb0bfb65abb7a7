"""Kafka client configuration and topic set-up shared by every component.

User-supplied client settings (``security.protocol``, ``sasl.*``, ``ssl.*``,
``client.id`` ...) from :class:`~stepwatch.settings.Settings.kafka_config` are
passed through to librdkafka untouched; stepwatch only fills in what the user
did not set.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from stepwatch.contract.topics import Topics
from stepwatch.errors import ConfigError, TransportError
from stepwatch.settings import Settings

log = logging.getLogger(__name__)

PRODUCER_DEFAULTS: dict[str, Any] = {
    "enable.idempotence": True,
    "acks": "all",
    "compression.type": "lz4",
    "linger.ms": 50,
    "batch.num.messages": 10000,
    "message.timeout.ms": 30000,
}


def client_config(settings: Settings, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Base client config: bootstrap servers + pass-through + per-client extras."""
    if not settings.bootstrap_servers:
        raise ConfigError("bootstrap_servers is empty: start a broker or set STEPWATCH_BOOTSTRAP_SERVERS")
    config: dict[str, Any] = dict(extra or {})
    config["bootstrap.servers"] = settings.bootstrap_servers
    config.update(settings.kafka_config)
    return config


def producer_config(settings: Settings, **overrides: Any) -> dict[str, Any]:
    merged = {**PRODUCER_DEFAULTS, **overrides}
    config = client_config(settings, merged)
    return config


def ensure_topics(settings: Settings, names: Iterable[str] | None = None, timeout: float = 15.0) -> None:
    """Create missing topics with the configured partitions; verify existing ones.

    An existing topic with a different partition count is reported (it breaks
    co-partitioning) but not altered.
    """
    from confluent_kafka import KafkaError
    from confluent_kafka.admin import AdminClient, NewTopic
    wanted = list(names) if names is not None else list(Topics(settings.topic_prefix).all())
    admin = AdminClient(client_config(settings))
    try:
        existing = admin.list_topics(timeout=timeout).topics
    except Exception as err:
        raise TransportError(f"cannot list topics on {settings.bootstrap_servers}: {err}") from err
    for name in wanted:
        if name in existing and len(existing[name].partitions) != settings.partitions:
            log.warning(
                "topic partition mismatch topic=%s partitions=%d expected=%d",
                name, len(existing[name].partitions), settings.partitions,
            )
    missing = [n for n in wanted if n not in existing]
    if not missing:
        return
    if not settings.create_topics:
        raise TransportError(f"topics missing and create_topics is off: {missing}")
    futures = admin.create_topics(
        [NewTopic(n, settings.partitions, settings.replication_factor) for n in missing]
    )
    for name, future in futures.items():
        try:
            future.result(timeout=timeout)
            log.info("topic created topic=%s partitions=%d", name, settings.partitions)
        except Exception as err:
            if _error_code(err) == KafkaError.TOPIC_ALREADY_EXISTS:
                continue
            raise TransportError(f"cannot create topic {name}: {err}") from err


def _error_code(err: BaseException) -> int | None:
    """The librdkafka error code a confluent-kafka future raised, if any."""
    from confluent_kafka import KafkaError, KafkaException

    kafka_error = err.args[0] if isinstance(err, KafkaException) and err.args else None
    return kafka_error.code() if isinstance(kafka_error, KafkaError) else None

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
from stepwatch.logs import RateLimit
from stepwatch.settings import Settings

log = logging.getLogger(__name__)

PRODUCER_DEFAULTS: dict[str, Any] = {
    # the contract's placement (stepwatch.contract.topics): murmur2 of the key, as the Java
    # client and aiokafka place it; librdkafka's own default (CRC32) puts most jobs on
    # another partition, which the stream worker refuses (wrong_partition)
    "partitioner": "murmur2_random",
    "enable.idempotence": True,
    "acks": "all",
    "compression.type": "lz4",
    "linger.ms": 50,
    "batch.num.messages": 10000,
    "message.timeout.ms": 30000,
}


CLIENT_LOG_INTERVAL = 60.0  # seconds between two client log lines of one facility


def kafka_logger(role: str) -> logging.Logger:
    """The logger librdkafka's own lines go to (client config ``logger``), rate-limited.

    Without it librdkafka prints every connection failure to stderr in its own
    format; with it each facility (``FAIL``, ``REQTMOUT``, ...) logs at most
    once a minute per client role, through the project's log format, with a
    count of what was suppressed. (librdkafka's lines are delivered from the
    client's ``poll``.)
    """
    logger = logging.getLogger(f"stepwatch.kafka.client.{role}")
    if not any(isinstance(f, RateLimit) for f in logger.filters):
        logger.addFilter(RateLimit(CLIENT_LOG_INTERVAL))
    return logger


def client_config(
    settings: Settings, extra: Mapping[str, Any] | None = None, role: str = "client"
) -> dict[str, Any]:
    """Base client config: bootstrap servers + pass-through + per-client extras.

    librdkafka's own log lines go to :func:`kafka_logger` (``role`` names it)
    unless ``extra`` or the pass-through settings name another ``logger``.
    """
    if not settings.bootstrap_servers:
        raise ConfigError(
            "bootstrap_servers is empty: start a broker or set STEPWATCH_BOOTSTRAP_SERVERS"
        )
    config: dict[str, Any] = {"logger": kafka_logger(role), **(extra or {})}
    config["bootstrap.servers"] = settings.bootstrap_servers
    config.update(settings.kafka_config)
    return config


def producer_config(settings: Settings, **overrides: Any) -> dict[str, Any]:
    merged = {**PRODUCER_DEFAULTS, **overrides}
    config = client_config(settings, merged)
    return config


def topic_config(settings: Settings) -> dict[str, str]:
    """Topic-level settings of created topics: durability and retention."""
    config = {
        "min.insync.replicas": str(min(settings.min_insync_replicas, settings.replication_factor))
    }
    if settings.topic_retention_hours > 0:
        config["retention.ms"] = str(int(settings.topic_retention_hours * 3_600_000))
    return config


def check_copartitioned(partitions: Mapping[str, int], expected: int) -> None:
    """Refuse topics whose partition counts differ (from each other or the setting).

    The stream worker keeps a job's state per partition number and writes a
    job's detections to the partition its telemetry came from: every topic
    must have the same partition count, or jobs are split between workers.
    """
    counts = set(partitions.values())
    if counts <= {expected}:
        return
    listing = ", ".join(f"{name}={n}" for name, n in sorted(partitions.items()))
    raise ConfigError(
        f"topics are not co-partitioned: {listing} (partitions setting {expected}). Every "
        "stepwatch topic must have the same partition count: set --partitions "
        "(STEPWATCH_PARTITIONS) to the existing count, or re-create or extend the topics "
        "(kafka-topics --alter --partitions N) so they all match"
    )


def ensure_topics(
    settings: Settings, names: Iterable[str] | None = None, timeout: float = 15.0
) -> None:
    """Create missing topics (partitions, replication factor, retention); verify existing ones.

    Existing topics must be co-partitioned with each other and with the
    ``partitions`` setting (:func:`check_copartitioned`): a mismatch is refused
    with a clear error, never altered.
    """
    from confluent_kafka import KafkaError
    from confluent_kafka.admin import AdminClient, NewTopic

    wanted = list(names) if names is not None else list(Topics(settings.topic_prefix).all())
    admin = AdminClient(client_config(settings, role="admin"))
    try:
        existing = admin.list_topics(timeout=timeout).topics
    except Exception as err:
        raise TransportError(f"cannot list topics on {settings.bootstrap_servers}: {err}") from err
    check_copartitioned(
        {n: len(existing[n].partitions) for n in wanted if n in existing}, settings.partitions
    )
    missing = [n for n in wanted if n not in existing]
    if not missing:
        return
    if not settings.create_topics:
        raise TransportError(f"topics missing and create_topics is off: {missing}")
    config = topic_config(settings)
    futures = admin.create_topics(
        [
            NewTopic(n, settings.partitions, settings.replication_factor, config=config)
            for n in missing
        ]
    )
    for name, future in futures.items():
        try:
            future.result(timeout=timeout)
            log.info(
                "topic created topic=%s partitions=%d replication_factor=%d config=%s",
                name,
                settings.partitions,
                settings.replication_factor,
                config,
            )
        except Exception as err:
            if _error_code(err) == KafkaError.TOPIC_ALREADY_EXISTS:
                continue
            raise TransportError(f"cannot create topic {name}: {err}") from err


def _error_code(err: BaseException) -> int | None:
    """The librdkafka error code a confluent-kafka future raised, if any."""
    from confluent_kafka import KafkaError, KafkaException

    kafka_error = err.args[0] if isinstance(err, KafkaException) and err.args else None
    return kafka_error.code() if isinstance(kafka_error, KafkaError) else None

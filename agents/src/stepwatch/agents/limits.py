"""What Kafka refuses for good, and the largest record the publisher produces."""

from __future__ import annotations

from typing import Any

from stepwatch.settings import Settings

# per-record errors no retry can fix: the record is dead-lettered and counted ("rejected")
TOO_LARGE = frozenset({"MSG_SIZE_TOO_LARGE", "_MSG_SIZE_TOO_LARGE", "RECORD_LIST_TOO_LARGE"})
PERMANENT = TOO_LARGE | {"INVALID_RECORD", "CORRUPT_MESSAGE", "_INVALID_ARG"}
LIBRDKAFKA_MAX_BYTES = 1_000_000  # librdkafka's default message.max.bytes and batch.size
MIN_BATCH_BYTES = 16 * 1024


def record_limit(settings: Settings) -> int:
    """The largest key + value the publisher produces; larger ones are dead-lettered."""
    try:
        client = int(settings.kafka_config.get("message.max.bytes", LIBRDKAFKA_MAX_BYTES))
    except (TypeError, ValueError):
        client = LIBRDKAFKA_MAX_BYTES
    return min(settings.max_message_bytes, client)


def error_name(err: Any) -> str:
    """The librdkafka error name a KafkaException carries ("" when none)."""
    first = err.args[0] if err.args else None
    name = getattr(first, "name", None)
    return str(name()) if callable(name) else ""

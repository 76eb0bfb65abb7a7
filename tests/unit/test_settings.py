"""Settings precedence: explicit argument > STEPWATCH_* env > default; secrets masked."""

from __future__ import annotations

import pytest

from stepwatch.errors import ConfigError
from stepwatch.settings import Settings


def test_default_then_env_then_explicit() -> None:
    assert Settings.load(env={}).partitions == 8
    assert Settings.load(env={"STEPWATCH_PARTITIONS": "4"}).partitions == 4
    assert Settings.load(env={"STEPWATCH_PARTITIONS": "4"}, partitions=2).partitions == 2


def test_explicit_none_means_not_given() -> None:
    assert Settings.load(env={"STEPWATCH_TOPIC_PREFIX": "x"}, topic_prefix=None).topic_prefix == "x"


def test_types_are_coerced_and_bad_values_named() -> None:
    s = Settings.load(env={"STEPWATCH_TICK_SECONDS": "0.5", "STEPWATCH_CREATE_TOPICS": "no"})
    assert s.tick_seconds == 0.5
    assert s.create_topics is False
    with pytest.raises(ConfigError, match="partitions"):
        Settings.load(env={"STEPWATCH_PARTITIONS": "many"})
    with pytest.raises(ConfigError, match="partitions"):
        Settings.load(env={}, partitions=0)
    with pytest.raises(ConfigError, match="unknown setting"):
        Settings.load(env={}, partitons=3)


def test_kafka_pass_through_and_masking() -> None:
    env = {
        "STEPWATCH_KAFKA__SECURITY_PROTOCOL": "SASL_SSL",
        "STEPWATCH_KAFKA__SASL_PASSWORD": "hunter2",
        "STEPWATCH_CLICKHOUSE_PASSWORD": "pw",
    }
    s = Settings.load(env=env, kafka_config={"client.id": "agent-7"})
    assert s.kafka_config == {
        "security.protocol": "SASL_SSL",
        "sasl.password": "hunter2",
        "client.id": "agent-7",
    }
    text = repr(s)
    assert "hunter2" not in text and "'pw'" not in text
    assert "SASL_SSL" in text


def test_frozen() -> None:
    s = Settings.load(env={})
    with pytest.raises(AttributeError):
        s.partitions = 3  # type: ignore[misc]

"""Typed, frozen settings: explicit argument > ``STEPWATCH_*`` env var > default.

One :class:`Settings` object is built once at start-up (``Settings.load``) and
passed down. Every field can be given explicitly (CLI flags do this), or by the
environment variable ``STEPWATCH_<FIELD>`` (upper case), or falls back to the
default below. Kafka client settings are passed through untouched: explicit
``kafka_config`` entries win over ``STEPWATCH_KAFKA__<KEY>`` variables, where
``KEY`` is the librdkafka key with ``.`` written as ``_`` (for example
``STEPWATCH_KAFKA__SECURITY_PROTOCOL=SASL_SSL``). Secrets are masked in
``repr`` and in :meth:`Settings.describe`.
"""

from __future__ import annotations

import dataclasses
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from stepwatch.errors import ConfigError

ENV_PREFIX = "STEPWATCH_"
KAFKA_ENV_PREFIX = "STEPWATCH_KAFKA__"
_SECRET_MARKERS = ("password", "secret", "sasl.password", "ssl.key.password", "token")


def _default_host() -> str:
    return socket.gethostname()


@dataclass(frozen=True)
class Settings:
    """Every knob of the pipeline, in one place."""

    # --- Kafka ---------------------------------------------------------------
    bootstrap_servers: str = ""  # empty: start the embedded development broker
    kafka_config: Mapping[str, str] = field(default_factory=dict)
    topic_prefix: str = "stepwatch"
    partitions: int = 8
    replication_factor: int = 3  # 1 only for the development broker (it sets 1 itself)
    create_topics: bool = True
    # --- node agent ------------------------------------------------------------
    host: str = field(default_factory=_default_host)
    agent_socket: str = "/tmp/stepwatch-agent.sock"
    tick_seconds: float = 1.0
    spool_dir: str = "var/spool"
    spool_max_bytes: int = 512 * 1024 * 1024
    sysfs_root: str = "/sys"
    dcgm_url: str = ""  # e.g. http://localhost:9400/metrics; empty: use NVML
    collectors: str = "nvml,rdma,steps"  # comma-separated collector names
    metrics_port: int = 9465  # 0 disables the agent's /metrics endpoint
    # --- stream processors -----------------------------------------------------
    stream_metrics_port: int = 9466
    stream_data_dir: str = "var/stream"  # the Faust worker's data directory
    hang_min_seconds: float = 60.0
    hang_step_multiple: float = 10.0
    # --- historical store ------------------------------------------------------
    clickhouse_url: str = ""  # empty: embedded chdb at store_path
    clickhouse_user: str = "default"
    clickhouse_password: str = ""
    clickhouse_database: str = "stepwatch"
    store_path: str = "var/chdb"
    store_raw_ttl_days: int = 90  # retention of raw step/GPU/port rows (rollups keep 2 years)
    sink_metrics_port: int = 9467  # the ClickHouse sink's /metrics; 0 disables it
    # --- integrity: topics, message bounds, /metrics endpoints ---------------------
    min_insync_replicas: int = 2  # topic setting at creation; capped at replication_factor
    topic_retention_hours: float = 168.0  # retention.ms of created topics; <= 0: the broker's
    max_message_bytes: int = 1 << 20  # larger messages are refused (reason too_large)
    metrics_host: str = "127.0.0.1"  # the interface every /metrics endpoint listens on
    metrics_tls_cert: str = ""  # PEM certificate: serve /metrics over HTTPS (with the key)
    metrics_tls_key: str = ""
    metrics_auth_user: str = ""  # basic auth on /metrics when set (with the password)
    metrics_auth_password: str = ""
    # --- misc -------------------------------------------------------------------
    log_level: str = "INFO"

    @classmethod
    def load(cls, env: Mapping[str, str] | None = None, **explicit: Any) -> Settings:
        """Build settings: ``explicit`` (non-None values) > env > defaults."""
        environ = os.environ if env is None else env
        known = {f.name: f for f in fields(cls)}
        unknown = set(explicit) - set(known)
        if unknown:
            raise ConfigError(f"unknown setting(s): {', '.join(sorted(unknown))}")
        values: dict[str, Any] = {}
        for name, f in known.items():
            if name == "kafka_config":
                continue
            if explicit.get(name) is not None:
                values[name] = _coerce(name, f.type, explicit[name])
            elif ENV_PREFIX + name.upper() in environ:
                values[name] = _coerce(name, f.type, environ[ENV_PREFIX + name.upper()])
        kafka = _kafka_from_env(environ)
        kafka.update(explicit.get("kafka_config") or {})
        values["kafka_config"] = dict(kafka)
        settings = cls(**values)
        settings.validate()
        return settings

    def validate(self) -> None:
        if self.partitions < 1:
            raise ConfigError(f"partitions must be >= 1, got {self.partitions}")
        if self.tick_seconds <= 0:
            raise ConfigError(f"tick_seconds must be > 0, got {self.tick_seconds}")
        if self.store_raw_ttl_days < 1:
            raise ConfigError(f"store_raw_ttl_days must be >= 1, got {self.store_raw_ttl_days}")
        if self.replication_factor < 1 or self.min_insync_replicas < 1:
            raise ConfigError("replication_factor and min_insync_replicas must be >= 1")
        if self.max_message_bytes < 1024:
            raise ConfigError(f"max_message_bytes must be >= 1024, got {self.max_message_bytes}")
        if bool(self.metrics_tls_cert) != bool(self.metrics_tls_key):
            raise ConfigError("metrics_tls_cert and metrics_tls_key go together")
        if bool(self.metrics_auth_user) != bool(self.metrics_auth_password):
            raise ConfigError("metrics_auth_user and metrics_auth_password go together")
        if self.spool_max_bytes < 1024 * 1024:
            raise ConfigError(f"spool_max_bytes must be >= 1 MiB, got {self.spool_max_bytes}")

    def replace(self, **changes: Any) -> Settings:
        return dataclasses.replace(self, **changes)

    def describe(self) -> dict[str, Any]:
        """A dict of the settings with secrets masked, for logs and ``--help``."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "kafka_config":
                value = {k: mask(k, v) for k, v in value.items()}
            else:
                value = mask(f.name, value)
            out[f.name] = value
        return out

    def __repr__(self) -> str:
        body = ", ".join(f"{k}={v!r}" for k, v in self.describe().items())
        return f"Settings({body})"


def mask(key: str, value: Any) -> Any:
    """Return ``'***'`` for non-empty secret values, the value otherwise."""
    if value and any(marker in key.lower() for marker in _SECRET_MARKERS):
        return "***"
    return value


def _kafka_from_env(environ: Mapping[str, str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in environ.items():
        if key.startswith(KAFKA_ENV_PREFIX):
            out[key[len(KAFKA_ENV_PREFIX):].lower().replace("_", ".")] = value
    return out


def _coerce(name: str, type_name: Any, raw: Any) -> Any:
    kind = type_name if isinstance(type_name, str) else getattr(type_name, "__name__", "")
    try:
        if kind == "bool":
            return _to_bool(raw)
        if kind == "int":
            return int(raw)
        if kind == "float":
            return float(raw)
        return str(raw)
    except (TypeError, ValueError) as err:
        raise ConfigError(f"setting {name}: cannot read {raw!r} as {kind}") from err


def _to_bool(raw: Any) -> bool:
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower()
    if text in {"1", "true", "yes", "on"}:
        return True
    if text in {"0", "false", "no", "off", ""}:
        return False
    raise ValueError(raw)

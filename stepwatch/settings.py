"""Typed, frozen settings: explicit flag > ``STEPWATCH_*`` env > config file > default.

One :class:`Settings` object holds every setting of every service; it is built
once at start-up (``Settings.load``) and passed down. Every field can be given
explicitly (CLI flags do this), or by the environment variable
``STEPWATCH_<FIELD>`` (upper case), or in a TOML config file (``--config`` or
``STEPWATCH_CONFIG``; keys are field names, or ``[section]`` tables whose keys
are the field names without the section prefix, e.g. ``[stream] batch = 2000``
for ``stream_batch``; a ``[kafka_config]`` table holds librdkafka keys), or falls
back to the default below. A bad value is a :class:`ConfigError` naming the
setting. :attr:`Settings.sources` says where each value came from. Kafka client
settings are passed through untouched: explicit ``kafka_config`` entries win
over ``STEPWATCH_KAFKA__<KEY>`` variables, where ``KEY`` is the librdkafka key
with ``.`` written as ``_`` (for example
``STEPWATCH_KAFKA__SECURITY_PROTOCOL=SASL_SSL``). Secrets are masked in ``repr``
and in :meth:`Settings.describe`.
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
import os
import socket
import stat
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from stepwatch.errors import ConfigError

ENV_PREFIX = "STEPWATCH_"
KAFKA_ENV_PREFIX = "STEPWATCH_KAFKA__"
CONFIG_ENV = "STEPWATCH_CONFIG"
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
_SECTIONS = ("kafka", "agent", "stream", "store", "sink", "hang", "remediate", "demo")
_SECRET_MARKERS = ("password", "secret", "sasl.password", "ssl.key.password", "token")
# STEPWATCH_* variables that are not settings: the step SDK's identity and switches
# (docs/sdk.md) and the Slurm and setup scripts' (deploy/slurm, scripts/).
OTHER_ENV = frozenset(
    {
        "STEPWATCH_JOB_ID",
        "STEPWATCH_RANK",
        "STEPWATCH_LOCAL_RANK",
        "STEPWATCH_WORLD_SIZE",
        "STEPWATCH_LOCAL_WORLD_SIZE",
        "STEPWATCH_NODE_RANK",
        "STEPWATCH_GROUP",
        "STEPWATCH_GPU",
        "STEPWATCH_ENABLED",
        "STEPWATCH_OTEL",
        "STEPWATCH_TIMING",
        "STEPWATCH_CPU_WAIT",
        "STEPWATCH_TORCH_RECORD",
        "STEPWATCH_PROLOG_NO_SYSTEMD",
        "STEPWATCH_SKIP_APT",
        "STEPWATCH_DEMO_DURATION",
        "STEPWATCH_TEST_WORKERS",
    }
)
log = logging.getLogger(__name__)
_warned: set[str] = set()


# The SDK and the agent share this default: a directory of the agent's own
# (created 0750), never a socket directly in a world-writable /tmp.
DEFAULT_AGENT_SOCKET = "/tmp/stepwatch/agent.sock"
AGENT_VERIFY_JOB = ("off", "when_known", "strict")


def _default_host() -> str:
    return socket.gethostname()


@dataclass(frozen=True)
class Settings:
    """Every knob of the pipeline, in one place."""

    # --- Kafka ---------------------------------------------------------------
    bootstrap_servers: str = ""  # empty: an error, except where --dev-broker starts one
    kafka_config: Mapping[str, str] = field(default_factory=dict)
    topic_prefix: str = "stepwatch"
    partitions: int = 8
    replication_factor: int = 3  # 1 only for the development broker (it sets 1 itself)
    create_topics: bool = True
    # --- node agent ------------------------------------------------------------
    host: str = field(default_factory=_default_host)
    agent_socket: str = DEFAULT_AGENT_SOCKET
    # group (name or gid) allowed to send to the socket: its directory is 0750 and the
    # socket 0620, both of this group; empty: the agent's own group
    agent_socket_group: str = ""
    agent_verify_job: str = "when_known"  # off | when_known | strict (docs/agent.md)
    agent_host_aliases: str = ""  # comma-separated names also accepted as this host
    agent_sender_rate: float = 500.0  # datagrams/s per sending process; 0: no limit
    agent_sender_burst: int = 1000
    agent_user_rate: float = 4000.0  # datagrams/s per sending uid; 0: no limit
    agent_user_burst: int = 8000
    agent_max_message_bytes: int = 256 * 1024  # a step message the agent builds, at most
    agent_dead_letter_max_bytes: int = 64 * 1024 * 1024  # <spool_dir>/dead, at most
    proc_root: str = "/proc"
    tick_seconds: float = 1.0
    spool_dir: str = "var/spool"
    spool_max_bytes: int = 512 * 1024 * 1024
    sysfs_root: str = "/sys"
    dcgm_url: str = ""  # e.g. http://localhost:9400/metrics; empty: use NVML
    nvml_replay: str = ""  # the nvml-replay collector's recording; empty: the shipped H100 one
    collectors: str = "nvml,rdma,steps"  # comma-separated collector names
    # the Slurm prolog's hpc-job mapping (deploy/slurm): GPU index -> job id; empty: none
    job_map_dir: str = "/run/stepwatch/jobs"
    metrics_port: int = 9465  # 0 disables the agent's /metrics endpoint
    # --- stream processors -----------------------------------------------------
    stream_metrics_port: int = 9466
    stream_data_dir: str = "var/stream"  # the Faust worker's data directory
    hang_min_seconds: float = 60.0
    hang_step_multiple: float = 10.0
    # find a host that is half of its job and slow from its start against the job's other
    # hosts (docs/detection.md, "A host that is half of its job"); off by default: hosts
    # emulated on one machine's cores, which the pipeline shares, split at random
    host_split: bool = False
    # --- historical store ------------------------------------------------------
    clickhouse_url: str = ""  # empty: embedded chdb at store_path
    clickhouse_user: str = "default"
    clickhouse_password: str = ""
    clickhouse_database: str = "stepwatch"
    # a remote_servers cluster: tables ON CLUSTER, replicated, behind Distributed ones
    # (docs/store.md)
    clickhouse_cluster: str = ""
    store_path: str = "var/chdb"
    store_raw_ttl_days: int = 90  # retention of raw step/GPU/port rows (rollups keep 2 years)
    store_detection_producers: str = ""  # comma-separated stream worker names; empty: any producer
    store_dedup_max_senders: int = 16384  # senders the sink's duplicate filter remembers (LRU)
    # a message (or step record) stamped further ahead of the sink's clock is a dead letter
    # (future_timestamp), as the stream worker refuses it; <= 0: off
    store_future_seconds: float = 120.0
    sink_metrics_port: int = 9467  # the ClickHouse sink's /metrics; 0 disables it
    sink_group: str = "stepwatch-store"  # the sink's consumer group
    sink_batch_messages: int = 5000  # records per partition batch
    sink_batch_seconds: float = 1.0  # longest a record waits before its batch is inserted
    # --- stream worker (stepwatch stream) ---------------------------------------
    stream_app_id: str = ""  # Faust app id = consumer group; empty: stepwatch-stream.<prefix>
    stream_worker_name: str = ""  # in logs and dead letters; empty: host:pid
    stream_web_port: int = 0  # Faust's own web server; 0 keeps it off
    stream_batch: int = 2000  # Kafka messages per processing batch
    stream_batch_within: float = 0.05  # seconds to wait for a batch to fill (stock consumer)
    stream_tick_seconds: float = 1.0  # hang checks and metric refreshes
    # an input topic's partition that neither answers a fetch nor gives a record this long is
    # unread: its hang checks wait, and the time does not count against its jobs (worker.sight)
    stream_unread_seconds: float = 10.0
    stream_standby_replicas: int = 1  # standby copies of the open-detections table
    stream_restore_grace_steps: int = 64  # steps before an unconfirmed inherited detection resolves
    stream_session_timeout: float = 6.0  # consumer-group session timeout s; 0: Faust's 60
    stream_rebalance_timeout: float = 0.0  # rebalance (rejoin) timeout s; 0: Faust's 60
    stream_faust_log_level: str = "WARNING"  # log level of Faust, mode and aiokafka
    stream_stock_consumer: bool = False  # Faust's stock consumer loop instead of the lean one
    # admission (docs/security.md "Boundary 2"): records refused go to <prefix>.dlq with the reason
    # a message whose key belongs on another partition (murmur2, the contract's placement) is
    # refused (wrong_partition); off only while producers of an older release (librdkafka's
    # CRC32 default) still send
    stream_check_partition: bool = True
    stream_future_seconds: float = (
        120.0  # a timestamp further ahead of the worker's clock; <= 0: off
    )
    stream_max_age_seconds: float = 86400.0  # older messages skip detection; <= 0: off
    stream_step_jump_min: int = 1000  # a step jump beyond max(this, factor x cadence x elapsed)
    stream_step_jump_factor: float = 100.0
    stream_max_world_size: int = 65536  # a larger world_size is refused (world_size); <= 0: off
    # what one worker's detection cores hold: the jobs' world sizes summed, and hosts; a new
    # job or host past them is refused (capacity) unless a quiet one can give its place up
    stream_max_ranks: int = 131072  # <= 0: off
    stream_max_hosts: int = 16384  # <= 0: off
    # --- store endpoint limits (the embedded store's query endpoint) ------------
    store_endpoint_max_body_bytes: int = 64 * 1024 * 1024  # a request body as sent
    store_endpoint_max_decompressed_bytes: int = 256 * 1024 * 1024  # after Content-Encoding
    store_endpoint_max_query_seconds: float = 300.0  # longest a statement may run
    store_endpoint_max_result_bytes: int = 1024 * 1024 * 1024  # a reply, held in memory
    store_endpoint_max_memory_bytes: int = 8 * 1024 * 1024 * 1024  # one statement's memory
    store_endpoint_max_concurrent_queries: int = (
        2  # more wait store_endpoint_queue_seconds, then 503
    )
    store_endpoint_max_total_memory_bytes: int = 4 * 1024 * 1024 * 1024  # all running statements
    store_endpoint_queue_seconds: float = 5.0
    # --- remediator ---------------------------------------------------------------
    remediate_port: int = 9469  # the remediator's webhook, API, /metrics and /healthz
    remediate_bind: str = "127.0.0.1"
    remediate_policy: str = "alerts/src/stepwatch/alerts/remediate/policy.example.yaml"
    remediate_state_dir: str = "var/remediate"
    remediate_token: str = ""  # the webhook's bearer token; prefer remediate_token_file
    remediate_token_file: str = ""
    # the service: one "name:token" line per operator (approve, close-breaker, the API);
    # unset, no operator endpoint answers. The webhook token is never an operator's
    remediate_operators_file: str = ""
    # the CLI's operator commands: your own operator token; prefer the file
    remediate_operator_token: str = ""
    remediate_operator_token_file: str = ""
    remediate_mode: str = ""  # observe | recommend | execute; empty: the policy's mode
    remediate_url: str = "http://127.0.0.1:9469"  # where the CLI finds the running service
    # the alert receiver (`stepwatch alerts receive`): Alertmanager -> <prefix>.alerts -> the store;
    # it binds remediate_bind and checks the remediator's bearer token
    remediate_alerts_port: int = 9470
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
    # where each value came from: "flag", "env", "file" or "default" (not a setting)
    sources: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def load(
        cls, env: Mapping[str, str] | None = None, config_file: str | None = None, **explicit: Any
    ) -> Settings:
        """Build settings: ``explicit`` (non-None values) > env > config file > defaults."""
        environ = os.environ if env is None else env
        known = {f.name: f for f in fields(cls) if f.name != "sources"}
        unknown = set(explicit) - set(known)
        if unknown:
            raise ConfigError(f"unknown setting(s): {', '.join(sorted(unknown))}")
        _warn_unknown_env(environ, set(known))
        path = config_file or environ.get(CONFIG_ENV, "")
        file_values, file_kafka = read_config_file(path, set(known)) if path else ({}, {})
        values: dict[str, Any] = {}
        sources: dict[str, str] = {}
        for name, f in known.items():
            if name == "kafka_config":
                continue
            for origin, raw in (
                ("flag", explicit.get(name)),
                ("env", environ.get(ENV_PREFIX + name.upper())),
                ("file", file_values.get(name)),
            ):
                if raw is not None:
                    values[name] = _coerce(name, f.type, raw, origin)
                    sources[name] = origin
                    break
            else:
                sources[name] = "default"
        kafka = {**file_kafka, **_kafka_from_env(environ), **(explicit.get("kafka_config") or {})}
        values["kafka_config"] = dict(kafka)
        sources["kafka_config"] = (
            "flag"
            if explicit.get("kafka_config")
            else ("env" if _kafka_from_env(environ) else ("file" if file_kafka else "default"))
        )
        settings = cls(**values, sources=sources)
        settings.validate()
        return settings

    def validate(self) -> None:
        if self.remediate_mode not in ("", "observe", "recommend", "execute"):
            raise ConfigError(
                f"remediate_mode must be observe, recommend or execute, got {self.remediate_mode!r}"
            )
        if self.log_level.upper() not in LOG_LEVELS:
            raise ConfigError(
                f"setting log_level: {self.log_level!r} is not one of {', '.join(LOG_LEVELS)}"
            )
        if self.stream_faust_log_level.upper() not in LOG_LEVELS:
            raise ConfigError(
                f"setting stream_faust_log_level: {self.stream_faust_log_level!r} "
                f"is not one of {', '.join(LOG_LEVELS)}"
            )
        for name in ("metrics_port", "stream_metrics_port", "sink_metrics_port", "stream_web_port"):
            port = getattr(self, name)
            if not 0 <= port <= 65535:
                raise ConfigError(f"setting {name}: port {port} is not in 0..65535")
        for name in (
            "stream_batch",
            "sink_batch_messages",
            "replication_factor",
            "store_endpoint_max_body_bytes",
            "store_endpoint_max_decompressed_bytes",
            "store_endpoint_max_query_seconds",
            "store_endpoint_max_result_bytes",
            "store_endpoint_max_memory_bytes",
            "store_endpoint_max_concurrent_queries",
            "store_dedup_max_senders",
            "stream_step_jump_min",
        ):
            if getattr(self, name) < 1:
                raise ConfigError(f"setting {name}: must be >= 1, got {getattr(self, name)}")
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
        self._validate_agent()
        if self.spool_max_bytes < 1024 * 1024:
            raise ConfigError(f"spool_max_bytes must be >= 1 MiB, got {self.spool_max_bytes}")

    def _validate_agent(self) -> None:
        if self.agent_verify_job.strip().lower().replace("-", "_") not in AGENT_VERIFY_JOB:
            raise ConfigError(
                f"setting agent_verify_job: {self.agent_verify_job!r} is not one "
                f"of {', '.join(AGENT_VERIFY_JOB)}"
            )
        if self.agent_max_message_bytes < 4096:
            raise ConfigError(
                "setting agent_max_message_bytes: must be >= 4096, got "
                f"{self.agent_max_message_bytes}"
            )
        for name in ("agent_sender_burst", "agent_user_burst", "agent_dead_letter_max_bytes"):
            if getattr(self, name) < 1:
                raise ConfigError(f"setting {name}: must be >= 1, got {getattr(self, name)}")

    def replace(self, **changes: Any) -> Settings:
        return dataclasses.replace(self, **changes)

    def describe(self) -> dict[str, Any]:
        """A dict of the settings with secrets masked, for logs and ``stepwatch config``."""
        out: dict[str, Any] = {}
        for f in fields(self):
            if f.name == "sources":
                continue
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


def unknown_env(environ: Mapping[str, str], known: set[str]) -> list[tuple[str, str | None]]:
    """``STEPWATCH_*`` variables that name no setting, each with the closest variable that does."""
    out: list[tuple[str, str | None]] = []
    for key in sorted(environ):
        if (
            not key.startswith(ENV_PREFIX)
            or key.startswith(KAFKA_ENV_PREFIX)
            or key == CONFIG_ENV
            or key in OTHER_ENV
        ):
            continue
        name = key[len(ENV_PREFIX) :].lower()
        if name in known:
            continue
        if name.startswith("kafka_"):  # a librdkafka key with one underscore too few
            out.append((key, KAFKA_ENV_PREFIX + key[len(ENV_PREFIX) + len("kafka_") :]))
            continue
        close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.6)
        out.append((key, ENV_PREFIX + close[0].upper() if close else None))
    return out


def _warn_unknown_env(environ: Mapping[str, str], known: set[str]) -> None:
    for key, close in unknown_env(environ, known):
        if key not in _warned:  # once per process
            _warned.add(key)
            log.warning("unknown setting ignored env=%s did_you_mean=%s", key, close or "-")


def _kafka_from_env(environ: Mapping[str, str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in environ.items():
        if key.startswith(KAFKA_ENV_PREFIX):
            out[key[len(KAFKA_ENV_PREFIX) :].lower().replace("_", ".")] = value
    return out


MAX_CONFIG_BYTES = 1 << 20


def read_config_file(path: str, known: set[str]) -> tuple[dict[str, Any], dict[str, str]]:
    """Settings and librdkafka keys from a TOML file; unknown keys are a ConfigError.

    Only a plain file of at most ``MAX_CONFIG_BYTES`` is read: a FIFO or ``/dev/zero``
    named by ``STEPWATCH_CONFIG`` blocked (or filled memory in) every process that
    loads settings, the training processes' SDK among them."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as fh:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise ConfigError(f"config file {path}: not a plain file")
            raw = fh.read(MAX_CONFIG_BYTES + 1)
        if len(raw) > MAX_CONFIG_BYTES:
            raise ConfigError(f"config file {path}: larger than {MAX_CONFIG_BYTES} bytes")
        data = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as err:
        raise ConfigError(f"config file {path}: not UTF-8 text: {err}") from err
    except OSError as err:
        raise ConfigError(f"config file {path}: {err.strerror or err}") from err
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"config file {path}: not valid TOML: {err}") from err
    values: dict[str, Any] = {}
    kafka: dict[str, str] = {}
    for key, value in data.items():
        if key == "kafka_config" and isinstance(value, dict):
            kafka.update({str(k): str(v) for k, v in value.items()})
        elif isinstance(value, dict) and key in _SECTIONS:
            for sub, inner in value.items():
                name = f"{key}_{sub}" if f"{key}_{sub}" in known else sub
                if name not in known:
                    raise ConfigError(f"config file {path}: unknown setting [{key}] {sub}")
                values[name] = inner
        elif key in known:
            values[key] = value
        else:
            raise ConfigError(f"config file {path}: unknown setting {key}")
    return values, kafka


def _coerce(name: str, type_name: Any, raw: Any, origin: str = "flag") -> Any:
    kind = type_name if isinstance(type_name, str) else getattr(type_name, "__name__", "")
    where = {"env": f" (from {ENV_PREFIX}{name.upper()})", "file": " (from the config file)"}.get(
        origin, ""
    )
    try:
        if kind == "bool":
            return _to_bool(raw)
        if kind == "int":
            if isinstance(raw, bool) or (isinstance(raw, float) and not raw.is_integer()):
                raise ValueError(raw)
            return int(raw)
        if kind == "float":
            if isinstance(raw, bool):
                raise ValueError(raw)
            return float(raw)
        if isinstance(raw, dict | list):
            raise ValueError(raw)
        return str(raw)
    except (TypeError, ValueError) as err:
        raise ConfigError(f"setting {name}{where}: cannot read {raw!r} as {kind}") from err


def _to_bool(raw: Any) -> bool:
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower()
    if text in {"1", "true", "yes", "on"}:
        return True
    if text in {"0", "false", "no", "off", ""}:
        return False
    raise ValueError(raw)

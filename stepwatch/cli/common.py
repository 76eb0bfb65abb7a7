"""Flags several subcommands share, and how they become Settings."""

from __future__ import annotations

import argparse
from dataclasses import MISSING, fields
from typing import Any

from stepwatch.errors import ConfigError
from stepwatch.settings import Settings

_FIELDS = {f.name: f for f in fields(Settings)}


def default_of(name: str) -> str:
    """The :class:`Settings` default of setting ``name`` as help text shows it.

    Help strings take every default from here, so none is written twice: floats as
    ``%g`` (``1.0`` -> ``1``), byte sizes (``*_bytes``) in the units ``parse_size``
    reads (``512M``). Flags themselves default to None, so that a flag not given
    leaves the setting to the environment, the config file or this default.
    """
    value = _FIELDS[name].default
    if value is MISSING:
        raise ValueError(f"setting {name} has no plain default to show")
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, int) and not isinstance(value, bool) and name.endswith("_bytes"):
        for power, unit in ((4, "T"), (3, "G"), (2, "M"), (1, "K")):
            if value and value % 1024**power == 0:
                return f"{value // 1024**power}{unit}"
    return str(value)


def add_kafka_flags(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("kafka")
    g.add_argument(
        "--bootstrap-servers",
        help="Kafka bootstrap servers (env STEPWATCH_BOOTSTRAP_SERVERS); required, "
        "except where --dev-broker starts the embedded development broker",
    )
    g.add_argument(
        "--topic-prefix", help=f"topic name prefix (default {default_of('topic_prefix')})"
    )
    g.add_argument(
        "--partitions",
        type=int,
        help=f"partitions for topics created (default {default_of('partitions')})",
    )
    g.add_argument(
        "-X",
        "--kafka-config",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="librdkafka setting passed through, e.g. -X security.protocol=SASL_SSL (repeatable)",
    )


def parse_kv(pairs: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for pair in pairs:
        if "=" not in pair:
            raise ConfigError(f"expected KEY=VALUE, got {pair!r}")
        key, value = pair.split("=", 1)
        out[key.strip()] = value
    return out


SETTING_NAMES = frozenset(f.name for f in fields(Settings)) - {"sources", "kafka_config"}


def settings_from_args(args: argparse.Namespace, **more: Any) -> Settings:
    """Settings: flags given (None = not given) > env > config file > default.

    Every flag whose ``dest`` is a :class:`Settings` field is taken as that
    setting; ``more`` adds values under other flag names.
    """
    explicit: dict[str, Any] = {
        name: value
        for name, value in vars(args).items()
        if name in SETTING_NAMES and value is not None
    }
    if getattr(args, "kafka_config", None):
        explicit["kafka_config"] = parse_kv(args.kafka_config)
    explicit.update({k: v for k, v in more.items() if v is not None})
    return Settings.load(config_file=getattr(args, "config", None), **explicit)


def add_web_flags(group: Any) -> None:
    """``--web-listen-address`` (node_exporter's convention) for a service's /metrics."""
    group.add_argument(
        "--web-listen-address",
        metavar="HOST:PORT",
        default="",
        help="address of /metrics, e.g. 127.0.0.1:9465, [::1]:9465 or :9465 (every "
        "interface); wins over --metrics-port and STEPWATCH_METRICS_HOST (default host "
        f"{default_of('metrics_host')}). TLS and basic auth: STEPWATCH_METRICS_TLS_CERT/_KEY, "
        "STEPWATCH_METRICS_AUTH_USER/_PASSWORD (docs/security.md)",
    )


def plain_doc(doc: str | None) -> str:
    """A module docstring as ``--help`` shows it: reST's ``double backticks`` left out."""
    return (doc or "").replace("``", "")

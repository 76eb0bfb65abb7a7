"""Flags several subcommands share, and how they become Settings."""

from __future__ import annotations

import argparse
from dataclasses import fields
from typing import Any

from stepwatch.errors import ConfigError
from stepwatch.settings import Settings


def add_kafka_flags(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("kafka")
    g.add_argument(
        "--bootstrap-servers",
        help="Kafka bootstrap servers (env STEPWATCH_BOOTSTRAP_SERVERS); "
        "empty: start the embedded development broker",
    )
    g.add_argument("--topic-prefix", help="topic name prefix (default stepwatch)")
    g.add_argument("--partitions", type=int, help="partitions for topics created (default 8)")
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
        name: value for name, value in vars(args).items()
        if name in SETTING_NAMES and value is not None
    }
    if getattr(args, "kafka_config", None):
        explicit["kafka_config"] = parse_kv(args.kafka_config)
    explicit.update({k: v for k, v in more.items() if v is not None})
    return Settings.load(config_file=getattr(args, "config", None), **explicit)


def add_web_flags(group: Any) -> None:
    """``--web-listen-address`` (node_exporter's convention) for a service's /metrics."""
    group.add_argument(
        "--web-listen-address", metavar="HOST:PORT", default="",
        help="address of /metrics, e.g. 127.0.0.1:9465, [::1]:9465 or :9465 (every "
        "interface); wins over --metrics-port and STEPWATCH_METRICS_HOST (default host "
        "127.0.0.1). TLS and basic auth: STEPWATCH_METRICS_TLS_CERT/_KEY, "
        "STEPWATCH_METRICS_AUTH_USER/_PASSWORD (docs/security.md)")

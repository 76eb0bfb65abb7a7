"""``stepwatch config``: the effective settings, secrets masked, and where each came from."""

from __future__ import annotations

import argparse
import json
from typing import Any

from stepwatch.cli.common import add_kafka_flags, settings_from_args
from stepwatch.settings import ENV_PREFIX, Settings, unknown_env

# (service, the settings it reads): by name prefix, then the explicit ones; the rest is shared
GROUPS: tuple[tuple[str, tuple[str, ...], frozenset[str]], ...] = (
    (
        "kafka (every service)",
        (),
        frozenset(
            {
                "bootstrap_servers",
                "kafka_config",
                "topic_prefix",
                "partitions",
                "replication_factor",
                "create_topics",
                "min_insync_replicas",
                "topic_retention_hours",
                "max_message_bytes",
            }
        ),
    ),
    (
        "agent",
        ("agent_",),
        frozenset(
            {
                "host",
                "proc_root",
                "tick_seconds",
                "spool_dir",
                "spool_max_bytes",
                "sysfs_root",
                "dcgm_url",
                "nvml_replay",
                "job_map_dir",
                "collectors",
                "metrics_port",
            }
        ),
    ),
    ("stream workers", ("stream_", "hang_"), frozenset({"host_split"})),
    ("store and sink", ("clickhouse_", "store_", "sink_"), frozenset()),
    ("remediator", ("remediate_",), frozenset()),
)
SHARED = "every service"


def register(sub: Any) -> None:
    p = sub.add_parser(
        "config",
        help="print the effective settings (secrets masked) and their sources",
        description="Print every setting of every service as this command line, the "
        "STEPWATCH_* environment and the config file make it: explicit flag > env > "
        "config file > default. Secrets are masked.",
    )
    add_kafka_flags(p)
    p.add_argument("--json", action="store_true", help="JSON instead of a table")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    values = settings.describe()
    if args.json:
        print(
            json.dumps(
                {"settings": values, "sources": dict(settings.sources)},
                indent=2,
                sort_keys=True,
                default=str,
            )
        )
        return 0
    import os

    for key, close in unknown_env(os.environ, set(values)):
        hint = f" (did you mean {close}?)" if close else ""
        print(f"warning: {key} is not a setting and is ignored{hint}")
    print(table(settings, values))
    return 0


def group_of(name: str) -> str:
    for group, prefixes, names in GROUPS:
        if name in names or name.startswith(prefixes or ("\0",)):
            return group
    return SHARED


def table(settings: Settings, values: dict[str, Any]) -> str:
    """The settings grouped by the service that reads them: name, value, source, variable."""
    width = max(len(name) for name in values)
    lines: list[str] = []
    for group in [g for g, _, _ in GROUPS] + [SHARED]:
        names = [n for n in values if group_of(n) == group]
        if not names:
            continue
        lines.append(f"[{group}]")
        for name in names:
            source = settings.sources.get(name, "default")
            env = (
                f"{ENV_PREFIX}{name.upper()}" if name != "kafka_config" else f"{ENV_PREFIX}KAFKA__*"
            )
            lines.append(f"  {name:<{width}}  {values[name]!s:<40}  {source:<7}  {env}")
    return "\n".join(lines)

"""``stepwatch config``: the effective settings, secrets masked, and where each came from."""

from __future__ import annotations

import argparse
import json
from typing import Any

from stepwatch.cli.common import add_kafka_flags, settings_from_args


def register(sub: Any) -> None:
    p = sub.add_parser(
        "config", help="print the effective settings (secrets masked) and their sources",
        description="Print every setting of every service as this command line, the "
        "STEPWATCH_* environment and the config file make it: explicit flag > env > "
        "config file > default. Secrets are masked.")
    add_kafka_flags(p)
    p.add_argument("--json", action="store_true", help="JSON instead of a table")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    values = settings.describe()
    if args.json:
        print(json.dumps({"settings": values, "sources": dict(settings.sources)},
                         indent=2, sort_keys=True, default=str))
        return 0
    width = max(len(name) for name in values)
    for name, value in values.items():
        print(f"{name:<{width}}  {value!s:<40}  {settings.sources.get(name, 'default')}")
    return 0

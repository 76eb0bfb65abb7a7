"""``stepwatch query``: run a saved query over the historical store.

Saved queries live in exporters/src/stepwatch/exporters/clickhouse/queries/*.sql and are
documented in docs/queries.md. ``--since`` takes an age (30d, 12h), a date or a time (UTC).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from stepwatch.cli.common import plain_doc
from stepwatch.cli.db import add_store_flags, store_settings


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "query",
        help="run a saved query (lemon_nodes, rank_step_percentiles, ...)",
        description=plain_doc(__doc__),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples: stepwatch query --list; stepwatch query lemon_nodes --since 30d; "
        "stepwatch query rank_step_percentiles --job 4242 --format csv",
    )
    parser.add_argument("name", nargs="?", help="the saved query")
    parser.add_argument("--list", action="store_true", help="list the saved queries")
    parser.add_argument(
        "--describe", action="store_true", help="show the query's doc, parameters and SQL"
    )
    parser.add_argument("--job", help="job id (parameter 'job')")
    parser.add_argument(
        "--since", help="from this time on: 30d, 12h, 2026-01-31, 2026-01-31T12:00Z"
    )
    parser.add_argument("--limit", help="rows at most")
    parser.add_argument(
        "-p",
        "--param",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="any other parameter of the query (repeatable)",
    )
    parser.add_argument(
        "--format",
        "-f",
        default="table",
        choices=("table", "csv", "json", "jsonl"),
        help="output format (default %(default)s)",
    )
    add_store_flags(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from stepwatch.errors import ConfigError
    from stepwatch.exporters.clickhouse import queries

    if args.list or not args.name:
        width = max(len(n) for n in queries.registry())
        for name, saved in queries.registry().items():
            print(f"{name.ljust(width)}  {saved.summary}")
        if args.list:
            return 0
        print("stepwatch query: name one of the saved queries above", file=sys.stderr)
        return 2
    saved = queries.get(args.name)
    if args.describe:
        print(describe(saved))
        return 0
    from stepwatch.cli.common import parse_kv
    from stepwatch.exporters.clickhouse.access import open_reader
    from stepwatch.exporters.clickhouse.output import render

    values: dict[str, str | None] = dict(parse_kv(args.param))
    for name in ("job", "since", "limit"):
        given = getattr(args, name)
        if given is not None:
            if saved.param(name) is None:
                raise ConfigError(f"query {saved.name} takes no --{name}")
            values[name] = given
    params = saved.bind(values)
    store = open_reader(store_settings(args))
    try:
        result = store.query(saved.sql, params)
    finally:
        store.close()
    sys.stdout.write(render(result, args.format))
    return 0


def describe(saved: Any) -> str:
    lines = [f"{saved.name}: {saved.summary}", "", saved.doc, "", "parameters:"]
    for p in saved.params:
        default = "required" if p.required else f"default {p.default}"
        lines.append(f"  {p.name} ({p.type}, {default}): {p.help}")
    body = [line for line in saved.sql.splitlines() if not line.startswith("--")]
    lines += ["", "sql:", *body]
    return "\n".join(lines).rstrip()

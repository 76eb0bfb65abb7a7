"""``stepwatch sql``: run SQL over the historical store.

With the embedded store, the query goes through the owner's endpoint when a
sink (or ``db serve``) runs, or opens the store itself (read-only) when none
does. Placeholders ``{name:Type}`` are bound from ``-p name=value``.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from stepwatch.cli.common import plain_doc
from stepwatch.cli.db import add_store_flags, store_settings


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "sql",
        help="run SQL over past runs (table, CSV or JSON output)",
        description=plain_doc(__doc__),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog='example: stepwatch sql "SELECT job_id, count() FROM step_events GROUP BY job_id"',
    )
    parser.add_argument("query", nargs="?", help="the SQL; '-' or omitted: read it from stdin")
    parser.add_argument(
        "--format",
        "-f",
        default="table",
        choices=("table", "csv", "json", "jsonl"),
        help="output format (default %(default)s)",
    )
    parser.add_argument(
        "-p",
        "--param",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="value for a {NAME:Type} placeholder, in ClickHouse's text form as "
        "clickhouse-client --param_NAME takes it, e.g. \"h=['a','b']\" (repeatable)",
    )
    add_store_flags(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from stepwatch.cli.common import parse_kv
    from stepwatch.errors import ConfigError
    from stepwatch.exporters.clickhouse.access import open_reader
    from stepwatch.exporters.clickhouse.output import render
    from stepwatch.exporters.clickhouse.store import ParamText

    sql = args.query if args.query not in (None, "-") else sys.stdin.read()
    if not sql.strip():
        raise ConfigError("no SQL given")
    _one_statement(sql)
    store = open_reader(store_settings(args))
    try:
        params = {k: ParamText(v) for k, v in parse_kv(args.param).items()}
        result = store.query(sql, params or None)
    finally:
        store.close()
    sys.stdout.write(render(result, args.format))
    return 0


def _one_statement(sql: str) -> None:
    """Refuse a second statement with words that say so (the engine's JSON reply to two
    read as 'unreadable result: trailing characters')."""
    from stepwatch.errors import ConfigError
    from stepwatch.exporters.clickhouse.sqltext import Kind, LexError, tokens

    try:
        toks = list(tokens(sql))
    except LexError:
        return  # the engine says what is wrong with it
    ends = [i for i, t in enumerate(toks) if t.kind is Kind.PUNCT and t.text == ";"]
    if ends and any(t.text != ";" for t in toks[ends[0] + 1 :]):
        raise ConfigError("one statement at a time: run each statement on its own")

"""The cluster form of the schema: the same migration files, sharded and replicated.

``stepwatch db migrate --cluster NAME`` (``Settings.clickhouse_cluster``) runs
every migration statement through :meth:`Cluster.statements`, a rewrite of the
single-node DDL on the tokens of :mod:`~stepwatch.exporters.clickhouse.sqltext`
(so comments and string literals never confuse it). No table is written twice:

* ``CREATE TABLE t ... ENGINE = XMergeTree(args)`` becomes ``t_local ON CLUSTER``
  with ``ReplicatedXMergeTree('/clickhouse/tables/{shard}/{database}/t_local',
  '{replica}', args)`` (the server fills the macros), and
  ``non_replicated_deduplication_window`` becomes ``replicated_deduplication_window``
  (plus a week of ``replicated_deduplication_window_seconds``); then
  ``CREATE TABLE t ON CLUSTER AS t_local ENGINE = Distributed(cluster,
  database, t_local, cityHash64(key))``. Readers and the sink keep using ``t``.
* ``CREATE MATERIALIZED VIEW v TO r AS SELECT ... FROM s`` becomes ``v ON
  CLUSTER TO r_local AS SELECT ... FROM s_local AS s``: each shard's view reads
  the rows inserted into its own replica and writes its own rollup part; the
  ``Distributed`` table ``r`` reads the rollups of every shard.
* ``ALTER TABLE t`` column changes go to ``t_local`` and ``t`` (both ``ON
  CLUSTER``); other changes (TTL, settings) to ``t_local`` only. A sort key
  that takes a new column changes in the ALTER that adds it (ClickHouse's
  rule): ``t_local`` gets both, ``t`` the column alone.

The sharding key keeps the rows that may replace each other on one shard: a
function of the table's ``ORDER BY`` columns, ``job_id`` wherever the key has
it (all of a job's rows, raw and rolled up, live on one shard), else the
columns in :data:`SHARD_KEYS`. Anything else in a migration is refused: a new
kind of statement needs its cluster form written here first.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from stepwatch.errors import ConfigError, StoreError
from stepwatch.exporters.clickhouse.sqltext import Kind, LexError, Token, tokens

LOCAL_SUFFIX = "_local"
KEEPER_PATH = "/clickhouse/tables/{shard}/{database}/"  # + the local table's name
REPLICA = "{replica}"
DEDUP_WINDOW_SECONDS = 7 * 86400  # a replay after a week-long sink outage still deduplicates
# Tables without job_id in their ORDER BY: the key columns they shard by.
SHARD_KEYS: Mapping[str, tuple[str, ...]] = {
    "schema_migrations": ("version",),
    "dead_letters": ("topic", "partition"),
    "sink_batches": ("consumer_group", "topic", "partition"),
    "sender_seqs": ("key",),  # a number's contents on one shard
    "alerts": ("fingerprint",),
    "remediation_actions": ("id",),
}
DEFAULT_SHARD_KEY = ("job_id",)
# Every query of the sink and the CLIs on a cluster (docs/store.md):
# * an insert into a Distributed table returns when every shard has its rows
#   (not when the node spooled them), so the sink commits Kafka offsets only for
#   stored rows, and a retry repeats the same per-shard blocks with the same token;
# * a saved query's IN/JOIN on a second Distributed table (job_timeline's
#   host-level events, lemon_nodes' placement) runs once and is shipped to the
#   shards (GLOBAL), instead of being refused as a double-distributed subquery;
# * a replayed insert the source table drops is checked in the views' targets
#   too, so rollups are not counted twice (1 is the default of recent releases,
#   26.9 here; older servers default to 0).
CLIENT_SETTINGS: Mapping[str, int | str] = {
    "distributed_foreground_insert": 1,
    "deduplicate_blocks_in_dependent_materialized_views": 1,
    "distributed_product_mode": "global",
}
_COLUMN_COMMANDS = frozenset({"ADD", "MODIFY", "COMMENT", "RENAME"})
_CLUSTER_NAME = re.compile(r"^[A-Za-z0-9_.\-{}]+$")


@dataclass(frozen=True)
class Cluster:
    """A ClickHouse cluster (``remote_servers`` name) and the database on it."""

    name: str
    database: str = "stepwatch"

    def __post_init__(self) -> None:
        if not _CLUSTER_NAME.match(self.name):
            raise ConfigError(f"setting clickhouse_cluster: {self.name!r} is not a cluster name")
        if not self.database or "'" in self.database or "`" in self.database:
            raise ConfigError(f"setting clickhouse_database: {self.database!r} cannot be quoted")

    @property
    def on_cluster(self) -> str:
        return f"ON CLUSTER {_literal(self.name)}"

    def create_database(self) -> str:
        return f"CREATE DATABASE IF NOT EXISTS `{self.database}` {self.on_cluster}"

    def statements(self, statement: str) -> list[str]:
        """The cluster form of one single-node migration statement."""
        toks = _tokens(statement)
        head = [t.word for t in toks[:3]]
        if head[:2] == ["CREATE", "TABLE"]:
            return self._create_table(statement, toks)
        if head == ["CREATE", "MATERIALIZED", "VIEW"]:
            return [self._create_view(statement, toks)]
        if head[:2] == ["ALTER", "TABLE"]:
            return self._alter_table(statement, toks)
        raise StoreError(f"no cluster form for this migration statement: {_start(statement)}")

    # ------------------------------------------------------------------ tables
    def _create_table(self, sql: str, toks: list[Token]) -> list[str]:
        at = _name_at(toks, 2)
        name = toks[at].text
        local = name + LOCAL_SUFFIX
        engine_at = _engine_at(toks, at)
        engine = toks[engine_at].text
        if not engine.endswith("MergeTree") or engine.startswith("Replicated"):
            raise StoreError(f"table {name}: engine {engine} has no replicated cluster form")
        replication = f"{_literal(KEEPER_PATH + local)}, {_literal(REPLICA)}"
        edits = [(toks[at], f"{local} {self.on_cluster}")]
        following = toks[engine_at + 1] if engine_at + 1 < len(toks) else None
        if following is not None and following.text == "(":  # Engine(args): the path goes first
            empty = toks[engine_at + 2].text == ")"
            edits.append((toks[engine_at], "Replicated" + engine))
            edits.append((following, "(" + replication + ("" if empty else ", ")))
        else:
            edits.append((toks[engine_at], f"Replicated{engine}({replication})"))
        edits.extend(_dedup_window_edits(toks))
        keys = shard_key(name, order_by(toks, engine_at))
        distributed = (
            f"CREATE TABLE IF NOT EXISTS {name} {self.on_cluster} AS {local}\n"
            f"ENGINE = Distributed({_literal(self.name)}, {_literal(self.database)}, "
            f"{_literal(local)}, cityHash64({', '.join(keys)}))"
        )
        return [_splice(sql, edits), distributed]

    def _create_view(self, sql: str, toks: list[Token]) -> str:
        at = _name_at(toks, 3)
        to = at + 1
        if to + 1 >= len(toks) or toks[to].word != "TO":
            raise StoreError(
                f"view {toks[at].text}: a cluster view needs TO <table> (a local target)"
            )
        target = _name_at(toks, to + 1)
        sources = [i for i, t in enumerate(toks) if t.word == "FROM"]
        if len(sources) != 1 or any(t.word == "JOIN" for t in toks):
            raise StoreError(f"view {toks[at].text}: the cluster form reads exactly one table")
        source = _name_at(toks, sources[0] + 1)
        source_name = toks[source].text
        return _splice(
            sql,
            [
                (toks[at], f"{toks[at].text} {self.on_cluster}"),
                (toks[target], toks[target].text + LOCAL_SUFFIX),
                (toks[source], f"{source_name}{LOCAL_SUFFIX} AS {source_name}"),
            ],
        )

    def _alter_table(self, sql: str, toks: list[Token]) -> list[str]:
        at = _name_at(toks, 2)
        name = toks[at].text
        local = _splice(sql, [(toks[at], f"{name}{LOCAL_SUFFIX} {self.on_cluster}")])
        commands = _commands(toks, at)
        column = [c in _COLUMN_COMMANDS and toks[i + 1].word == "COLUMN" for i, c in commands]
        if all(column):  # a column change: the Distributed table has the columns too
            return [local, _splice(sql, [(toks[at], f"{name} {self.on_cluster}")])]
        if not any(column):  # TTL, settings, indexes: storage only
            return [local]
        if all(c or _sort_key_change(toks, i) for (i, _), c in zip(commands, column, strict=True)):
            # ClickHouse takes a column into the sort key only in the ALTER that adds
            # it: the local table gets both, the Distributed table the columns alone
            kept = [_command_text(sql, toks, commands, k) for k, c in enumerate(column) if c]
            return [local, f"ALTER TABLE {name} {self.on_cluster} " + ", ".join(kept)]
        raise StoreError(
            f"alter of {name}: write column and storage changes as separate statements"
        )


def cluster_of(name: str, database: str) -> Cluster | None:
    """The cluster a setting names; None (single node) when it is empty."""
    return Cluster(name.strip(), database) if name.strip() else None


def local_name(table: str) -> str:
    return table + LOCAL_SUFFIX


def shard_key(table: str, key_columns: Sequence[str]) -> tuple[str, ...]:
    """The sharding key's columns: ``job_id`` when the ORDER BY has it, else SHARD_KEYS."""
    columns = SHARD_KEYS.get(table) or (DEFAULT_SHARD_KEY if "job_id" in key_columns else ())
    if not columns:
        raise StoreError(f"table {table}: no sharding key (add its key columns to SHARD_KEYS)")
    missing = [c for c in columns if c not in key_columns]
    if missing:
        raise StoreError(
            f"table {table}: sharding column(s) {missing} are not in its ORDER BY "
            "(rows that replace each other must share a shard)"
        )
    return columns


def order_by(toks: Sequence[Token], start: int = 0) -> list[str]:
    """The column names of the first top-level ``ORDER BY`` after ``toks[start]``."""
    depth = 0
    for i in range(start, len(toks) - 1):
        tok = toks[i]
        depth += {"(": 1, ")": -1}.get(tok.text, 0) if tok.kind is Kind.PUNCT else 0
        if depth == 0 and tok.word == "ORDER" and toks[i + 1].word == "BY":
            return _key_names(toks, i + 2)
    return []


def _key_names(toks: Sequence[Token], i: int) -> list[str]:
    if toks[i].text != "(":
        return [toks[i].name]
    names, depth = [], 0
    for tok in toks[i:]:
        depth += {"(": 1, ")": -1}.get(tok.text, 0) if tok.kind is Kind.PUNCT else 0
        if depth == 0:
            break
        if tok.name:
            names.append(tok.name)
    return names


# ---------------------------------------------------------------------- tokens
def _tokens(sql: str) -> list[Token]:
    try:
        return list(tokens(sql))
    except LexError as err:
        raise StoreError(f"cannot read migration statement {_start(sql)}: {err}") from err


def _name_at(toks: Sequence[Token], i: int) -> int:
    """Index of the unqualified table name at ``toks[i]`` (after an optional IF NOT EXISTS)."""
    if [t.word for t in toks[i : i + 3]] == ["IF", "NOT", "EXISTS"]:
        i += 3
    if i >= len(toks) or toks[i].kind is not Kind.WORD:
        raise StoreError("a migration statement without a plain table name")
    if i + 1 < len(toks) and toks[i + 1].text == ".":
        raise StoreError(
            f"{toks[i].text}.{toks[i + 2].text}: migrations name tables without a database"
        )
    return i


def _engine_at(toks: Sequence[Token], start: int) -> int:
    """Index of the engine name of ``ENGINE = Name`` at the top level."""
    depth = 0
    for i in range(start, len(toks) - 2):
        tok = toks[i]
        depth += {"(": 1, ")": -1}.get(tok.text, 0) if tok.kind is Kind.PUNCT else 0
        if depth == 0 and tok.word == "ENGINE" and toks[i + 1].text == "=":
            return i + 2
    raise StoreError(f"table {toks[start].text}: no ENGINE clause")


def _dedup_window_edits(toks: Sequence[Token]) -> list[tuple[Token, str]]:
    edits = []
    for i, tok in enumerate(toks):
        if tok.word == "NON_REPLICATED_DEDUPLICATION_WINDOW":
            edits.append((tok, "replicated_deduplication_window"))
            value = toks[i + 2]  # name = value
            edits.append(
                (
                    value,
                    f"{value.text}, replicated_deduplication_window_seconds = "
                    f"{DEDUP_WINDOW_SECONDS}",
                )
            )
    return edits


def _commands(toks: Sequence[Token], at: int) -> list[tuple[int, str]]:
    """(index, first word) of each top-level command of an ALTER after the table name."""
    out, depth, expect = [], 0, True
    for i in range(at + 1, len(toks) - 1):  # a command is at least two words
        tok = toks[i]
        if expect:
            out.append((i, tok.word))
            expect = False
        depth += {"(": 1, ")": -1}.get(tok.text, 0) if tok.kind is Kind.PUNCT else 0
        expect = depth == 0 and tok.text == ","
    return out


def _sort_key_change(toks: Sequence[Token], i: int) -> bool:
    return [t.word for t in toks[i : i + 3]] == ["MODIFY", "ORDER", "BY"]


def _command_text(
    sql: str, toks: Sequence[Token], commands: Sequence[tuple[int, str]], k: int
) -> str:
    """The text of the ``k``-th top-level command of an ALTER, without its comma."""
    last = commands[k + 1][0] - 2 if k + 1 < len(commands) else len(toks) - 1
    while toks[last].text == ";":
        last -= 1
    return sql[toks[commands[k][0]].start : toks[last].end]


def _splice(sql: str, edits: Sequence[tuple[Token, str]]) -> str:
    out, pos = [], 0
    for tok, text in sorted(edits, key=lambda e: e[0].start):
        out.append(sql[pos : tok.start])
        out.append(text)
        pos = tok.end
    out.append(sql[pos:])
    return "".join(out)


def _literal(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _start(sql: str) -> str:
    code = " ".join(ln.split("--", 1)[0] for ln in sql.splitlines())
    return " ".join(code.split())[:80]

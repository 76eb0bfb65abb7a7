"""The cluster form of the migrations: ON CLUSTER, Replicated engines, Distributed fronts."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from stepwatch.errors import ConfigError, StoreError
from stepwatch.exporters.clickhouse.cluster import (
    CLIENT_SETTINGS,
    LOCAL_SUFFIX,
    Cluster,
    cluster_of,
    order_by,
)
from stepwatch.exporters.clickhouse.migrations import (
    LEDGER_DDL,
    Migrator,
    load_migrations,
    render,
    split_statements,
)
from stepwatch.exporters.clickhouse.sqltext import tokens
from stepwatch.exporters.clickhouse.store import Result
from stepwatch.settings import Settings

CLUSTER = Cluster("prod", "telemetry")
VARS = {"raw_ttl_days": 90}
_CREATE = re.compile(r"CREATE TABLE IF NOT EXISTS (\w+) ON CLUSTER 'prod'")
_DIST = re.compile(r"ENGINE = Distributed\('prod', 'telemetry', '(\w+)', cityHash64\(([\w, ]+)\)\)")
_VIEW = re.compile(r"CREATE MATERIALIZED VIEW IF NOT EXISTS (\w+) ON CLUSTER 'prod' TO (\w+) AS")


def code(statement: str) -> str:
    """The statement without comments, one line."""
    return " ".join(" ".join(ln.split("--", 1)[0] for ln in statement.splitlines()).split())


def single_node() -> list[str]:
    return [LEDGER_DDL.strip()] + [s for m in load_migrations() for s in m.statements(VARS)]


def cluster_form() -> list[str]:
    return [code(c) for s in single_node() for c in CLUSTER.statements(s)]


def tables_of(statements: Sequence[str]) -> set[str]:
    return {
        m.group(1) for s in statements if (m := re.match(r"CREATE TABLE IF NOT EXISTS (\w+)", s))
    }


def test_every_statement_runs_on_the_cluster():
    for statement in cluster_form():
        assert " ON CLUSTER 'prod' " in statement, statement


def test_every_table_becomes_a_replicated_local_table_and_a_distributed_one():
    single = tables_of([code(s) for s in single_node()])
    out = cluster_form()
    created = {m.group(1): s for s in out if (m := _CREATE.match(s))}
    assert set(created) == single | {t + LOCAL_SUFFIX for t in single}
    for table in single:
        local = created[table + LOCAL_SUFFIX]
        engine = re.search(r"ENGINE = (\w+)\('([^']+)', '\{replica\}'", local)
        assert engine is not None, local
        assert engine.group(1).startswith("Replicated") and engine.group(1).endswith("MergeTree")
        assert engine.group(2) == "/clickhouse/tables/{shard}/{database}/" + table + LOCAL_SUFFIX
        distributed = _DIST.search(created[table])
        assert distributed is not None and distributed.group(1) == table + LOCAL_SUFFIX
        assert f" AS {table}{LOCAL_SUFFIX} " in created[table]


def test_engines_keep_their_kind_and_arguments():
    out = cluster_form()
    gpu = next(s for s in out if s.startswith("CREATE TABLE IF NOT EXISTS gpu_samples_local"))
    assert (
        "ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/{database}/"
        "gpu_samples_local', '{replica}', ver)" in gpu
    )
    rollup = next(s for s in out if s.startswith("CREATE TABLE IF NOT EXISTS step_rollup_1m_local"))
    assert "ENGINE = ReplicatedAggregatingMergeTree(" in rollup
    assert "non_replicated" not in " ".join(out)
    windows = [s for s in out if "replicated_deduplication_window = 10000" in s]
    single = [s for s in single_node() if "non_replicated_deduplication_window = 10000" in code(s)]
    assert len(windows) == len(single) == 13  # every table with a window on one node has it here
    assert all("replicated_deduplication_window_seconds = 604800" in s for s in windows)


def test_views_read_and_write_the_local_tables():
    views = [m for s in cluster_form() if (m := _VIEW.match(s))]
    assert {m.group(1) for m in views} == {
        "step_rollup_1m_mv",
        "gpu_rollup_1m_mv",
        "port_rollup_1m_mv",
        "rank_placement_mv",
    }
    for match in views:
        assert match.group(2).endswith(LOCAL_SUFFIX)
        source = re.search(r" FROM (\w+) AS (\w+) ", match.string)
        assert source is not None and source.group(1) == source.group(2) + LOCAL_SUFFIX


def test_shards_by_job_where_there_is_one_and_by_the_sort_key_elsewhere():
    single = {code(s).split()[5]: s for s in single_node() if code(s).startswith("CREATE TABLE")}
    keys = {m.group(1): m.group(2) for s in cluster_form() if (m := _DIST.search(s))}
    for table, statement in single.items():
        columns = order_by(list(tokens(statement)))
        key = keys[table + LOCAL_SUFFIX].split(", ")
        assert set(key) <= set(columns), (table, key, columns)  # replacing rows share a shard
        if "job_id" in columns:
            assert key == ["job_id"]


def test_column_changes_alter_both_tables_and_storage_changes_the_local_one():
    column = CLUSTER.statements("ALTER TABLE detections ADD COLUMN IF NOT EXISTS x String AFTER id")
    assert [code(s) for s in column] == [
        "ALTER TABLE detections_local ON CLUSTER 'prod' ADD COLUMN IF NOT EXISTS x String AFTER id",
        "ALTER TABLE detections ON CLUSTER 'prod' ADD COLUMN IF NOT EXISTS x String AFTER id",
    ]
    ttl = CLUSTER.statements(
        "ALTER TABLE step_events MODIFY TTL toDateTime(start_ts) + INTERVAL 7 DAY"
    )
    assert ttl == [
        "ALTER TABLE step_events_local ON CLUSTER 'prod' MODIFY TTL "
        "toDateTime(start_ts) + INTERVAL 7 DAY"
    ]
    with pytest.raises(StoreError, match="separate statements"):
        CLUSTER.statements(
            "ALTER TABLE events ADD COLUMN y UInt8, MODIFY TTL toDateTime(ts) + INTERVAL 1 DAY"
        )
    # a column enters the sort key only in the ALTER that adds it (ClickHouse's rule)
    key = CLUSTER.statements(
        "ALTER TABLE dead_letters ADD COLUMN IF NOT EXISTS c UInt32 AFTER payload, "
        "MODIFY ORDER BY (topic, partition, offset, c), COMMENT COLUMN c 'crc';"
    )
    assert [code(s) for s in key] == [
        "ALTER TABLE dead_letters_local ON CLUSTER 'prod' ADD COLUMN IF NOT EXISTS c UInt32 "
        "AFTER payload, MODIFY ORDER BY (topic, partition, offset, c), COMMENT COLUMN c 'crc';",
        "ALTER TABLE dead_letters ON CLUSTER 'prod' ADD COLUMN IF NOT EXISTS c UInt32 "
        "AFTER payload, COMMENT COLUMN c 'crc'",
    ]


@pytest.mark.parametrize(
    ("statement", "error"),
    [
        ("INSERT INTO events SELECT * FROM events", "no cluster form"),
        (
            "CREATE TABLE IF NOT EXISTS m (job_id String) ENGINE = Memory",
            "no replicated cluster form",
        ),
        (
            "CREATE TABLE IF NOT EXISTS r (job_id String) "
            "ENGINE = ReplicatedMergeTree ORDER BY job_id",
            "no replicated cluster form",
        ),
        ("CREATE TABLE IF NOT EXISTS n (x UInt8) ENGINE = MergeTree ORDER BY x", "no sharding key"),
        (
            "CREATE TABLE IF NOT EXISTS other.t (job_id String) ENGINE = MergeTree ORDER BY job_id",
            "without a database",
        ),
        ("CREATE MATERIALIZED VIEW IF NOT EXISTS v AS SELECT job_id FROM step_events", "needs TO"),
        (
            "CREATE MATERIALIZED VIEW IF NOT EXISTS v TO r "
            "AS SELECT a.job_id FROM step_events AS a "
            "JOIN events AS b ON a.job_id = b.job_id",
            "exactly one table",
        ),
    ],
)
def test_what_has_no_cluster_form_is_refused(statement, error):
    with pytest.raises(StoreError, match=error):
        CLUSTER.statements(statement)


def test_engine_without_arguments_and_comments_that_look_like_sql():
    out = CLUSTER.statements(
        "-- ENGINE = Log, ORDER BY nothing\nCREATE TABLE IF NOT EXISTS t (job_id String, s String "
        "DEFAULT 'ENGINE = x') ENGINE = MergeTree() ORDER BY job_id"
    )
    assert (
        "ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/{database}/t_local', "
        "'{replica}')" in out[0]
    )
    assert "DEFAULT 'ENGINE = x'" in out[0] and "-- ENGINE = Log" in out[0]


def test_single_node_statements_are_the_files_as_written():
    for migration in load_migrations():
        assert migration.statements(VARS) == split_statements(render(migration.sql, VARS))
        assert migration.statements(VARS, None) == migration.statements(VARS)


@pytest.mark.parametrize("name", ["", "  ", "a b", "x'y", "c;DROP"])
def test_cluster_names_are_checked(name):
    if not name.strip():
        assert cluster_of(name, "stepwatch") is None
        return
    with pytest.raises(ConfigError, match="clickhouse_cluster"):
        Cluster(name)


def test_macro_cluster_name_is_a_string_everywhere():
    out = Cluster("{cluster}").statements(
        "CREATE TABLE IF NOT EXISTS e (job_id String) ENGINE = MergeTree ORDER BY job_id"
    )
    assert "ON CLUSTER '{cluster}'" in out[0] and "Distributed('{cluster}', " in out[1]
    assert (
        Cluster("{cluster}").create_database()
        == "CREATE DATABASE IF NOT EXISTS `stepwatch` ON CLUSTER '{cluster}'"
    )


class FakeServer:
    """Records what a Migrator runs; knows only the ledger and system.tables."""

    backend = "clickhouse-connect"
    database = "telemetry"

    def __init__(self) -> None:
        self.commands: list[str] = []
        self.ledger: list[tuple[Any, ...]] = []
        self.tables: dict[str, str] = {}

    def command(self, sql: str, params: Mapping[str, Any] | None = None) -> None:
        self.commands.append(sql)
        created = re.search(r"^CREATE TABLE IF NOT EXISTS (\w+)", sql, re.MULTILINE)
        if created:
            self.tables.setdefault(created.group(1), "TTL toDateTime(ts) + toIntervalDay(90)")

    def query(self, sql: str, params: Mapping[str, Any] | None = None) -> Result:
        if "name = 'schema_migrations'" in sql:
            return Result(("c",), ("UInt64",), [("schema_migrations" in self.tables,)])
        if "FROM schema_migrations" in sql:
            return Result(("v", "c"), ("UInt32", "String"), [(v, c) for v, _, c in self.ledger])
        return Result(("name", "engine_full"), ("String", "String"), list(self.tables.items()))

    def insert(
        self,
        table: str,
        columns: Sequence[str],
        rows: Sequence[Sequence[Any]],
        token: str | None = None,
    ) -> int:
        assert table == "schema_migrations"
        self.ledger.extend(tuple(r) for r in rows)
        return len(rows)

    def close(self) -> None:
        pass


def test_migrator_creates_the_database_and_ledger_on_the_cluster_once():
    server = FakeServer()
    applied = Migrator(server, 90, cluster="prod").migrate()
    assert len(applied) == len(load_migrations())
    assert server.commands[0] == "CREATE DATABASE IF NOT EXISTS `telemetry` ON CLUSTER 'prod'"
    assert server.commands[1].startswith(
        "CREATE TABLE IF NOT EXISTS schema_migrations_local ON CLUSTER"
    )
    assert all(" ON CLUSTER 'prod'" in c for c in server.commands)
    assert "Distributed('prod', 'telemetry', 'step_events_local'" in " ".join(server.commands)
    server.commands.clear()
    assert Migrator(server, 90, cluster="prod").migrate() == []
    assert server.commands == []  # nothing waits on every host when nothing is pending


def test_migrator_changes_the_ttl_of_the_local_raw_tables():
    server = FakeServer()
    migrator = Migrator(server, 90, cluster="prod")
    migrator.migrate()
    server.commands.clear()
    migrator = Migrator(server, 30, cluster="prod")
    migrator.migrate()
    assert sorted(migrator.ttl_changed) == [
        "gpu_samples",
        "port_samples",
        "sender_seqs",
        "step_events",
    ]
    assert all(
        c.startswith("ALTER TABLE ") and "_local ON CLUSTER 'prod' MODIFY TTL" in c
        for c in server.commands
    )


def test_the_embedded_store_has_no_cluster_form():
    server = FakeServer()
    server.backend = "chdb"
    with pytest.raises(ConfigError, match="embedded store is one node"):
        Migrator(server, cluster="prod")
    Migrator(server)  # single node: as before


def test_cluster_setting_explicit_over_env_over_default():
    assert Settings.load(env={}).clickhouse_cluster == ""
    env = {"STEPWATCH_CLICKHOUSE_CLUSTER": "prod"}
    assert Settings.load(env=env).clickhouse_cluster == "prod"
    assert Settings.load(env=env, clickhouse_cluster="other").clickhouse_cluster == "other"


def test_server_clients_insert_in_the_foreground_on_a_cluster(monkeypatch):
    import clickhouse_connect

    from stepwatch.exporters.clickhouse.access import open_server

    seen: list[dict[str, Any]] = []

    class Client:
        database = ""

        def command(self, *args: Any, **kwargs: Any) -> None:
            pass

    def get_client(**kwargs: Any) -> Client:
        seen.append(kwargs)
        return Client()

    monkeypatch.setattr(clickhouse_connect, "get_client", get_client)
    base = Settings.load(env={}, clickhouse_url="http://ch:8123")
    open_server(base)
    open_server(base.replace(clickhouse_cluster="prod"))
    assert "settings" not in seen[0]
    assert seen[1]["settings"] == dict(CLIENT_SETTINGS)
    assert CLIENT_SETTINGS["distributed_foreground_insert"] == 1

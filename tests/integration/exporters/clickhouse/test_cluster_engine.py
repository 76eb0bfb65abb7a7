"""The cluster form of the schema on the real ClickHouse engine (chdb).

No ClickHouse server or Keeper runs here, so: the engine's own parser reads and
formats every statement back; and a chdb process configured with a two-shard
cluster (``remote_servers``; both shards are that process, so a query on a Distributed
table plans as on two servers, and a second Distributed table in an IN or a JOIN must
be GLOBAL), ``{shard}``/``{replica}`` macros and the engine's
in-memory test keeper creates every table and view of the cluster form (without
``ON CLUSTER``: the embedded engine runs no distributed DDL queue).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap

import pytest

from stepwatch.exporters.clickhouse import queries
from stepwatch.exporters.clickhouse.chdb_backend import ChdbStore
from stepwatch.exporters.clickhouse.cluster import Cluster
from stepwatch.exporters.clickhouse.migrations import LEDGER_DDL, load_migrations
from tests.support import paths

ROOT = paths.ROOT


def cluster_statements(cluster: Cluster) -> list[str]:
    out = cluster.statements(LEDGER_DDL.strip())
    for migration in load_migrations():
        out += migration.statements({"raw_ttl_days": 90}, cluster)
    return out


def literal(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


@pytest.fixture()
def store(tmp_path):
    s = ChdbStore(str(tmp_path / "chdb"))
    yield s
    s.close()


def test_every_cluster_statement_parses_and_formats_back(store):
    cluster = Cluster("prod")
    statements = [cluster.create_database(), *cluster_statements(cluster)]
    for statement in statements:
        formatted = store.query(f"SELECT formatQuery({literal(statement)})").scalar()
        again = store.query(f"SELECT formatQuery({literal(formatted)})").scalar()
        assert formatted == again, statement  # the canonical text is a fixed point
        assert "ON CLUSTER prod" in formatted
        if formatted.startswith("CREATE TABLE") and "ENGINE = Distributed" not in formatted:
            assert "ENGINE = Replicated" in formatted and "'{replica}'" in formatted


_ENGINE_RUN = """
import json, os, sys
from chdb import session
from stepwatch.exporters.clickhouse.cluster import Cluster
from stepwatch.exporters.clickhouse.migrations import LEDGER_DDL, load_migrations

path, config = sys.argv[1], sys.argv[2]
cluster = Cluster("c", "d")
s = session.Session(f"{path}?config-file={config}")
s.query("CREATE DATABASE IF NOT EXISTS d")
s.query("USE d")
statements = cluster.statements(LEDGER_DDL.strip())
for migration in load_migrations():
    statements += migration.statements({"raw_ttl_days": 90}, cluster)
for statement in statements:
    if statement.lstrip().startswith("ALTER") or "\\nALTER TABLE" in statement:
        if "_local ON CLUSTER" in statement:
            continue  # an ALTER of a replicated table needs a live replica (a server)
    s.query(statement.replace(" ON CLUSTER 'c'", ""))
rows = s.query("SELECT name, engine, dependencies_table, create_table_query FROM system.tables "
               "WHERE database = 'd' ORDER BY name", "JSONCompact").bytes()
count = s.query("SELECT count() FROM d.step_events FINAL", "CSV").bytes()
replicas = s.query("SELECT table, zookeeper_path, replica_name FROM system.replicas "
                   "WHERE database = 'd'", "JSONCompact").bytes()
# every saved query through the Distributed tables, with the cluster's client settings
import time
from stepwatch.exporters.clickhouse import queries
from stepwatch.exporters.clickhouse.cluster import CLIENT_SETTINGS
for key, value in CLIENT_SETTINGS.items():
    s.query(f"SET {key} = {value!r}")
failed = {}
for name, saved in sorted(queries.registry().items()):
    try:
        s.query(saved.sql, "JSONCompact", params=saved.bind(
            {"job": "j"} if saved.param("job") else {}, now=time.time()))
    except Exception as err:
        failed[name] = str(err)
sys.stdout.write(json.dumps({"tables": json.loads(rows)["data"], "count": count.decode(),
                             "replicas": json.loads(replicas)["data"], "queries": failed}))
sys.stdout.flush()
os._exit(0)  # the embedded engine's shutdown with a keeper session can hang
"""

_CONFIG = """
<clickhouse>
  <tcp_port>9000</tcp_port>
  <zookeeper><implementation>testkeeper</implementation></zookeeper>
  <remote_servers><c><shard><internal_replication>true</internal_replication>
    <replica><host>localhost</host><port>9000</port></replica></shard>
    <shard><internal_replication>true</internal_replication>
    <replica><host>localhost</host><port>9000</port></replica></shard></c></remote_servers>
  <macros><shard>01</shard><replica>r1</replica></macros>
</clickhouse>
"""


def engine_run(tmp_path) -> dict:
    """The cluster form built in a chdb process (see _ENGINE_RUN): what it holds."""
    config = tmp_path / "config.xml"
    config.write_text(textwrap.dedent(_CONFIG))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.run(
        [sys.executable, "-c", _ENGINE_RUN, str(tmp_path / "db"), str(config)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=ROOT,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads(run.stdout)  # type: ignore[no-any-return]


def test_the_engine_creates_the_cluster_schema(tmp_path):
    result = engine_run(tmp_path)
    tables = {name: (engine, deps, ddl) for name, engine, deps, ddl in result["tables"]}
    assert result["count"].strip() == "0"  # a read through a Distributed table, FINAL included
    for name, (engine, _, ddl) in tables.items():
        if name.endswith("_local"):
            assert engine.startswith("Replicated") and engine.endswith("MergeTree"), name
            assert f"('/clickhouse/tables/{{shard}}/d/{name}', '{{replica}}'" in ddl
        elif engine == "Distributed":
            assert f"Distributed('c', 'd', '{name}_local', cityHash64(" in ddl
            assert name + "_local" in tables
        else:
            assert engine == "MaterializedView" and " TO d." in ddl and "_local" in ddl, name
    replicas = {table: (path, replica) for table, path, replica in result["replicas"]}
    assert set(replicas) == {name for name in tables if name.endswith("_local")}
    assert replicas["step_events_local"] == ("/clickhouse/tables/01/d/step_events_local", "r1")
    assert sorted(tables["step_events_local"][1]) == ["rank_placement_mv", "step_rollup_1m_mv"]
    assert tables["gpu_samples_local"][1] == ["gpu_rollup_1m_mv"]
    assert tables["port_samples_local"][1] == ["port_rollup_1m_mv"]
    # the column ALTERs reached the Distributed tables
    assert "`cpu_wait_s` Nullable(Float32)" in tables["step_events"][2]
    assert "`producer` LowCardinality(String)" in tables["detections"][2]


# a column that a later migration's ALTER adds: the embedded engine cannot add it to the
# replicated ``_local`` tables (see _ENGINE_RUN), only a server can
_ADDED = re.compile(r"ADD COLUMN IF NOT EXISTS (\w+)")
_UNRESOLVED = re.compile(
    r"Identifier '__table\d+\.(\w+)' cannot be resolved from table with name __table\d+ "
    r"\(an alias of (\w+)_local\)"
)


def test_every_saved_query_runs_through_the_distributed_tables(tmp_path):
    """Saved queries run unchanged on the cluster form: on the Distributed tables of two
    shards, with the cluster's client settings. Without ``distributed_product_mode =
    'global'`` goodput_mfu, job_timeline and lemon_nodes fail here (a double-distributed
    IN or JOIN). A query may fail only for a column a migration's ALTER adds, which the
    embedded engine cannot add to the replicated tables (a server does: ``ALTER ... ON
    CLUSTER``)."""
    added = {c for m in load_migrations() for c in _ADDED.findall(m.sql)}
    failed = engine_run(tmp_path)["queries"]
    for name, error in failed.items():
        unresolved = _UNRESOLVED.search(error)
        assert unresolved and unresolved.group(1) in added, (name, error[:500])
    ran = set(queries.registry()) - set(failed)
    assert {"goodput_mfu", "lemon_nodes", "rank_step_percentiles", "gpu_errors"} <= ran


def test_db_migrate_cluster_refuses_the_embedded_store(tmp_path, capsys):
    from stepwatch.cli import main

    assert main(["db", "migrate", "--store-path", str(tmp_path / "s"), "--cluster", "prod"]) == 1
    assert "embedded store is one node" in capsys.readouterr().err

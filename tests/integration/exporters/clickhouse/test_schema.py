"""The schema on the real ClickHouse engine (chdb): migrations, types, dedup, rollups."""

from __future__ import annotations

import pytest

from stepwatch.contract import Phases, StepMessage, StepRecord, encode
from stepwatch.errors import StoreError
from stepwatch.exporters.clickhouse import rows as R
from stepwatch.exporters.clickhouse.chdb_backend import ChdbStore
from stepwatch.exporters.clickhouse.migrations import Migrator, load_migrations
from stepwatch.exporters.clickhouse.prepare import Preparer, Record

T0 = 1767225600.0


@pytest.fixture()
def store(tmp_path):
    s = ChdbStore(str(tmp_path / "chdb"))
    Migrator(s, raw_ttl_days=20000).migrate()
    yield s
    s.close()


def tables(store: ChdbStore) -> dict[str, str]:
    result = store.query(
        "SELECT name, create_table_query FROM system.tables WHERE database = currentDatabase()"
    )
    return dict(result.rows)


def step_rows(seq: int, ranks: int = 4) -> list[tuple]:
    msg = StepMessage(
        host="h",
        ts=T0 + seq,
        inst="i",
        seq=seq,
        job_id="j",
        steps=[
            StepRecord(
                job_id="j",
                rank=r,
                world_size=ranks,
                step=seq,
                start=T0 + seq,
                end=T0 + seq + 1,
                phases=Phases(forward=0.4, backward=0.4),
                tokens=100,
            )
            for r in range(ranks)
        ],
    )
    return Preparer().prepare([Record("t", 0, seq, encode(msg))]).tables["step_events"].rows


def test_migrate_twice_is_a_no_op(store):
    before = tables(store)
    assert Migrator(store, raw_ttl_days=20000).migrate() == []
    assert tables(store) == before
    ledger = store.query(
        "SELECT version, count() FROM schema_migrations GROUP BY version ORDER BY version"
    )
    assert ledger.rows == [(m.version, 1) for m in load_migrations()]
    assert all(s.applied and s.checksum_ok for s in Migrator(store).status())


def test_tables_match_the_row_builders_column_for_column(store):
    for table in R.TABLES.values():
        result = store.query(
            "SELECT name, type FROM system.columns "
            "WHERE database = currentDatabase() AND table = {t:String} "
            "ORDER BY position",
            {"t": table.name},
        )
        assert tuple(result.rows) == table.columns, table.name


def test_engines_keys_ttl_and_codecs(store):
    result = store.query(
        "SELECT name, engine, sorting_key, partition_key FROM system.tables "
        "WHERE database = currentDatabase()"
    )
    info = {r[0]: r[1:] for r in result.rows}
    assert info["step_events"] == (
        "ReplacingMergeTree",
        "job_id, step, rank, host, inst, seq",
        "toYYYYMM(start_ts)",
    )
    assert info["step_rollup_1m"][0] == "AggregatingMergeTree"
    assert info["gpu_rollup_1m_mv"][0] == "MaterializedView"
    codecs = dict(
        store.query(
            "SELECT name, compression_codec FROM system.columns WHERE database = currentDatabase() "
            "AND table = 'step_events'"
        ).rows
    )
    assert (
        codecs["step"] == "CODEC(DoubleDelta, ZSTD(1))"
        and codecs["start_ts"] == "CODEC(Delta(8), ZSTD(1))"
    )
    lowcard = store.query(
        "SELECT type FROM system.columns WHERE database = currentDatabase() "
        "AND table = 'step_events' AND name IN ('host', 'job_id')"
    ).column("type")
    assert lowcard == ["LowCardinality(String)"] * 2
    assert Migrator(store, raw_ttl_days=20000).current_ttl() == dict.fromkeys(
        ("step_events", "gpu_samples", "port_samples", "sender_seqs"), 20000
    )


def test_ttl_follows_the_setting(store):
    assert set(Migrator(store, raw_ttl_days=30).ensure_ttl()) == {
        "step_events",
        "gpu_samples",
        "port_samples",
        "sender_seqs",  # the sink's accepted sender numbers live as long as the raw rows
    }
    assert set(Migrator(store, raw_ttl_days=30).current_ttl().values()) == {30}
    assert Migrator(store, raw_ttl_days=30).ensure_ttl() == []


def test_a_repeated_insert_token_is_dropped_by_table_and_rollup(store):
    rows = step_rows(0)
    for _ in range(3):
        store.insert("step_events", R.STEPS.names, rows, token="g|t|0|0-0|step_events")
    store.insert("step_events", R.STEPS.names, step_rows(1), token="g|t|0|1-1|step_events")
    assert store.query("SELECT count() FROM step_events").scalar() == 8
    rollup = store.query("SELECT sum(rank_steps), sum(tokens) FROM step_rollup_1m").rows
    assert rollup == [(8, 800)]
    assert store.query("SELECT sum(rank_steps) FROM rank_placement").scalar() == 8


def test_an_upstream_duplicate_collapses_with_final(store):
    rows = step_rows(0)
    store.insert("step_events", R.STEPS.names, rows, token="a")
    store.insert("step_events", R.STEPS.names, rows[:1], token="b")  # same message delivered twice
    assert store.query("SELECT count() FROM step_events").scalar() == 5
    assert store.query("SELECT count() FROM step_events FINAL").scalar() == 4


def test_readonly_store_refuses_writes_and_one_path_per_process(store, tmp_path):
    reader = ChdbStore(store.path, readonly=True)
    try:
        assert reader.query("SELECT count() FROM schema_migrations").scalar() >= 4
        with pytest.raises(StoreError, match="readonly"):
            reader.command("DROP TABLE events")
    finally:
        reader.close()
    with pytest.raises(StoreError, match="one path per process"):
        ChdbStore(str(tmp_path / "other"))


def test_db_cli_migrates_once_and_reports_status(tmp_path, capsys):
    from stepwatch.cli import main

    path = ["--store-path", str(tmp_path / "cli")]
    assert main(["db", "migrate", *path]) == 0
    assert "0001_raw_tables" in capsys.readouterr().out
    assert main(["db", "migrate", *path, "--raw-ttl-days", "30"]) == 0
    out = capsys.readouterr().out
    assert "nothing to do" in out and "TTL set to 30 days" in out
    assert main(["db", "status", *path]) == 0
    status = capsys.readouterr().out
    assert "0004_ops_tables: applied" in status and "PENDING" not in status
    assert "step_events" in status and "schema_migrations" in status

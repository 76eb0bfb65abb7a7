"""Migration files: naming, splitting, placeholders, and that none destroys data."""

from __future__ import annotations

from pathlib import Path

import pytest

from stepwatch.errors import StoreError
from stepwatch.exporters.clickhouse.migrations import (
    check_non_destructive,
    load_migrations,
    render,
    split_statements,
)


def test_shipped_migrations_load_in_order_and_are_idempotent_ddl():
    migrations = load_migrations()
    assert [m.version for m in migrations] == list(range(1, len(migrations) + 1))
    for m in migrations:
        for statement in m.statements({"raw_ttl_days": 90}):
            head = " ".join(statement.split()[:6]).upper()
            if head.startswith("CREATE"):
                assert "IF NOT EXISTS" in head, (m.name, head)
            assert "{{" not in statement


@pytest.mark.parametrize(
    "statement",
    [
        "DROP TABLE step_events",
        "drop   table IF EXISTS gpu_samples",
        "TRUNCATE TABLE events",
        "ALTER TABLE events DELETE WHERE ts < now()",
        "ALTER TABLE events DROP COLUMN detail",
        "ALTER TABLE events DROP PARTITION 202601",
        "RENAME TABLE events TO old_events",
        "DROP DATABASE stepwatch",
    ],
)
def test_destructive_statements_are_refused(statement):
    with pytest.raises(StoreError, match="destroy data"):
        check_non_destructive(statement, "0099_bad")


def test_comments_and_views_are_not_destructive():
    check_non_destructive("-- we never DROP TABLE here\nCREATE TABLE IF NOT EXISTS x (a UInt8)")
    check_non_destructive("DROP VIEW IF EXISTS step_rollup_1m_mv")


def test_a_destructive_file_is_refused_at_load(tmp_path: Path):
    (tmp_path / "0001_ok.sql").write_text(
        "CREATE TABLE IF NOT EXISTS a (x UInt8) ENGINE = Memory;\n"
    )
    (tmp_path / "0002_oops.sql").write_text("TRUNCATE TABLE a;\n")
    with pytest.raises(StoreError, match="destroy data"):
        load_migrations(tmp_path)


def test_gaps_and_bad_names_are_refused(tmp_path: Path):
    (tmp_path / "0001_a.sql").write_text("SELECT 1;\n")
    (tmp_path / "0003_c.sql").write_text("SELECT 1;\n")
    with pytest.raises(StoreError, match="without gaps"):
        load_migrations(tmp_path)
    (tmp_path / "0003_c.sql").unlink()
    (tmp_path / "2_b.sql").write_text("SELECT 1;\n")
    with pytest.raises(StoreError, match="NNNN_name"):
        load_migrations(tmp_path)


def test_split_statements_keeps_multiline_statements_and_drops_comment_chunks():
    sql = "-- header\n\nCREATE TABLE a\n(\n  x UInt8\n);\n-- between\nSELECT 1;\n-- trailing\n"
    assert split_statements(sql) == [
        "-- header\n\nCREATE TABLE a\n(\n  x UInt8\n)",  # comments stay with their statement
        "-- between\nSELECT 1",
    ]


def test_render_fills_placeholders_and_refuses_unknown_ones():
    assert (
        render("TTL x + INTERVAL {{raw_ttl_days}} DAY", {"raw_ttl_days": 7})
        == "TTL x + INTERVAL 7 DAY"
    )
    with pytest.raises(StoreError, match="no value"):
        render("{{missing}}", {})


def test_checksum_ignores_comments_and_layout_but_not_statements():
    from stepwatch.exporters.clickhouse.migrations import Migration

    base = Migration(1, "a", "CREATE TABLE IF NOT EXISTS a (x UInt8) ENGINE = Memory;\n")
    commented = Migration(
        1, "a", "-- why\nCREATE TABLE IF NOT EXISTS a\n  (x UInt8)   ENGINE = Memory; -- note\n"
    )
    changed = Migration(1, "a", "CREATE TABLE IF NOT EXISTS a (x UInt16) ENGINE = Memory;\n")
    assert base.checksum == commented.checksum != changed.checksum

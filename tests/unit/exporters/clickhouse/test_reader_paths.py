"""A reader pointed at a directory that holds no store says so and leaves it untouched."""

from __future__ import annotations

import pytest

from stepwatch.errors import StoreError
from stepwatch.exporters.clickhouse.chdb_backend import ChdbStore


@pytest.mark.parametrize("content", [[], ["spool-000001.jsonl"]])
def test_a_read_only_open_of_a_directory_without_a_store_writes_nothing(tmp_path, content):
    """Before, the engine opened it and left ``tmp/`` and ``user_files/`` behind (an agent's
    spool directory given by mistake, say)."""
    for name in content:
        (tmp_path / name).write_text("x")
    with pytest.raises(StoreError, match=r"no store at .*run `stepwatch db migrate` first"):
        ChdbStore(str(tmp_path), readonly=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == content


def test_a_missing_directory_is_no_store(tmp_path):
    with pytest.raises(StoreError, match="no store at"):
        ChdbStore(str(tmp_path / "absent"), readonly=True)
    assert not (tmp_path / "absent").exists()

"""The saved query ``goodput_mfu`` on a run with one host whose clock is off.

The run (tests/support/sim_store: 4 nodes, 32 ranks, 160 steps) is loaded into the
embedded store through the sink's row mapping, once with true clocks and once with
one host of four stamping everything a minute behind or ahead. Before, the job's
window ran from the earliest start to the latest end in the per-minute rollup, so
it took the offset in: a fifth bucket, 281 s of wall time instead of 221 s, and
the run's goodput 0.71 instead of 0.90.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from stepwatch.exporters.clickhouse import queries
from stepwatch.exporters.clickhouse.chdb_backend import ChdbStore
from tests.support import sim_store

pytestmark = pytest.mark.integration


def buckets(
    path: Path, offsets: dict[str, float] | None = None, drop: str = "", since: float = 0.0
) -> list[dict]:
    """``goodput_mfu``'s rows for the run loaded at ``path``; ``drop``: a statement run
    first (raw rows gone, as their shorter TTL drops them before the rollups')."""
    sim_store.fill(path, offsets=offsets)
    store = ChdbStore(str(path))
    try:
        if drop:
            store.command(drop)
        saved = queries.get("goodput_mfu")
        params = saved.bind({"since": repr(since), "job": sim_store.JOB}, now=time.time())
        return store.query(saved.sql, params).dicts()
    finally:
        store.close()


def overall(rows: list[dict]) -> tuple[float, float]:
    """The run's wall seconds and goodput, from its buckets."""
    wall = sum(r["wall_s"] for r in rows)
    return wall, sum(r["goodput"] * r["wall_s"] for r in rows) / wall


@pytest.fixture(scope="module")
def true_clocks(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    return buckets(tmp_path_factory.mktemp("chdb") / "true")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("offset", [-60.0, 60.0])
def test_a_host_whose_clock_is_off_does_not_widen_the_job(
    tmp_path: Path, true_clocks: list[dict], offset: float
) -> None:
    """The job's first start and last end are read on the median rank's clock (its edge
    steps' medians over ranks): the same buckets and wall time as with true clocks. The
    skewed host's rank-seconds still fall in the minutes of its own clock (the rollup
    keeps no clock per host), so the edge buckets' goodput moves: the run's is within
    0.07 of true clocks' (0.84 and 0.88 against 0.90)."""
    rows = buckets(tmp_path / "chdb", {"node0002": offset})
    assert [r["bucket"] for r in rows] == [r["bucket"] for r in true_clocks]
    wall, goodput = overall(rows)
    true_wall, true_goodput = overall(true_clocks)
    assert wall == pytest.approx(true_wall, rel=0.005)
    assert goodput == pytest.approx(true_goodput, abs=0.07)


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "drop",
    ["TRUNCATE TABLE step_events", "ALTER TABLE step_events DELETE WHERE step < 80"],
    ids=["all", "the-first-half"],
)
def test_without_raw_rows_the_window_comes_from_the_rollup(
    tmp_path: Path, true_clocks: list[dict], drop: str
) -> None:
    """The raw step rows expire before the rollups (90 days against two years): an end
    of the job without them is the rollup's earliest start or latest end, as before. (In
    review, with the first half gone, the last steps stood in for the first ones: one
    bucket of 9 s.)"""
    rows = buckets(tmp_path / "chdb", drop=drop)
    assert [r["bucket"] for r in rows] == [r["bucket"] for r in true_clocks]
    assert all(r["steps"] for r in rows)
    assert overall(rows)[0] == pytest.approx(overall(true_clocks)[0], abs=1.0)


@pytest.mark.timeout(300)
def test_since_within_a_minute_keeps_the_rest_of_the_job(
    tmp_path: Path, true_clocks: list[dict]
) -> None:
    """``since`` 90.5 s into the run (``-p since=6h`` lands anywhere in a minute): the
    buckets from its minute on, as with ``since`` 0. (In review, the raw rows were cut
    at ``since`` and the rollup at its minute: the job's last steps stood in for its
    first ones, one bucket of 9 s.)"""
    rows = buckets(tmp_path / "chdb", since=sim_store.T0 + 90.5)  # the run starts at T0
    assert [r["bucket"] for r in rows] == [r["bucket"] for r in true_clocks[1:]]
    assert [r["wall_s"] for r in rows[1:]] == [r["wall_s"] for r in true_clocks[2:]]
    assert rows[0]["wall_s"] == pytest.approx(60.0, abs=1.0)

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
from collections.abc import Sequence
from pathlib import Path

import pytest

from stepwatch.exporters.clickhouse import queries
from stepwatch.exporters.clickhouse.chdb_backend import ChdbStore
from stepwatch.sim import Scenario, simulate
from tests.support import sim_store

pytestmark = pytest.mark.integration


def buckets(
    path: Path,
    offsets: dict[str, float] | None = None,
    drop: str = "",
    since: float = 0.0,
    runs: Sequence[Scenario] | None = None,
) -> list[dict]:
    """``goodput_mfu``'s rows for the run loaded at ``path`` (``runs``: a job's runs, else
    sim_store's); ``drop``: a statement run first (raw rows gone, as their shorter TTL
    drops them before the rollups')."""
    sim_store.fill(path, runs, offsets=offsets)
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


@pytest.mark.timeout(300)
def test_a_restart_on_fewer_ranks_that_ends_lower_keeps_its_last_run(tmp_path: Path) -> None:
    """A job of 4 nodes runs steps 0-149, and 2 minutes later restarts on 2 nodes from
    step 100 to 139 (no GPU samples: the steps alone give its end). Its last end is the
    last run's, over that run's 16 ranks: the window reaches it. (In review, the ranks
    of both runs were mixed in one median: the window ended between the two runs' ends,
    its last two buckets gone.)"""
    first = Scenario(
        seed=1, job_id=sim_store.JOB, nodes=4, steps=150, start_ts=sim_store.T0, with_gpu=False
    )
    first_end = max(m.ts for m in simulate(first))
    again = Scenario(
        seed=2,
        job_id=sim_store.JOB,
        nodes=2,
        steps=140,
        first_step=100,
        incarnation=1,
        start_ts=first_end + 120.0,
        with_gpu=False,
    )
    last_end = max(r.end for m in simulate(again) for r in getattr(m, "steps", ()))
    rows = buckets(tmp_path / "chdb", runs=[first, again])
    start = min(r.start for m in simulate(first) for r in getattr(m, "steps", ()))
    assert overall(rows)[0] == pytest.approx(last_end - start, abs=1.0)

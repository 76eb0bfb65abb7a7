"""The report and the stream worker agree on a recorded run: step time and goodput categories.

The run (simulated: a 30 % GPU straggler from step 40 of 160, checkpoints) goes
through the detection core as a stream worker runs it, and through the sink's
row mapping into the embedded store, which the report reads. Both use
stepwatch.contract.goodput, so the numbers must match within what the two
vantage points can differ by (the worker's recent window and its own
straggler-free baseline vs the report's whole run and its detection windows).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from stepwatch.contract.goodput import PRODUCTIVE, Badput
from stepwatch.contract.records import StepMessage
from stepwatch.exporters.clickhouse.chdb_backend import ChdbStore
from stepwatch.report.data import ReportData, load
from stepwatch.report.goodput import CATEGORIES, Breakdown, breakdown
from stepwatch.sim import simulate
from stepwatch.streams.core import Engine
from tests.support import sim_store

pytestmark = pytest.mark.integration


SLACK = 5.0  # the worker is ticked this long after the last step end, so the last steps close


def worker_stats():
    msgs = sorted(simulate(sim_store.scenario()), key=lambda m: m.ts)
    engine = Engine()
    for m in msgs:
        engine.process(m)
    last_end = max(r.end for m in msgs if isinstance(m, StepMessage) for r in m.steps)
    engine.tick(last_end + SLACK)
    [stats] = engine.stats()
    return stats


def stored(path: Path, offsets: dict[str, float] | None = None) -> ReportData:
    """The run as the report reads it from a store filled at ``path``."""
    sim_store.fill(path, offsets=offsets)
    store = ChdbStore(str(path), readonly=True)
    try:
        return load(store, sim_store.JOB)
    finally:
        store.close()


def report_of(path: Path, offsets: dict[str, float] | None = None) -> Breakdown:
    data = stored(path, offsets)
    return breakdown(data.steps, data.detections, data.events)


@pytest.fixture(scope="module")
def true_clocks(tmp_path_factory: pytest.TempPathFactory) -> Breakdown:
    return report_of(tmp_path_factory.mktemp("chdb") / "true")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("offset", [-60.0, 60.0])
def test_a_host_whose_clock_is_off_changes_neither_wall_time_nor_goodput(
    tmp_path: Path, true_clocks: Breakdown, offset: float
) -> None:
    """One host of four stamps its records a minute behind (or ahead of) the others. The
    report reads each step's start and end on the median rank's clock, as the worker
    does: the run's wall time and its split stay those of true clocks. (Before, the
    span from the earliest start to the latest end took the offset in: 60 s more wall
    time, 32 ranks x 60 s of ``other``.)"""
    off = report_of(tmp_path / "chdb", {"node0002": offset})
    assert off.available_s == pytest.approx(true_clocks.available_s, rel=0.005)
    assert off.step_s == pytest.approx(true_clocks.step_s, rel=0.01)
    for kind in CATEGORIES:
        assert off.fraction(kind) == pytest.approx(true_clocks.fraction(kind), abs=0.005), kind


@pytest.mark.timeout(300)
def test_report_and_worker_agree_on_step_time_and_goodput(tmp_path) -> None:
    data = stored(tmp_path / "chdb")
    report = breakdown(data.steps, data.detections)
    worker = worker_stats()
    # the step time: the median wall time, straggler wait included (not the 1.0 s baseline)
    assert worker.step_seconds_median == pytest.approx(1.27, abs=0.04)
    assert report.step_s == pytest.approx(worker.step_seconds_median, rel=0.03)
    assert report.baseline_s is not None and worker.step_seconds_baseline is not None
    assert report.baseline_s == pytest.approx(worker.step_seconds_baseline, rel=0.05)
    # the same categories, and the same split within a few points
    assert set(worker.badput_seconds) | {PRODUCTIVE} == set(CATEGORIES)
    wall = report.available_s / max(int(s["world"]) for s in data.steps)  # the run's wall time
    productive = worker.goodput_ratio * (wall + SLACK)  # the worker's wall: up to its last tick
    assert productive / wall == pytest.approx(report.goodput, abs=0.03)
    for kind in (Badput.STRAGGLER, Badput.CHECKPOINT, Badput.DATA_LOADING):
        assert worker.badput_seconds[kind] / wall == pytest.approx(
            report.fraction(kind), abs=0.03
        ), kind
    assert report.fraction(Badput.STRAGGLER) > 0.1  # a 30 % straggler for 3/4 of the run

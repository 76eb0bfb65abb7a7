"""The report's goodput of a restarted job and of checkpoints saved between steps, from a
real embedded store.

The job (8 ranks on two hosts, 1 s steps): run 1 does steps 0..39, saving a checkpoint
between steps after step 19 (the torch example's way: outside any step, a
``checkpoint_save`` event with ``duration_s`` and ``start`` is all the store has); the job
is down 12 s, then run 2 restarts from the checkpoint at step 30 on a new allocation and
does steps 30..59. Steps 30..39 ran twice.
"""

from __future__ import annotations

import pytest

from stepwatch.contract.goodput import PRODUCTIVE, Badput
from stepwatch.exporters.clickhouse.chdb_backend import ChdbStore
from stepwatch.exporters.clickhouse.migrations import Migrator
from stepwatch.report.data import ReportData, load
from stepwatch.report.goodput import breakdown
from stepwatch.report.html import goodput_table

pytestmark = pytest.mark.integration

JOB = "restarted"
WORLD = 8
T0 = 1767225600.0  # 2026-01-01T00:00:00Z
SAVE_AFTER, SAVE_S = 19, 3.0  # a 3 s save after step 19, between steps
OUTAGE_S = 12.0
RUN1_END = T0 + 40 + SAVE_S
RUN2_START = RUN1_END + OUTAGE_S
STEP_COLUMNS = (
    "job_id", "step", "rank", "world_size", "host", "local_rank", "gpu", "peer_group",
    "start_ts", "end_ts", "duration_s", "data_s", "compute_s", "comm_wait_s", "samples",
    "tokens", "timing", "inst", "seq",
)  # fmt: skip
EVENT_COLUMNS = ("ts", "job_id", "host", "type", "rank", "detail", "attrs", "inst", "seq")


def run_steps(hosts: tuple[str, str], steps: range, t0: float, save_after: int = -1) -> list:
    rows = []
    for i, step in enumerate(steps):
        start = t0 + i + (SAVE_S if step > save_after >= 0 else 0.0)
        for rank in range(WORLD):
            host = hosts[rank // 4]
            row = (JOB, step, rank, WORLD, host, rank % 4, rank % 4, "all", start, start + 1.0)
            rows.append((*row, 1.0, 0.0, 0.9, 0.1, 8, 1024, "wall", f"i-{host}", int(start)))
    return rows


def events() -> list[tuple]:
    save_start = T0 + SAVE_AFTER + 1
    attrs = {"duration_s": str(SAVE_S), "start": str(save_start), "step": "20"}
    restart = {"step": "30", "incarnation": "1"}
    return [
        (T0 - 5, JOB, "n1", "job_start", 0, "started", {}, "i-n1", 1000),
        (save_start + SAVE_S, JOB, "n1", "checkpoint_save", 0, "save", attrs, "i-n1", 1001),
        (RUN2_START - 2, JOB, "n1", "job_start", 0, "started", {}, "i-n1", 1002),
        (RUN2_START - 1, JOB, "n1", "restart", 0, "restarted", restart, "i-n1", 1003),
    ]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> ReportData:
    store = ChdbStore(str(tmp_path_factory.mktemp("restarts") / "chdb"))
    try:
        Migrator(store, raw_ttl_days=20000).migrate()
        steps = run_steps(("n1", "n2"), range(40), T0, SAVE_AFTER)
        steps += run_steps(("n1", "n3"), range(30, 60), RUN2_START)
        store.insert("step_events", STEP_COLUMNS, steps, token="restarts|steps")
        store.insert("events", EVENT_COLUMNS, events(), token="restarts|events")
        return load(store, JOB)
    finally:
        store.close()


def test_the_outage_between_runs_is_restart_time(data: ReportData) -> None:
    """Steps 30..39 of the two runs are rows of their own: none spans the outage."""
    b = breakdown(data.steps, data.detections, data.events)
    assert b.seconds[Badput.RESTART] == pytest.approx(WORLD * OUTAGE_S, rel=1e-3)
    assert b.seconds[Badput.HANG] == 0
    assert b.seconds[Badput.WASTED_PROGRESS] == pytest.approx(WORLD * 10 * 1.0, rel=1e-3)
    assert b.seconds[PRODUCTIVE] == pytest.approx(WORLD * 60 * 1.0, rel=1e-3)
    assert b.available_s == pytest.approx(WORLD * (40 + SAVE_S + OUTAGE_S + 30), rel=1e-4)
    assert "restart / recovery after a disruption</td><td>96.0</td><td>14.1 %" in goodput_table(b)
    runs = [(s.get("run"), s["step"]) for s in data.steps]
    assert runs[38:42] == [(0, 38), (0, 39), (1, 30), (1, 31)]


def test_a_checkpoint_saved_between_steps_is_checkpoint_time(data: ReportData) -> None:
    b = breakdown(data.steps, data.detections, data.events)
    assert b.seconds[Badput.CHECKPOINT] == pytest.approx(WORLD * SAVE_S, rel=1e-3)
    assert b.seconds[Badput.OTHER] == pytest.approx(0.0, abs=0.1)

"""The report's goodput trusts a job's lifecycle events only from the job's own hosts.

Before: any host could write a ``restart`` or ``checkpoint_save`` naming the job, and the
report turned the job's hang into restart or checkpoint time. The job (8 ranks on two
hosts, 1 s steps) hangs 30 s after step 19 and goes on with step 20; an intruder host
that ran none of its steps sends a restart inside the hang and a 30 s checkpoint save
covering it. The same events from one of the job's hosts are believed (the control).
"""

from __future__ import annotations

import pytest

from stepwatch.contract.goodput import Badput
from stepwatch.exporters.clickhouse.chdb_backend import ChdbStore
from stepwatch.exporters.clickhouse.migrations import Migrator
from stepwatch.report.data import load
from stepwatch.report.goodput import breakdown
from tests.integration.report.test_restarts import EVENT_COLUMNS, STEP_COLUMNS, T0, WORLD

pytestmark = pytest.mark.integration

HANG_S = 30.0


def steps(job: str) -> list[tuple]:
    rows = []
    for step in range(40):
        start = T0 + step + (HANG_S if step >= 20 else 0.0)
        for rank in range(WORLD):
            host = ("n1", "n2")[rank // 4]
            row = (job, step, rank, WORLD, host, rank % 4, rank % 4, "all", start, start + 1.0)
            rows.append((*row, 1.0, 0.0, 0.9, 0.1, 8, 1024, "wall", f"i-{host}", int(start)))
    return rows


def claims(job: str, host: str) -> list[tuple]:
    hang = T0 + 20
    save = {"duration_s": str(HANG_S), "start": str(hang), "step": "20"}
    return [
        (hang + 10, job, host, "restart", 0, "restarted", {"step": "20"}, f"i-{host}", 1),
        (hang + HANG_S, job, host, "checkpoint_save", 0, "save", save, f"i-{host}", 2),
        (hang + 1, job, host, "xid", 0, "79", {}, f"i-{host}", 3),  # a fact of its own host
    ]


@pytest.mark.parametrize(("sender", "believed"), [("intruder", False), ("n1", True)])
def test_lifecycle_events_count_only_from_the_jobs_hosts(tmp_path, sender, believed) -> None:
    job = f"hung-{sender}"
    store = ChdbStore(str(tmp_path / "chdb"))
    try:
        Migrator(store, raw_ttl_days=20000).migrate()
        store.insert("step_events", STEP_COLUMNS, steps(job), token="s")
        store.insert("events", EVENT_COLUMNS, claims(job, sender), token="e")
        data = load(store, job)
    finally:
        store.close()
    b = breakdown(data.steps, data.detections, data.events)
    if believed:
        assert b.seconds[Badput.HANG] == 0
    else:
        assert b.seconds[Badput.HANG] == pytest.approx(WORLD * HANG_S, rel=1e-3)
        assert b.seconds[Badput.RESTART] == 0
        assert b.seconds[Badput.CHECKPOINT] == 0
        assert [e["type"] for e in data.events] == ["xid"]

"""`port_findings`: a port congested in several jobs is one row about the port."""

from __future__ import annotations

import pytest

from stepwatch.contract import DetectionMessage, encode
from stepwatch.exporters.clickhouse import queries
from stepwatch.exporters.clickhouse import rows as R
from stepwatch.exporters.clickhouse.chdb_backend import ChdbStore
from stepwatch.exporters.clickhouse.migrations import Migrator
from stepwatch.exporters.clickhouse.prepare import Preparer, Record

pytestmark = pytest.mark.integration
T0 = 1767225600.0


def det(
    id_: str,
    job: str,
    type_: str,
    host: str,
    device: str,
    port: int | None,
    state: str = "open",
    related: str = "",
    seq: int = 0,
) -> DetectionMessage:
    return DetectionMessage(
        host=host,
        ts=T0 + seq,
        id=id_,
        inst=id_,
        seq=seq,
        job_id=job,
        type=type_,
        state=state,
        step=10 + seq,
        first_step=10,
        opened_at=T0,
        cause="network",
        summary=f"{type_} on {host} {device} port {port}",
        device=device,
        port=port,
        related=related,
        score=0.5 + seq,
    )


def test_the_same_port_in_two_jobs_is_one_finding(tmp_path) -> None:
    store = ChdbStore(str(tmp_path / "chdb"))
    try:
        Migrator(store, raw_ttl_days=20000).migrate()
        msgs = [
            det("a", "job1", "network_congestion", "gpu-02", "mlx5_5", 1),
            det("a", "job1", "network_congestion", "gpu-02", "mlx5_5", 1, "resolved", seq=1),
            det("b", "job2", "network_congestion", "gpu-02", "mlx5_5", 1),
            det("c", "job2", "link_errors", "gpu-07", "mlx5_0", 1),
            det("d", "job2", "job_slowdown", "gpu-02", "mlx5_5", 1, related="b"),  # b's cost
            det("e", "job3", "straggler", "gpu-03", "", None),
        ]  # no port: not a port finding
        prepared = (
            Preparer()
            .prepare([Record("t.detections", 0, i, encode(m)) for i, m in enumerate(msgs)])
            .tables["detections"]
        )
        store.insert("detections", R.DETECTIONS.names, prepared.rows, token="t")
        saved = queries.get("port_findings")
        rows = store.query(saved.sql, saved.bind({"since": "0"}, now=T0 + 60)).dicts()
        assert [(r["host"], r["device"], r["port"], r["jobs"], r["detections"]) for r in rows] == [
            ("gpu-02", "mlx5_5", 1, 2, 3),
            ("gpu-07", "mlx5_0", 1, 1, 1),
        ]
        assert rows[0]["job_ids"] == ["job1", "job2"] and rows[0]["types"] == [
            "job_slowdown",
            "network_congestion",
        ]
        repeat = store.query(
            saved.sql, saved.bind({"since": "0", "min_jobs": "2"}, now=T0 + 60)
        ).dicts()
        assert [r["host"] for r in repeat] == ["gpu-02"]
    finally:
        store.close()

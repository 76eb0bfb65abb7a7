"""Simulator -> broker -> sink -> ClickHouse (chdb): every saved query gives the known answer.

The runs (store_testdata): gpu-03 is 10 % slow in jobA and jobB (the lemon),
NIC congestion on gpu-02 mlx5_5 in jobA, a link flap on gpu-06 mlx5_2 in jobB,
XID 79 on gpu-09 GPU 4 hanging jobC. The detections are the detection core's
(stepwatch.streams.core.Engine) on the same telemetry, published on the detections topic
as the stream workers publish them (the Faust workers themselves are not run).

A requeued job (jobR, written straight into a database of its own in the same store):
rank 5 slow on rq-node02, drained; the job restarts from its checkpoint at step 30
on rq-node01 and rq-node00, where rank 5 is healthy.
"""

from __future__ import annotations

import threading
import time

import pytest

from stepwatch.cli import main
from stepwatch.exporters.clickhouse import queries
from stepwatch.exporters.clickhouse.chdb_backend import ChdbStore
from stepwatch.exporters.clickhouse.kafka_source import KafkaSource
from stepwatch.exporters.clickhouse.migrations import Migrator
from stepwatch.exporters.clickhouse.sink import Sink, SinkConfig, sink_topics
from stepwatch.exporters.clickhouse.store import Result
from stepwatch.kafka import ensure_topics
from tests.support import store_testdata as D

NOW = D.T0 + 86400

REQUEUED = "jobR"
SLOW_RANK, SLOW_HOST, SPARE = 5, "rq-node02", "rq-node00"
RUN1 = ("rq-node01", SLOW_HOST)  # ranks 0-3, 4-7; steps 0..39
RUN2 = ("rq-node01", SPARE)  # steps 30..99, 12 s after run 1 ended
RUN2_START = D.T0 + 40 * 1.4 + 12
STEP_COLUMNS = (
    "job_id", "step", "rank", "world_size", "host", "local_rank", "gpu", "peer_group",
    "start_ts", "end_ts", "duration_s", "data_s", "comm_wait_s", "compute_s", "samples",
    "tokens", "timing", "inst", "seq",
)  # fmt: skip
DETECTION_COLUMNS = (
    "ts", "id", "job_id", "type", "state", "rank", "peer_group", "cause", "fault", "step",
    "first_step", "opened_at", "summary", "subject_host", "host", "inst", "seq",
)  # fmt: skip


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    """The three runs, through a real broker and the sink, in a chdb store."""
    from stepwatch.daemons.broker import DevBroker
    from stepwatch.settings import Settings

    work = tmp_path_factory.mktemp("pipeline")
    messages = D.messages()
    with DevBroker(log_path=str(work / "broker.log")) as broker:
        settings = Settings.load(
            env={},
            bootstrap_servers=broker.bootstrap,
            topic_prefix="p",
            partitions=4,
            store_path=str(work / "chdb"),
            kafka_config={"session.timeout.ms": "6000"},
        )
        ensure_topics(settings, sink_topics("p"))
        D.produce(broker.bootstrap, "p", messages)
        store = ChdbStore(settings.store_path)
        Migrator(store, raw_ttl_days=20000).migrate()
        sink = Sink(
            store,
            KafkaSource(settings, "it-pipeline"),
            sink_topics("p"),
            SinkConfig(batch_messages=2000, batch_seconds=0.3),
        )
        thread = threading.Thread(target=sink.run, daemon=True)
        thread.start()
        try:
            expected = D.expected_rows(messages)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and counts(store) != expected:
                time.sleep(0.3)
        finally:
            sink.stop()
            thread.join(15)
    yield store, messages, settings, sink
    store.close()


def requeue_steps() -> list[tuple]:
    """jobR's step rows: 8 ranks, 4 per host; run 1 with rank 5 30 % slow in compute (its
    peers wait for it), run 2 on a new allocation, all healthy."""
    rows: list[tuple] = []
    runs = ((RUN1, range(40), D.T0, 1.4), (RUN2, range(30, 100), RUN2_START, 1.05))
    for hosts, steps, t0, period in runs:
        for i, step in enumerate(steps):
            start = t0 + i * period
            for rank in range(8):
                slow = hosts is RUN1 and rank == SLOW_RANK
                compute = 1.3 if slow else 1.0
                row = (REQUEUED, step, rank, 8, hosts[rank // 4], rank % 4, rank % 4, "all")
                row += (start, start + period, period, 0.02, period - 0.02 - compute, compute)
                rows.append((*row, 8, 1024, "wall", f"i{hosts[rank // 4]}", len(rows)))
    return rows


def rank_detection(ts: float, id_: str, type_: str, state: str, step: int, opened: float) -> tuple:
    """A detection of rank 5 that names no host (its host comes from rank_placement)."""
    head = (ts, id_, REQUEUED, type_, state, SLOW_RANK, "all", "gpu", "system", step, step)
    return (*head, opened, f"rank {SLOW_RANK}", "", "stepwatch", "w1", int(ts))


def requeue_detections() -> list[tuple]:
    """A straggler of rank 5 opened in run 1 (resolved at the restart, on the new
    allocation's time) and a throughput detection of rank 5 opened in run 2."""
    opened, in_run2 = D.T0 + 21 * 1.4, RUN2_START + 30 * 1.05
    return [
        rank_detection(opened, "s5", "straggler", "open", 15, opened),
        rank_detection(RUN2_START, "s5", "straggler", "resolved", 30, opened),
        rank_detection(in_run2, "t5", "throughput", "open", 60, in_run2),
    ]


@pytest.fixture(scope="module")
def requeued(loaded):
    """jobR in a database of its own in the pipeline's store (one store per process)."""
    store = ChdbStore(loaded[2].store_path, database="requeue")
    Migrator(store, raw_ttl_days=20000).migrate()
    store.insert("step_events", STEP_COLUMNS, requeue_steps(), token="requeue|steps")
    store.insert("detections", DETECTION_COLUMNS, requeue_detections(), token="requeue|det")
    yield store
    store.close()


def counts(store: ChdbStore) -> dict[str, int]:
    return {
        t: store.query(f"SELECT count() FROM {t}").scalar()
        for t in ("step_events", "gpu_samples", "port_samples", "events", "detections")
    }


def run(store: ChdbStore, name: str, **values: str) -> Result:
    saved = queries.get(name)
    return store.query(
        saved.sql, saved.bind({"since": "0", **values} if saved.param("since") else values, now=NOW)
    )


@pytest.mark.timeout(120)
def test_every_message_is_stored_once(loaded):
    store, messages, _, sink = loaded
    assert counts(store) == D.expected_rows(messages)
    assert store.query("SELECT count() FROM dead_letters").scalar() == 0
    completeness = run(store, "ingest_completeness", limit="100000").dicts()
    assert sum(r["stored"] for r in completeness) == len(messages)
    assert {(r["gaps"], r["duplicate_rows"]) for r in completeness} == {(0, 0)}
    assert (
        sink.metrics.value("stepwatch_sink_rows_inserted_total", table="step_events")
        == D.expected_rows(messages)["step_events"]
    )


def test_lemon_nodes_names_the_host_slow_in_two_jobs(loaded):
    rows = run(loaded[0], "lemon_nodes").dicts()
    assert [r["host"] for r in rows] == [D.LEMON]
    lemon = rows[0]
    assert lemon["jobs"] == 3 and lemon["slow_jobs"] == 2 and lemon["flagged_jobs"] >= 2
    assert lemon["slow_job_ids"] == ["jobA", "jobB"]
    assert 1.07 < lemon["median_ratio"] < 1.13


def test_rank_percentiles_show_the_straggler_in_compute_not_in_step_time(loaded):
    rows = run(loaded[0], "rank_step_percentiles", job="jobA").dicts()
    assert [r["rank"] for r in rows] == list(range(32))
    slow = {r["rank"] for r in rows if r["compute_vs_group"] > 1.05}
    assert slow == set(range(16, 24))  # gpu-03 holds ranks 16..23
    step_p50 = [r["step_p50_s"] for r in rows]
    assert max(step_p50) / min(step_p50) < 1.02  # synchronous training equalises step time
    by_rank = {r["rank"]: r for r in rows}
    assert by_rank[0]["comm_wait_p50_s"] > by_rank[16]["comm_wait_p50_s"]


def test_goodput_drops_to_zero_while_jobC_hangs(loaded):
    rows = run(loaded[0], "goodput_mfu", job="jobC").dicts()
    first, hung = rows[0], [r for r in rows if not r["steps"]]
    assert first["goodput"] > 0.8 and first["mfu"] is None
    assert len(hung) >= 2 and {r["goodput"] for r in hung} == {0}
    jobA = run(loaded[0], "goodput_mfu", job="jobA").dicts()
    assert all(r["mfu"] is not None and 0 < r["mfu"] < 1 for r in jobA if r["steps"])


def test_job_timeline_orders_events_and_detections(loaded):
    rows = run(loaded[0], "job_timeline", job="jobC").dicts()
    assert rows[0]["what"] == "job_start"
    xid = [r for r in rows if r["what"] == "xid"]
    assert len(xid) == 1 and (xid[0]["host"], xid[0]["gpu"], xid[0]["code"]) == ("gpu-09", 4, 79)
    lost = [r for r in rows if r["what"] == "rank_missing:open"]
    assert lost and (lost[0]["host"], lost[0]["rank"], lost[0]["cause"]) == (
        "gpu-09",
        28,
        "hardware/system",
    )
    assert lost[0]["ts"] >= xid[0]["ts"]
    timeline_a = run(loaded[0], "job_timeline", job="jobA").dicts()
    opened = {(r["host"], r["rank"]) for r in timeline_a if r["what"] == "straggler:open"}
    # the slow host is one host-level incident (no rank) that lists its ranks 16..23
    assert (D.LEMON, None) in opened, opened
    lemon = next(r for r in timeline_a if r["what"] == "straggler:open" and r["host"] == D.LEMON)
    assert "[ranks 16,17,18,19,20,21,22,23]" in lemon["detail"], lemon["detail"]
    timeline_b = run(loaded[0], "job_timeline", job="jobB").dicts()
    placed = [(r["host"], r["rank"]) for r in timeline_b if r["what"] == "throughput:open"]
    assert placed == [(D.LEMON, 2)]  # a rank-only detection, its host from rank_placement
    assert [r["ts"] for r in timeline_a] == sorted(r["ts"] for r in timeline_a)


def test_network_hotspots_lead_with_the_flapped_link_then_the_congested_nic(loaded):
    rows = run(loaded[0], "network_hotspots").dicts()
    top = rows[0]
    assert (top["host"], top["device"], top["problem"]) == ("gpu-06", "mlx5_2", "link_down")
    assert top["link_downs"] >= 1 and top["down_samples"] >= 1
    congested = [r for r in rows if r["problem"] == "congestion"]
    assert (congested[0]["host"], congested[0]["device"]) == ("gpu-02", "mlx5_5")
    assert congested[0]["xmit_wait_per_s_avg"] > 10 * rows[-1]["xmit_wait_per_s_avg"]


def test_gpu_errors_put_the_fallen_gpu_first(loaded):
    rows = run(loaded[0], "gpu_errors").dicts()
    top = rows[0]
    assert (top["host"], top["gpu"], top["xid_codes"], top["action"]) == (
        "gpu-09",
        4,
        [79],
        "drain",
    )
    assert all(r["action"] != "drain" for r in rows[1:])


def test_the_cli_runs_saved_queries_and_sql(loaded, capsys):
    _, _, settings, _ = loaded
    path = ["--store-path", settings.store_path]
    assert main(["query", "lemon_nodes", "--since", "2025-12-01", "--format", "csv", *path]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("host,jobs,slow_jobs") and out[1].startswith("gpu-03,3,2,2,")
    assert (
        main(
            [
                "sql",
                "SELECT count() AS n FROM events WHERE type = {t:String}",
                "-p",
                "t=xid",
                "-f",
                "json",
                *path,
            ]
        )
        == 0
    )
    assert '"n": 1' in capsys.readouterr().out
    assert main(["query", "rank_step_percentiles", *path]) == 1  # --job is required
    assert "needs --job" in capsys.readouterr().err


def test_rank_percentiles_keep_a_requeued_straggler_on_its_slow_host(requeued):
    """A rank's steps on two allocations are two rows: the slow one stands out on its
    host (one row per rank mixed them: rank 5 showed healthy, its slow host nowhere)."""
    rows = run(requeued, "rank_step_percentiles", job=REQUEUED).dicts()
    placed = {(r["rank"], r["host"]): r for r in rows}
    assert len(rows) == 12  # ranks 0-3 stayed on rq-node01; ranks 4-7 moved
    slow = {key for key, r in placed.items() if r["compute_vs_group"] > 1.2}
    assert slow == {(SLOW_RANK, SLOW_HOST)}
    assert placed[(SLOW_RANK, SLOW_HOST)]["compute_p50_s"] == pytest.approx(1.3, abs=0.01)
    assert (placed[(SLOW_RANK, SLOW_HOST)]["steps"], placed[(SLOW_RANK, SPARE)]["steps"]) == (
        40,
        70,
    )
    assert placed[(SLOW_RANK, SPARE)]["compute_vs_group"] == pytest.approx(1.0, abs=0.01)
    assert (placed[(SLOW_RANK, SPARE)]["first_step"], placed[(SLOW_RANK, SPARE)]["last_step"]) == (
        30,
        99,
    )
    assert [r["host"] for r in rows if r["rank"] == SLOW_RANK] == [
        SLOW_HOST,
        SPARE,
    ]  # in time order


def test_job_timeline_and_lemon_nodes_place_a_requeued_rank_where_it_ran(requeued):
    """A rank-only detection gets the host the rank ran on when it opened."""
    rows = run(requeued, "job_timeline", job=REQUEUED).dicts()
    placed = [(r["what"], r["host"]) for r in rows if r["source"] == "detection"]
    assert placed == [
        ("straggler:open", SLOW_HOST),
        ("straggler:resolved", SLOW_HOST),  # resolved after the move, opened before it
        ("throughput:open", SPARE),
    ]
    lemons = run(requeued, "lemon_nodes", min_jobs="1").dicts()
    assert [(r["host"], r["flagged_jobs"]) for r in lemons] == [(SLOW_HOST, 1)]

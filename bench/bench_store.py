"""Benchmark the historical store: sink throughput, query latency, bytes per step.

1. Insert throughput, step rows/s, three ways in the same run on the same rows:
   * sink path: encoded StepMessages in Kafka (development broker) -> the sink
     (KafkaSource, decode + contract checks, row mapping and column checks,
     dedup-token inserts, offset commits) -> chdb. Timed from the first record
     consumed to the last row committed (consumer-group join excluded).
   * raw insert baseline: the same rows, already mapped, inserted with
     ChdbStore.insert (JSONCompactEachRow) in blocks of the sink's batch size.
   * engine baseline: the same number of rows generated inside ClickHouse
     (INSERT ... SELECT FROM numbers()): the engine's own insert speed.
2. Query latency: the saved query ``rank_step_percentiles`` (exact
   quantiles) on one job of ``--ranks`` ranks x ``--steps`` steps,
   generated with INSERT ... SELECT FROM numbers() (default 1024 x 1000 = 1M
   rows; ``--steps 10000`` for the 10M-row figure). Goal: < 1 s. The median of
   ``--repeat`` runs after one warm-up; next to it, the same query with FINAL
   and the rollup (``step_rollup_1m``) a dashboard reads.
3. Storage: compressed bytes per step row (system.parts), and the heaviest
   columns (system.columns), after the background merges settle.

Run: ``python bench/bench_store.py`` (about a minute); ``--steps 10000`` for the
10M-row run (a few minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from stepwatch.contract import Phases, StepMessage, StepRecord, encode
from stepwatch.exporters.clickhouse import queries
from stepwatch.exporters.clickhouse import rows as R
from stepwatch.exporters.clickhouse.chdb_backend import ChdbStore
from stepwatch.exporters.clickhouse.migrations import Migrator
from stepwatch.exporters.clickhouse.prepare import Preparer, Record

T0 = 1767225600.0
RANKS_PER_HOST = 8


def step_messages(hosts: int, steps: int) -> list[StepMessage]:
    """One message per host per step, 8 ranks each, realistic phases."""
    out = []
    world = hosts * RANKS_PER_HOST
    for step in range(steps):
        start = T0 + step * 1.1
        for h in range(hosts):
            records = []
            for local in range(RANKS_PER_HOST):
                rank = h * RANKS_PER_HOST + local
                jitter = ((rank * 7919 + step * 104729) % 1000) / 1e5
                fwd, bwd = 0.3 + jitter, 0.55 + jitter
                records.append(
                    StepRecord(
                        job_id="bench",
                        rank=rank,
                        world_size=world,
                        step=step,
                        start=start,
                        end=start + 1.0,
                        host=f"node{h:04d}",
                        local_rank=local,
                        phases=Phases(
                            data=0.01,
                            forward=fwd,
                            backward=bwd,
                            optimizer=0.05,
                            comm_wait=1.0 - 0.61 - fwd - bwd + 0.6,
                        ),
                        samples=8,
                        tokens=32768,
                        loss=2.5,
                        flops=1.9e14,
                        timing="cuda",
                    )
                )
            out.append(
                StepMessage(
                    host=f"node{h:04d}",
                    ts=start + 1.0,
                    inst="bench",
                    seq=step,
                    job_id="bench",
                    steps=records,
                )
            )
    return out


# --------------------------------------------------------------------------- 1. throughput
def bench_sink(messages: list[StepMessage], batch: int, work: Path) -> tuple[int, float]:
    from confluent_kafka import Producer

    from stepwatch.daemons.broker import DevBroker
    from stepwatch.exporters.clickhouse.kafka_source import KafkaSource
    from stepwatch.exporters.clickhouse.sink import Sink, SinkConfig, sink_topics
    from stepwatch.kafka import ensure_topics
    from stepwatch.settings import Settings

    rows = sum(len(m.steps) for m in messages)
    with DevBroker(log_path=str(work / "broker.log")) as broker:
        settings = Settings.load(
            env={},
            bootstrap_servers=broker.bootstrap,
            topic_prefix="b",
            partitions=4,
            kafka_config={"session.timeout.ms": "6000"},
        )
        ensure_topics(settings, sink_topics("b"))
        producer = Producer(
            {"bootstrap.servers": broker.bootstrap, "linger.ms": 50, "compression.type": "lz4"}
        )
        for i, m in enumerate(messages):
            producer.produce("b.steps", encode(m), m.job_id.encode() + str(i % 64).encode())
            if i % 5000 == 0:
                producer.poll(0)
        producer.flush(60)
        store = ChdbStore(str(work / "sink"))
        Migrator(store, raw_ttl_days=20000).migrate()
        sink = Sink(
            store,
            KafkaSource(settings, "bench"),
            sink_topics("b"),
            SinkConfig(batch_messages=batch, batch_seconds=0.5),
        )
        first: list[float] = []
        original = sink.source.poll

        def poll(n: int, timeout: float) -> list[Record]:
            got = original(n, timeout)
            if got and not first:
                first.append(time.perf_counter())
            return got

        sink.source.poll = poll  # type: ignore[method-assign,assignment]
        thread = threading.Thread(target=sink.run, daemon=True)
        thread.start()
        deadline = time.monotonic() + 600
        while sink.metrics.value("stepwatch_sink_rows_inserted_total", table="step_events") < rows:
            if time.monotonic() > deadline:
                raise SystemExit("sink did not finish in 10 minutes")
            time.sleep(0.05)
        elapsed = time.perf_counter() - first[0]
        sink.stop()
        thread.join(30)
        assert store.query("SELECT count() FROM step_events").scalar() == rows
        store.close()
    return rows, elapsed


def bench_raw_insert(messages: list[StepMessage], batch: int, work: Path) -> tuple[int, float]:
    prepared = Preparer().prepare(
        [Record("b.steps", 0, i, encode(m)) for i, m in enumerate(messages)]
    )
    all_rows = prepared.tables["step_events"].rows
    store = ChdbStore(str(work / "raw"))
    Migrator(store, raw_ttl_days=20000).migrate()
    per_block = batch * RANKS_PER_HOST
    started = time.perf_counter()
    for i in range(0, len(all_rows), per_block):
        store.insert("step_events", R.STEPS.names, all_rows[i : i + per_block], token=f"raw-{i}")
    elapsed = time.perf_counter() - started
    store.close()
    return len(all_rows), elapsed


# --------------------------------------------------------------------------- 2. big job
GENERATE = """
INSERT INTO step_events (job_id, step, rank, world_size, host, local_rank, gpu, peer_group,
    start_ts, end_ts, duration_s, data_s, forward_s, backward_s, optimizer_s, comm_wait_s,
    compute_s, samples, tokens, loss, flops, timing, inst, seq)
SELECT
    'big', intDiv(number, {ranks}) AS st, number % {ranks} AS rk, {ranks},
    concat('node', leftPad(toString(intDiv(rk, 8)), 4, '0')), rk % 8, rk % 8, 'all',
    toDateTime64({t0} + st * 1.1, 6, 'UTC') AS s0,
    s0 + toIntervalMicrosecond(toUInt64(d * 1e6)),
    1.0 + randNormal(0, 0.004) AS d,
    0.01 + randExponential(200),
    if(rk = {slow_rank}, 1.1, 1.0) * (0.3 + randNormal(0, 0.003)) AS f,
    if(rk = {slow_rank}, 1.1, 1.0) * (0.55 + randNormal(0, 0.004)) AS b,
    0.05 AS o,
    greatest(0, d - 0.01 - f - b - o),
    f + b + o, 8, 32768, 2.5, 1.9e14, 'cuda', 'gen', st
FROM numbers({rows})
SETTINGS max_insert_threads = 2, max_block_size = 1048576
"""


def bench_query(ranks: int, steps: int, repeat: int, work: Path) -> dict[str, float]:
    store = ChdbStore(str(work / "big"))
    Migrator(store, raw_ttl_days=20000).migrate()
    rows = ranks * steps
    started = time.perf_counter()
    store.command(GENERATE.format(ranks=ranks, rows=rows, t0=T0, slow_rank=ranks // 2 + 5))
    generate_s = time.perf_counter() - started
    settle(store)
    saved = queries.get("rank_step_percentiles")
    params = saved.bind({"job": "big", "since": "0"})
    result = store.query(saved.sql, params)  # warm-up, and a correctness check
    assert len(result.rows) == ranks, len(result.rows)
    slowest = max(result.dicts(), key=lambda r: r["compute_vs_group"])
    out = {
        "rows": float(store.query("SELECT count() FROM step_events").scalar()),
        "generate_s": generate_s,
        "slowest_rank": float(slowest["rank"]),
        "slowest_ratio": float(slowest["compute_vs_group"]),
    }
    out["query_s"] = timed(lambda: store.query(saved.sql, params), repeat)
    final = saved.sql.replace("FROM step_events\n", "FROM step_events FINAL\n")
    assert final != saved.sql
    out["with_final_s"] = timed(lambda: store.query(final, params), repeat)
    rollup = (
        "SELECT minute, sum(rank_steps), quantilesTDigestMerge(0.5, 0.9, 0.99)(duration_q) "
        "FROM step_rollup_1m WHERE job_id = 'big' GROUP BY minute ORDER BY minute"
    )
    out["rollup_s"] = timed(lambda: store.query(rollup), repeat)
    parts = store.query(
        "SELECT sum(rows), sum(data_compressed_bytes), sum(data_uncompressed_bytes), count() "
        "FROM system.parts WHERE active AND database = currentDatabase() AND table = 'step_events'"
    ).rows[0]
    out["bytes_per_row"] = parts[1] / parts[0]
    out["raw_bytes_per_row"] = parts[2] / parts[0]
    out["parts"] = float(parts[3])
    columns = store.query(
        "SELECT name, data_compressed_bytes FROM system.columns WHERE database = currentDatabase() "
        "AND table = 'step_events' ORDER BY data_compressed_bytes DESC LIMIT 6"
    ).rows
    store.close()
    print(
        "   heaviest columns (bytes/row): " + ", ".join(f"{n} {b / rows:.2f}" for n, b in columns)
    )
    return out


def settle(store: ChdbStore, timeout: float = 120.0) -> None:
    """Wait for background merges to finish, so timings do not race them."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not store.query(
            "SELECT count() FROM system.merges WHERE database = currentDatabase()"
        ).scalar():
            return
        time.sleep(0.5)


def timed(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--ranks", type=int, default=1024, help="ranks of the big job (default 1024)"
    )
    parser.add_argument(
        "--steps", type=int, default=1000, help="steps of the big job (10000: 10M rows)"
    )
    parser.add_argument("--repeat", type=int, default=3, help="timed query runs (median)")
    parser.add_argument("--sink-hosts", type=int, default=64, help="hosts in the throughput run")
    parser.add_argument("--sink-steps", type=int, default=300, help="steps in the throughput run")
    parser.add_argument("--batch", type=int, default=2000, help="messages per sink batch")
    parser.add_argument(
        "--skip-sink", action="store_true", help="only the query and storage figures"
    )
    args = parser.parse_args()
    load = os.getloadavg()[0]
    print(
        f"machine: {os.cpu_count()} CPUs, load average {load:.2f} at start "
        "(other work slows every figure)"
    )
    with tempfile.TemporaryDirectory(prefix="bench-store-") as tmp:
        work = Path(tmp)
        if not args.skip_sink:
            messages = step_messages(args.sink_hosts, args.sink_steps)
            print(f"1. insert throughput: {len(messages)} step messages x {RANKS_PER_HOST} ranks")
            n, raw_s = bench_raw_insert(messages, args.batch, work)
            print(
                f"   raw insert baseline   {n / raw_s:12,.0f} rows/s  ({n} rows in {raw_s:.2f} s)"
            )
            n, sink_s = bench_sink(messages, args.batch, work)
            print(
                f"   sink path (Kafka)     {n / sink_s:12,.0f} rows/s  ({n} rows in {sink_s:.2f} s)"
            )
            print(f"   ratio sink / raw insert: {raw_s / sink_s:.2f}")
        rows = args.ranks * args.steps
        print(
            f"2. per-rank percentiles, one job of {args.ranks} ranks x {args.steps} steps "
            f"({rows:,} rows)"
        )
        q = bench_query(args.ranks, args.steps, args.repeat, work)
        engine_rate = q["rows"] / q["generate_s"]
        if not args.skip_sink:
            print(
                f"   engine baseline (INSERT SELECT numbers)  {engine_rate:12,.0f} rows/s; "
                f"sink path = {n / sink_s / engine_rate:.3f} x engine"
            )
        else:
            print(f"   generated at {engine_rate:,.0f} rows/s (INSERT SELECT numbers)")
        print(
            f"   rank_step_percentiles (exact quantiles):        {q['query_s'] * 1000:8.0f} ms  "
            "(goal < 1000 ms; straggler found: "
            f"rank {q['slowest_rank']:.0f} at {q['slowest_ratio']:.3f})"
        )
        print(
            "   same with FINAL:                                "
            f"{q['with_final_s'] * 1000:8.0f} ms  "
            f"(FINAL costs {q['with_final_s'] / q['query_s']:.2f} x)"
        )
        print(
            f"   per-minute rollup a dashboard reads:            {q['rollup_s'] * 1000:8.0f} ms  "
            f"({q['query_s'] / q['rollup_s']:.0f} x faster than the raw query)"
        )
        print(
            f"3. storage: {q['bytes_per_row']:.2f} bytes per step row compressed "
            f"({q['raw_bytes_per_row']:.1f} uncompressed, "
            f"{q['raw_bytes_per_row'] / q['bytes_per_row']:.1f} x; "
            f"{q['parts']:.0f} parts)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

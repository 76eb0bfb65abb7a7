"""A simulated run (with the detection core's findings) loaded into an embedded store.

The sink's own row mapping (``Preparer``) turns the messages into rows, so the
store holds exactly what ``stepwatch db sink`` would have written; no broker.
Used by the report and dashboard tests.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import msgspec

from stepwatch.agents.sink import Sequencer
from stepwatch.contract import KIND_OF, Message, StepMessage, Topics, encode
from stepwatch.exporters.clickhouse.chdb_backend import ChdbStore
from stepwatch.exporters.clickhouse.migrations import Migrator, load_migrations
from stepwatch.exporters.clickhouse.prepare import Preparer, Record
from stepwatch.sim import Fault, FaultKind, Scenario, simulate
from stepwatch.streams.core import Engine

JOB = "sim-job"
# Recent (the raw tables' TTL drops rows older than 90 days at insert), whole hour.
T0 = float(int(time.time() // 3600 * 3600 - 3 * 3600))


def scenario(steps: int = 160) -> Scenario:
    """Four nodes; a GPU straggler (rank 13 on node0001) and NIC congestion on node0003."""
    return Scenario(
        seed=5,
        job_id=JOB,
        nodes=4,
        steps=steps,
        start_ts=T0,
        flops_per_token=6e9,
        checkpoint_every=60,
        eval_every=0,
        faults=(
            Fault(FaultKind.SLOW_GPU, rank=13, start_step=40, severity=0.3),
            Fault(
                FaultKind.NIC_CONGESTION,
                host="node0003",
                nic=2,
                start_step=90,
                end_step=130,
                severity=0.2,
            ),
        ),
    )


def skewed(msgs: list[Message], offsets: dict[str, float]) -> list[Message]:
    """The messages as hosts whose clocks are off by ``offsets`` (host -> seconds) stamp
    them: every time a host writes (a message's ``ts``, its step records' start and end)."""
    out: list[Message] = []
    for m in msgs:
        off = offsets.get(m.host, 0.0)
        if off and isinstance(m, StepMessage):
            steps = [
                msgspec.structs.replace(r, start=r.start + off, end=r.end + off) for r in m.steps
            ]
            m = msgspec.structs.replace(m, ts=m.ts + off, steps=steps)
        elif off:
            m = msgspec.structs.replace(m, ts=m.ts + off)
        out.append(m)
    return out


def messages(
    sc: Scenario | Sequence[Scenario], offsets: dict[str, float] | None = None
) -> list[Message]:
    """The run's telemetry (``sc``: one scenario, or several: a job's runs) and the
    detections the core finds in it, in time order."""
    runs = (sc,) if isinstance(sc, Scenario) else tuple(sc)
    telemetry = sorted(skewed(list(simulate(*runs)), offsets or {}), key=lambda m: m.ts)
    engine = Engine()
    found: list[Message] = []
    for m in telemetry:
        found.extend(engine.process(m))
    found.extend(engine.tick(telemetry[-1].ts + 600))
    seq = Sequencer("worker-1")  # one sender: its numbers run on, as a worker's do
    stamped = [seq.stamp(d) for d in found]
    return sorted([*telemetry, *stamped], key=lambda m: m.ts)


def fill(
    path: Path,
    sc: Scenario | Sequence[Scenario] | None = None,
    offsets: dict[str, float] | None = None,
) -> int:
    """Load the run into a new store at ``path`` (``offsets``: hosts whose clocks are off,
    see :func:`skewed`); returns the messages loaded."""
    msgs = messages(sc or scenario(), offsets)
    topics = Topics("stepwatch")
    records = [
        Record(topics.for_kind(KIND_OF[type(m)]), 0, i, encode(m)) for i, m in enumerate(msgs)
    ]
    store = ChdbStore(str(path))
    try:
        Migrator(store, migrations=load_migrations()).migrate()
        prepared = Preparer(store).prepare(records)
        for table, rows in prepared.tables.items():
            if rows.rows:
                store.insert(table, rows.table.names, rows.rows, token=f"fill|{table}")
    finally:
        store.close()
    return len(msgs)

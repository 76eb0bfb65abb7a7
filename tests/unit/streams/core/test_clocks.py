"""Hosts whose clocks are off: from the worker's clock, and from each other.

A real recorded DDP run (tests/fixtures/torch, 4 ranks on 2 hosts) is fed the
way the live worker feeds the core: each message arrives on the worker's clock
(its true send time plus a little delay) and the engine is ticked on that clock,
while the hosts' timestamps are shifted as a host with a wrong clock would
stamp them. Before: a host 6 s or more behind its peer closed their steps before
they reported (a false ``rank_missing``); hosts 2 minutes behind the worker were
called hung every minute (a requeue of a healthy job); a host ahead delayed a real
hang by as much; one skewed host added its offset to the job's wall time as
badput.
"""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from stepwatch.contract import (
    EventMessage,
    EventType,
    GpuMessage,
    GpuReading,
    Message,
    StepMessage,
    decode_unchecked,
)
from stepwatch.contract.records import DetectionMessage
from stepwatch.sim import Fault, FaultKind, Scenario, simulate
from stepwatch.streams.core import DetectConfig, Engine

pytestmark = pytest.mark.unit

RUNS = Path(__file__).parents[3] / "fixtures" / "torch"
DELAY = 0.3  # seconds from a host's send to the worker's read


def _shifted(line: str, offsets: dict[str, float]) -> tuple[float, Message]:
    m = json.loads(line)
    sent = m["ts"]
    off = offsets.get(m["host"], offsets.get("*", 0.0))
    m["ts"] += off
    for s in m.get("steps", []):
        s["start"] += off
        s["end"] += off
    return sent, decode_unchecked(json.dumps(m))


def _job_start(lines: list[str], before: float) -> str:
    """A ``job_start`` event of rank 0 (on its host), ``before`` seconds before its first
    step began, as the SDK sends it."""
    first = min(
        (r for m in map(json.loads, lines) for r in m.get("steps", []) if r["rank"] == 0),
        key=lambda r: r["start"],
    )
    ev = EventMessage(
        host=first["host"],
        ts=first["start"] - before,
        job_id=first["job_id"],
        type=EventType.JOB_START,
        rank=0,
        attrs={"world_size": first["world_size"]},
    )
    return msgspec.json.encode(ev).decode()


def _placed_anew(line: str, after: int) -> str:
    """A step message of steps from ``after`` on, sent from host-(N+2) for host-N."""
    m = json.loads(line)
    steps = m.get("steps")
    if not steps or any(r["step"] < after for r in steps):
        return line
    moved = {"host-0": "host-2", "host-1": "host-3"}
    m["host"] = moved[m["host"]]
    for r in steps:
        r["host"] = moved[r["host"]]
    return json.dumps(m)


def feed(
    run: str,
    offsets: dict[str, float],
    last_step: int | None = None,
    after: float = 40.0,
    backlog: float | None = None,
    start_up: float | None = None,
    placed_anew: int | None = None,
) -> tuple[Engine, list[tuple[float, DetectionMessage]]]:
    """Feed ``run`` with host clocks off by ``offsets`` (host -> seconds, "*": all);
    return the engine and each detection with the worker's clock when it came out.
    ``backlog``: the worker reads the whole run this many seconds after it began, at
    50 messages a second (a restart after an outage), instead of as it is sent.
    ``start_up``: rank 0's host also sends ``job_start`` this long before the first step.
    ``placed_anew``: from this step on, host-N's ranks run on host-(N+2) (a requeue)."""
    lines = (RUNS / f"{run}.jsonl").read_text().splitlines()
    if start_up is not None:
        lines.append(_job_start(lines, start_up))
    if placed_anew is not None:
        lines = [_placed_anew(line, placed_anew) for line in lines]
    msgs = sorted((_shifted(line, offsets) for line in lines), key=lambda x: x[0])
    if last_step is not None:  # the job hangs after this step: nothing more is sent
        msgs = [
            (t, m)
            for t, m in msgs
            if not isinstance(m, StepMessage) or all(r.step <= last_step for r in m.steps)
        ]
    engine, out, ticked = Engine(DetectConfig()), [], 0.0
    first = msgs[0][0]
    for i, (sent, m) in enumerate(msgs):
        now = sent + DELAY if backlog is None else first + backlog + i / 50
        out += [(now, d) for d in engine.process(m, now)]
        if now - ticked >= 1.0:
            ticked = now
            out += [(now, d) for d in engine.tick(now)]
    end = now
    for k in range(1, int(after)):
        out += [(end + k, d) for d in engine.tick(end + k)]
    return engine, out


def opened(found: list[tuple[float, DetectionMessage]]) -> list[tuple[str, int | None, str]]:
    return [(d.type, d.rank, d.cause) for _, d in found if d.state == "open"]


@pytest.mark.parametrize(
    "offsets",
    [{"host-1": -6.0}, {"host-1": -30.0}, {"host-1": 120.0}, {"*": -120.0}, {"*": 120.0}],
    ids=["one-6s-behind", "one-30s-behind", "one-2min-ahead", "all-2min-behind", "all-ahead"],
)
def test_a_healthy_job_stays_silent_and_keeps_its_goodput(offsets: dict[str, float]) -> None:
    engine, found = feed("healthy", offsets)
    assert opened(found) == []
    assert engine.stats()[0].hung is False
    base = feed("healthy", {})[0].stats()[0]
    skewed = engine.stats()[0]
    assert base.goodput_ratio is not None and skewed.goodput_ratio is not None
    assert skewed.goodput_ratio == pytest.approx(base.goodput_ratio, abs=0.005)
    assert skewed.badput_seconds["other"] == pytest.approx(base.badput_seconds["other"], abs=0.2)


@pytest.mark.parametrize("offset", [-60.0, 60.0])
def test_a_job_start_from_a_host_whose_clock_is_off_keeps_the_goodput(offset: float) -> None:
    """Rank 0 sends ``job_start`` 20 s before its first step (start-up: wall time, badput
    ``other``), from a host a minute behind (or ahead of) its peer. The event's time is
    read on the clock the steps' times are on, once the hosts' offsets are known. Before,
    it was taken as stamped: a minute more (or 20 s less) start-up."""
    base = feed("healthy", {}, start_up=20.0)[0].stats()[0]
    skewed = feed("healthy", {"host-0": offset}, start_up=20.0)[0].stats()[0]
    plain = feed("healthy", {})[0].stats()[0]
    assert base.badput_seconds["other"] == pytest.approx(
        plain.badput_seconds["other"] + 20.0, abs=0.5
    )
    assert skewed.badput_seconds["other"] == pytest.approx(base.badput_seconds["other"], abs=0.5)
    assert base.goodput_ratio is not None and skewed.goodput_ratio is not None
    assert skewed.goodput_ratio == pytest.approx(base.goodput_ratio, abs=0.005)


def test_a_job_start_stays_on_the_median_clock_after_the_job_is_placed_anew() -> None:
    """As above, rank 0's host a minute behind; from step 60 the ranks run on two other
    hosts (the same clocks), and the new placement's offsets know nothing of the host
    that sent ``job_start``. The event stays where it was read (before: back on its
    host's clock, 30 s more start-up)."""
    base = feed("healthy", {}, start_up=20.0, placed_anew=60)[0].stats()[0]
    off = {"host-0": -60.0, "host-2": -60.0}
    skewed = feed("healthy", off, start_up=20.0, placed_anew=60)[0].stats()[0]
    assert skewed.badput_seconds["other"] == pytest.approx(base.badput_seconds["other"], abs=0.5)


@pytest.mark.parametrize("offsets", [{}, {"*": 120.0}, {"*": -120.0}, {"host-0": 30.0}])
def test_a_real_hang_is_called_a_minute_after_the_last_step_whatever_the_clocks(
    offsets: dict[str, float],
) -> None:
    _, found = feed("healthy", offsets, last_step=60, after=120.0)
    hangs = [t for t, d in found if d.type == "hang" and d.state == "open"]
    assert len(hangs) == 1, opened(found)
    _, ref = feed("healthy", {}, last_step=60, after=120.0)
    # the same worker time as with true clocks: the limit (60 s) after the last step came
    assert hangs[0] == pytest.approx(next(t for t, d in ref if d.type == "hang"), abs=1.5)


@pytest.mark.parametrize("offsets", [{"host-1": -30.0}, {"host-0": 45.0}, {"*": -120.0}])
def test_a_straggler_is_found_the_same_whatever_the_clocks(offsets: dict[str, float]) -> None:
    base = [(d.type, d.rank, d.cause, d.first_step) for _, d in feed("compute", {})[1]]
    skewed = [(d.type, d.rank, d.cause, d.first_step) for _, d in feed("compute", offsets)[1]]
    assert ("straggler", 1, "gpu", 40) in base
    assert skewed == base


def test_a_backlog_read_after_an_outage_is_not_a_hang() -> None:
    """The worker was down for 5 minutes: it reads the job's steps late, in a burst that
    lasts longer than a tick, while the job goes on. Nothing stopped: nothing opens."""
    engine, found = feed("healthy", {}, backlog=300.0)
    assert opened(found) == []
    assert engine.stats()[0].hung is False


def test_a_host_whose_clock_is_20_minutes_behind_keeps_its_samples() -> None:
    """Host windows are forgotten after 15 minutes of silence on the engine's clock: a
    host that reports every second is not silent, whatever its own clock says."""
    engine, now = Engine(DetectConfig()), 1_800_000_000.0
    for k in range(5):
        sample = GpuMessage(host="late", ts=now + k - 1200, gpus=[GpuReading(index=0)])
        engine.process(sample, now + k)
        engine.tick(now + k)
    assert "late" in engine.windows


def test_one_message_stamped_far_ahead_does_not_make_a_healthy_job_hung() -> None:
    """Anyone who can produce to Kafka may stamp a message up to 5 minutes ahead (the
    admission gate's limit): one such step message for a healthy job, a copy of a step
    it already reported (its records unchanged: duplicates), must not move the job's clock
    far enough to call it hung."""
    lines = (RUNS / "healthy.jsonl").read_text().splitlines()
    msgs = sorted((_shifted(line, {}) for line in lines), key=lambda x: x[0])
    engine, found = Engine(DetectConfig()), []
    for i, (sent, m) in enumerate(msgs):
        now = sent + DELAY
        found += engine.process(m, now)
        if i == len(msgs) // 2:
            copy = json.loads(lines[0])  # step 0 again, its message stamped 290 s ahead
            copy["ts"] = now + 290.0
            found += engine.process(decode_unchecked(json.dumps(copy)), now)
        found += engine.tick(now)
    assert [(d.type, d.rank) for d in found if d.state == "open"] == []


def test_a_flood_of_copied_step_messages_does_not_hide_a_hang() -> None:
    """The job stops making progress half way. Someone who can produce to Kafka then sends
    a copy of one of its earlier step messages every second, stamped now (its records are
    duplicates of a reported step: no progress). Before, any step message's arrival
    counted as the job still reporting and capped the hang's silence: the hang was never
    called."""
    lines = (RUNS / "healthy.jsonl").read_text().splitlines()
    msgs = sorted((_shifted(line, {}) for line in lines), key=lambda x: x[0])
    engine, found = Engine(DetectConfig()), []
    half = msgs[: len(msgs) // 2]
    for sent, m in half:
        found += engine.process(m, sent + DELAY)
        found += engine.tick(sent + DELAY)
    now = half[-1][0] + DELAY
    copy = json.loads(lines[len(lines) // 4])
    for k in range(1, 181):  # three minutes of the flood
        copy["ts"] = now + k
        found += engine.process(decode_unchecked(json.dumps(copy)), now + k)
        found += engine.tick(now + k)
    assert [d.type for d in found if d.state == "open"] == ["hang"]


def test_a_job_end_from_a_host_behind_its_peer_waits_for_the_peers_last_steps() -> None:
    """host-0's clock is 60 s ahead of host-1's. host-1 sends ``job_end`` right after its
    last step; host-0's last two step messages reach the worker 2 s later. The job's
    clock is host-0's, so the end (stamped on host-1's clock) looked a minute old: the
    job was closed at the next tick and host-0's last steps were dropped as late."""
    lines = (RUNS / "healthy.jsonl").read_text().splitlines()
    msgs = sorted((_shifted(line, {"host-0": 60.0}) for line in lines), key=lambda x: x[0])
    last_of_0 = [i for i, (_, m) in enumerate(msgs) if m.host == "host-0"][-2:]
    end_sent = max(s for i, (s, m) in enumerate(msgs) if m.host == "host-1")
    job_id = next(m.job_id for _, m in msgs if isinstance(m, StepMessage))
    end = EventMessage(host="host-1", ts=end_sent + 0.1, type=EventType.JOB_END, job_id=job_id)
    arrivals = [
        (s + DELAY + (2.0 if i in last_of_0 else 0.0), m) for i, (s, m) in enumerate(msgs)
    ] + [(end_sent + 0.1 + DELAY, end)]
    engine, ticked = Engine(DetectConfig()), 0.0
    for now, m in sorted(arrivals, key=lambda x: x[0]):
        engine.process(m, now)
        if now - ticked >= 1.0:
            ticked = now
            engine.tick(now)
    for k in range(1, 30):
        engine.tick(now + k)
    job = engine.jobs[job_id]
    steps = max(r.step for _, m in msgs if isinstance(m, StepMessage) for r in m.steps)
    assert job.finalised and job.assembler.late == 0
    assert job.assembler.last_closed == steps


def _sim_opens(
    kind: FaultKind, shifted: str, off: float, forged: tuple[int, str] | None = None
) -> list[tuple[object, ...]]:
    return [
        (d.type, d.rank, d.host, d.device, d.cause, d.first_step, d.evidence.get("cause_reason"))
        for d in _sim_found(kind, shifted, off, forged)
        if d.state == "open"
    ]


def _sim_found(
    kind: FaultKind, shifted: str, off: float, forged: tuple[int, str] | None = None
) -> list[DetectionMessage]:
    """A 4-node simulated job (8 GPUs, 8 NICs a node; the fault on rank 9, node0001, from
    step 80) fed live; the host ``shifted`` ("fault": node0001, "other": node0003) stamps
    its step records and samples ``off`` seconds off; or, with ``forged`` (rank, host),
    only that rank's records are ``off`` seconds off and claim that host."""
    scenario = Scenario(
        seed=5,
        job_id="j",
        nodes=4,
        gpus_per_node=8,
        nics_per_node=8,
        steps=200,
        step_seconds=1.0,
        start_ts=1.8e9,
        faults=(Fault(kind=kind, rank=9, start_step=80, severity=0.3),),
    )
    host = "node0001" if shifted == "fault" else "node0003"
    engine, found, ticked = Engine(DetectConfig()), [], 0.0
    for m in simulate(scenario):
        now = m.ts + DELAY
        if forged is not None and isinstance(m, StepMessage):
            rank, claimed = forged
            steps = [
                msgspec.structs.replace(r, start=r.start + off, end=r.end + off, host=claimed)
                if r.rank == rank
                else r
                for r in m.steps
            ]
            m = msgspec.structs.replace(m, steps=steps)
        elif forged is None and m.host == host:
            steps = getattr(m, "steps", None)
            if steps is not None:
                moved = [
                    msgspec.structs.replace(r, start=r.start + off, end=r.end + off) for r in steps
                ]
                m = msgspec.structs.replace(m, steps=moved)
            m = msgspec.structs.replace(m, ts=m.ts + off)
        found += engine.process(m, now)
        if now - ticked >= 1.0:
            ticked = now
            found += engine.tick(now)
    return found


@pytest.mark.parametrize(
    ("kind", "shifted", "off"),
    [
        (FaultKind.NIC_CONGESTION, "fault", -60.0),
        (FaultKind.NIC_CONGESTION, "fault", -20.0),
        (FaultKind.NIC_CONGESTION, "other", 60.0),
        (FaultKind.THERMAL_THROTTLE, "fault", -60.0),
        (FaultKind.POWER_THROTTLE, "other", 60.0),
    ],
)
def test_a_faults_host_port_and_cause_are_found_the_same_whatever_the_clocks(
    kind: FaultKind, shifted: str, off: float
) -> None:
    """Causes are read from each host's samples on its own clock (HostClocks, from the
    ends of the job's steps). Before, with the congested NIC's host 20 or 60 s behind, or
    another host 60 s ahead, the ``network_congestion`` detection named a healthy host
    (node0002 or node0003), the congested one's samples read from the wrong time."""
    base = _sim_opens(kind, shifted, 0.0)
    assert base and base[0][2] == "node0001"
    assert _sim_opens(kind, shifted, off) == base


@pytest.mark.parametrize(
    ("kind", "shifted", "off"),
    [
        (FaultKind.XID79, "fault", -60.0),
        (FaultKind.XID79, "other", 60.0),
        (FaultKind.LINK_FLAP, "fault", -60.0),
        (FaultKind.LINK_FLAP, "fault", 60.0),
    ],
)
def test_an_xid_or_a_link_down_is_dated_on_the_jobs_clock(
    kind: FaultKind, shifted: str, off: float
) -> None:
    """The detection an XID 79 or a link going down opens is dated on the job's clock
    (the clock of its host most ahead, that of its steps' ends), like every other
    detection. Before, it took the event's time as its host stamped it: with the faulty
    host a minute behind, the ``rank_missing`` or ``link_flap`` opened a minute before
    the fault, on the job's clock."""
    base = [d for d in _sim_found(kind, shifted, 0.0) if d.state == "open"]
    skewed = [d for d in _sim_found(kind, shifted, off) if d.state == "open"]
    assert [(d.type, d.host, d.step) for d in skewed] == [(d.type, d.host, d.step) for d in base]
    assert len(base) == 1
    assert skewed[0].ts == pytest.approx(base[0].ts + max(off, 0.0), abs=0.01)


@pytest.mark.parametrize(
    ("rank", "claimed", "off"),
    [(8, "node0001", -60.0), (8, "node0001", -3600.0), (0, "node0001", -60.0)],
    ids=["own-rank-60s", "own-rank-1h", "another-hosts-rank-60s"],
)
def test_one_ranks_records_off_do_not_move_a_hosts_clock(
    rank: int, claimed: str, off: float
) -> None:
    """A forger who writes one rank's records with times an hour or a minute early (rank 8,
    node0001's first; or rank 0 of node0000 claiming node0001) must not make the job read
    node0001's samples at the wrong time: with the offset taken from one rank a host, the
    congested NIC's cause was hidden and a healthy host blamed."""
    base = _sim_opens(FaultKind.NIC_CONGESTION, "fault", 0.0)
    assert _sim_opens(FaultKind.NIC_CONGESTION, "fault", off, (rank, claimed)) == base

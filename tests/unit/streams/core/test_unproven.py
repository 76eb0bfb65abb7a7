"""A small compute excess on an oversubscribed CPU-only rank is a suspect until it lasts.

With no GPU telemetry of the rank, "compute longer than its peers" is the cause left
when nothing else explains the excess. A rank that waits for a CPU a large share of its
runnable time has its CPU time inflated by the contention itself (caches, context
switches), just as a compute fault would inflate it; real jobs on a busy machine opened
such incidents for the few seconds of a neighbour's burst. A new incident like that, with
a small excess, waits until its slowness has lasted ``straggler_unproven_seconds``.
"""

from __future__ import annotations

import msgspec
import pytest

from stepwatch.contract import DetectionMessage, StepMessage, encode
from stepwatch.streams.core import DetectConfig, Engine
from stepwatch.streams.replay import replay
from tests.support import paths
from tests.support.detect_synth import Job, drive, opened, with_cpu_times

pytestmark = pytest.mark.unit

NO_GATE = DetectConfig(straggler_unproven_seconds=0.0)
START = 20


def job(
    factor: float, until: int | None = None, wait_share: float | None = 0.5
) -> list[StepMessage]:
    """16 ranks on 2 hosts, 1 s steps, no GPU telemetry; rank 5 computes ``factor`` x
    from step 20 (until ``until``, exclusive)."""
    steps = 120
    last = until if until is not None else steps
    j = Job(world=16, per_host=8, steps=steps, single={(5, s): factor for s in range(START, last)})
    msgs = j.messages()
    return msgs if wait_share is None else with_cpu_times(msgs, wait_share)


def straggler_opens(
    msgs: list[StepMessage], cfg: DetectConfig | None = None
) -> list[DetectionMessage]:
    return [
        d for d in opened(drive(Engine(cfg or DetectConfig()), msgs), "straggler") if d.rank == 5
    ]


def test_a_lasting_small_excess_opens_once_it_has_lasted() -> None:
    msgs = job(1.1)
    (early,) = straggler_opens(msgs, NO_GATE)
    assert early.cause == "gpu" and early.evidence["gpu_telemetry"] == "none", early
    assert (early.score or 0) < DetectConfig().straggler_unproven_excess, early
    assert early.step is not None and early.step < START + 10, early.step
    (late,) = straggler_opens(msgs)
    began = min(r.start for m in msgs for r in m.steps if r.step == START)
    assert late.ts - began >= DetectConfig().straggler_unproven_seconds, late.ts - began
    assert late.ts - began < DetectConfig().straggler_unproven_seconds + 5, late.ts - began
    assert late.cause == "gpu" and late.first_step == early.first_step, (late, early)


def test_a_short_small_excess_stays_a_suspect() -> None:
    msgs = job(1.1, until=START + 20)
    assert straggler_opens(msgs, NO_GATE), "the burst alone would open an incident"
    engine = Engine()
    assert [d for d in opened(drive(engine, msgs)) if d.rank == 5] == []
    assert engine.stats()[0].suspects_total >= 1


@pytest.mark.parametrize(
    "factor,wait_share",
    [
        (1.1, None),  # no CPU times reported: nothing says the CPU is oversubscribed
        (1.1, 0.1),  # the rank seldom waits for a CPU
        (1.3, 0.5),  # a large excess
    ],
)
def test_otherwise_an_incident_opens_as_before(factor: float, wait_share: float | None) -> None:
    msgs = job(factor, wait_share=wait_share)
    (gated,) = straggler_opens(msgs)
    (plain,) = straggler_opens(msgs, NO_GATE)
    assert (gated.step, gated.cause) == (plain.step, plain.cause), (gated, plain)


def _perturbed(name: str, rank: int, first: int, last: int, extra: float) -> list[bytes]:
    """A recorded real run with ``rank``'s forward ``extra`` x longer over steps
    [first, last), the time taken from its wait in the collective and added to its CPU time
    (as the CPU time of a rank that a neighbour's burst slows grows)."""
    out = []
    for line in (paths.FIXTURES / "torch" / f"{name}.jsonl").read_bytes().splitlines():
        m = msgspec.json.decode(line, type=StepMessage)
        recs = []
        for r in m.steps:
            if r.rank == rank and first <= r.step < last and r.phases is not None:
                p = r.phases
                d = extra * (p.forward or 0.0)
                p = msgspec.structs.replace(
                    p, forward=(p.forward or 0.0) + d, comm_wait=max(0.0, (p.comm_wait or 0.0) - d)
                )
                r = msgspec.structs.replace(r, phases=p, cpu_time=(r.cpu_time or 0.0) + d)
            recs.append(r)
        out.append(encode(msgspec.structs.replace(m, steps=recs)))
    return out


def _replayed(lines: list[bytes], cfg: DetectConfig) -> tuple[list[DetectionMessage], Engine]:
    found: list[DetectionMessage] = []
    errors: list[object] = []
    engine = Engine(cfg)
    replay(iter(lines), engine, found.append, lambda n, err, raw: errors.append((n, err)))
    assert errors == [], errors
    return found, engine


def test_a_burst_on_a_real_busy_cpu_only_job_is_a_suspect() -> None:
    """The recorded healthy DDP run on a busy machine (4 ranks on 2 cores), with rank 2's
    forward 20 % longer for 27 steps (~15 s): an incident without the wait, a suspect
    with it."""
    lines = _perturbed("healthy_busy", 2, 30, 57, 0.2)
    plain, _ = _replayed(lines, NO_GATE)
    (d,) = [d for d in plain if d.state == "open"]
    assert (d.type, d.rank, d.cause) == ("straggler", 2, "gpu"), d
    assert d.evidence["gpu_telemetry"] == "none", d.evidence
    found, engine = _replayed(lines, DetectConfig())
    assert [d for d in found if d.state == "open"] == [], found
    assert engine.stats()[0].suspects_total >= 1

"""Real PyTorch DDP jobs (4 ranks, gloo on CPU) through SDK -> agents -> broker -> worker.

Each test runs ``examples/ddp_train.py`` with the DDP integration and a real
slowdown from step ``START``: extra compute in one rank's forward, a slow data
loader on one rank, CPU contention from busy processes pinned (``taskset``) to
the core of host-1's two ranks, or nothing (healthy: no detection). One broker,
stream worker and pair of agents serve the whole module.

All six runs are part of the suite (about a minute each on 2 cores);
``STEPWATCH_TORCH_QUICK=1`` keeps only the healthy and compute runs.
``STEPWATCH_TORCH_RECORD=1`` (any non-empty value) also writes each job's step messages, as the
agents published them, to ``tests/fixtures/torch/`` with their labels (the
replay tests in ``tests/unit/streams/test_replay_torch.py`` read them).
Each run also replays its step messages through the detection core in-process and
logs both; a fault run whose replay finds no incident of the fault (or any run, with
``STEPWATCH_TORCH_TABLE=1``) logs each step's per-host forward+backward and comm_wait.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

torch = pytest.importorskip("torch")

from stepwatch.contract import encode  # noqa: E402
from stepwatch.settings import Settings  # noqa: E402
from tests.support.stream_support import StreamWorker, wait_for  # noqa: E402
from tests.support.torch_jobs import (  # noqa: E402
    RANKS_OF,
    ROOT,
    Agents,
    Fault,
    background_load,
    detections,
    page_after,
    phase_means,
    replay_detections,
    run_job,
    step_messages,
    step_table,
    torch_pipeline,
)

pytestmark = [pytest.mark.integration, pytest.mark.serial]  # timing-sensitive: run alone
log = logging.getLogger(__name__)

STEPS = 100
START = 40
FIXTURES = ROOT / "tests" / "fixtures" / "torch"


@pytest.fixture(scope="module")
def pipeline(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[Settings, Agents, Path, StreamWorker]]:
    work = tmp_path_factory.mktemp("torch")
    with torch_pipeline(work) as (settings, agents, worker):
        yield settings, agents, work, worker


def run_and_detect(
    pipeline: tuple[Settings, Agents, Path, StreamWorker],
    name: str,
    fault: Fault,
    means: dict[int, dict[str, float]] | None = None,
) -> list[dict[str, object]]:
    """Run the job, return its detections; ``means`` receives the per-rank phase
    medians after the fault's start."""
    return run_and_replay(pipeline, name, fault, means)[0]


def run_and_replay(
    pipeline: tuple[Settings, Agents, Path, StreamWorker],
    name: str,
    fault: Fault,
    means: dict[int, dict[str, float]] | None = None,
) -> tuple[list[dict[str, object]], list[dict[str, object]]]:
    """``run_and_detect``, and what the detection core finds in the same step messages
    replayed in-process (as JSON-like dicts)."""
    settings, agents, work, worker = pipeline
    job = f"{name}-{int(time.time())}"
    run_job(agents, job, fault, STEPS, work)
    # the last steps close after the assembly deadline: wait until the worker closed them
    wait_for(
        "the worker closed the job's last step",
        lambda: worker.value("stepwatch_job_last_step", job_id=job) >= STEPS - 1,
        60,
        [worker],
    )
    time.sleep(1)  # the detections of that step are produced right after
    msgs = step_messages(settings, job)
    ranks = {r.rank for m in msgs for r in m.steps}
    assert ranks == {0, 1, 2, 3}, f"steps from ranks {ranks}"
    found = detections(settings, job)
    measured = phase_means(msgs, START + 5, STEPS)
    # what the detection core finds in the same messages, in-process: when the live worker's
    # detections differ, the loss is in the pipeline (or the read), not in the detector
    replayed = [msgspec.to_builtins(d) for d in replay_detections(msgs)]
    emitted = worker.value("stepwatch_stream_detections_total")
    if means is not None:
        means.update(measured)
    log.warning(
        "torch run %s fault=%s detections=%s phases=%s",
        name,
        fault,
        [
            (
                d["type"],
                d["state"],
                d.get("rank"),
                d.get("ranks"),
                d["host"],
                d["cause"],
                d.get("first_step"),
                d.get("step"),
                d.get("related"),
                d.get("summary"),
                _evidence(d),
            )
            for d in found
        ],
        json.dumps(measured),
    )
    log.warning(
        "run %s: replayed in-process %s; worker emitted %d in all",
        name,
        [
            (d["type"], d["state"], d["host"], d["cause"], d.get("first_step"), d["step"])
            for d in replayed
        ],
        emitted,
    )
    if os.environ.get("STEPWATCH_TORCH_RECORD"):
        record(name, fault, msgs, measured)
    if os.environ.get("STEPWATCH_TORCH_TABLE") or (
        fault.rank is not None and not candidates(replayed, fault)
    ):
        # the core found no incident of the fault: keep what it saw, step by step (the
        # run's messages are gone with the test's broker)
        log.warning(
            "run %s: per step and host (forward+backward/comm_wait):\n%s", name, step_table(msgs)
        )
    return found, replayed


def record(name: str, fault: Fault, msgs: list, means: dict) -> None:  # type: ignore[type-arg]
    FIXTURES.mkdir(parents=True, exist_ok=True)
    (FIXTURES / f"{name}.jsonl").write_bytes(b"".join(encode(m) + b"\n" for m in msgs))
    labels_path = FIXTURES / "labels.json"
    labels = json.loads(labels_path.read_text()) if labels_path.exists() else {}
    labels[name] = {
        "fault": fault.kind,
        "rank": fault.rank,
        "host": fault.host,
        "ranks": list(RANKS_OF[fault.host])
        if fault.kind == "cpu" and fault.host
        else ([fault.rank] if fault.rank is not None else []),
        "start_step": fault.start if fault.rank is not None else None,
        "factor": fault.factor,
        "steps": STEPS,
        "world_size": 4,
        "phase_medians_after_start": means,
    }
    labels_path.write_text(json.dumps(labels, indent=1, sort_keys=True) + "\n")


def opened(found: list[dict[str, object]]) -> list[dict[str, object]]:
    """Opened incidents (a detection linked to another one, ``related``, is part of it)."""
    return [d for d in found if d["state"] == "open" and not d.get("related")]


# The estimated onset (first_step) may fall this many steps early. Its accuracy is a
# rate, which the detect bench measures (onset_within_3, every family): here a noisy
# step just before the fault can hold the CUSUM up until the fault, and once in CI
# (a loaded 2-core machine) the onset came out at step 34 for a fault from step 40
# (docs/detection.md, "Known weaknesses"). One persistence window early is allowed;
# the incident must still have opened after the fault began (open_step).
ONSET_TOLERANCE = 8


def candidates(found: list[dict[str, object]], fault: Fault) -> list[dict[str, object]]:
    """Opened incidents on the fault's rank (or its host), opened after the fault began,
    their estimated onset at most ONSET_TOLERANCE steps early and 10 steps late."""
    return [
        d
        for d in opened(found)
        if d.get("host") == fault.host
        and d.get("rank") in (fault.rank, None)
        and fault.start - ONSET_TOLERANCE <= _int(d.get("first_step")) <= fault.start + 10
        and fault.start <= open_step(d)
    ]


def hit(found: list[dict[str, object]], fault: Fault) -> dict[str, object]:
    """The one detection of ``fault`` (see ``candidates``)."""
    mine = candidates(found, fault)
    assert len(mine) == 1, brief(found)
    return mine[0]


BRIEF_KEYS = ("type", "state", "rank", "host", "cause", "first_step")


def brief(found: list[dict[str, object]]) -> list[tuple[object, ...]]:
    """What ``candidates`` reads of each detection, short enough for a failure message."""
    return [(*(d.get(k) for k in BRIEF_KEYS), open_step(d), bool(d.get("related"))) for d in found]


def fault_run(
    pipeline: tuple,  # type: ignore[type-arg]
    name: str,
    fault: Fault,
    means: dict[int, dict[str, float]] | None = None,
) -> list[dict[str, object]]:
    """``run_and_detect`` for a fault, once more when the run's own data did not show it.

    On this loaded 2-core machine a healthy CPU-only job sometimes opens an incident
    of its own (the busy-machine tests above: ranks that share a core with the
    pipeline's processes run more CPU time for the same work, which reads as slower
    compute). One that opened before the fault began is that noise, not the fault's
    detection: the run is repeated once. So is a run whose fault the detection core,
    replayed in-process over the same step messages, does not find as ``hit`` expects
    either (the machine's other work slowed the other ranks too, say: then the data
    hold no such fault). A run whose replay finds it while the live pipeline did not
    fails at once: that is a detection lost (or invented) between the core and the
    detections topic. A second run of either kind fails in ``hit``."""
    found: list[dict[str, object]] = []
    for attempt in range(2):
        found, replayed = run_and_replay(
            pipeline, name if attempt == 0 else f"{name}_again", fault, means
        )
        live, core = len(candidates(found, fault)), len(candidates(replayed, fault))
        assert live == core or core != 1, (
            f"the pipeline's detections differ from the core's on the same messages: {found}"
        )
        early = [d for d in opened(found) if open_step(d) < fault.start]
        if not early and live == 1:
            break
        log.warning(
            "run %s: %d incident(s) opened before the fault began, %d found", name, len(early), live
        )
    return found


def open_step(d: dict[str, object]) -> int:
    """The step at which an incident opened (evidence ``open_step``; an open message's own
    ``step`` otherwise, never its estimated onset)."""
    return _int(_evidence(d).get("open_step", d.get("step")))


def _float(v: object) -> float:
    assert isinstance(v, int | float), v
    return float(v)


def _int(v: object) -> int:
    return int(v) if isinstance(v, int | float) else -1


def _evidence(d: dict[str, object]) -> dict[str, object]:
    ev = d.get("evidence")
    return ev if isinstance(ev, dict) else {}


full = pytest.mark.skipif(
    bool(os.environ.get("STEPWATCH_TORCH_QUICK")),
    reason="STEPWATCH_TORCH_QUICK=1: the healthy and compute runs only",
)


def test_healthy_ddp_job_is_silent(pipeline) -> None:  # type: ignore[no-untyped-def]
    """As on the busy machine below: a CI run on a loaded 2-core machine once opened a real
    CPU-contention straggler (rank 0 waiting for a CPU 0.30 s a step against its peers'
    0.27 s; cause host_input, host_reasons=cpu_contention). Such an incident may happen
    once and must not come back in a second run; anything else fails at once."""
    for attempt in range(2):
        incidents = opened(run_and_detect(pipeline, f"healthy{attempt}", Fault("healthy")))
        if not incidents:
            return
        assert all(_evidence(d).get("host_reasons") == "cpu_contention" for d in incidents), (
            incidents
        )
    assert incidents == []


@full
def test_healthy_job_on_a_busy_machine_never_pages(pipeline) -> None:  # type: ignore[no-untyped-def]
    """Real noise, no fault: DataLoader worker processes, an evaluation pass every 40 steps,
    a checkpoint every 25, and two processes with random bursts of CPU work on the machine's
    cores. No incident lasts long enough for the shipped alert rules to page (their
    ``for:``, read from alerts/), so none pages or reaches the remediator.

    Shorter incidents do open: a burst that shares one rank's core for 15 s slows it for
    real. Where its run-queue wait rises above its peers' the cause is CPU contention; on
    this 2-core machine every rank waits for a CPU about two thirds of the time, so it
    often does not, and the rank's CPU time grows instead, as under a real compute fault
    (the CI run of be3bce8: rank 2 7.1 % more forward time, cause ``gpu``, resolved 16
    steps, 6 s, later). docs/detection.md ("Known limits") gives the measured rate;
    each run logs its incidents."""
    work = pipeline[2]
    options = (
        "--loader-workers",
        "2",
        "--eval-every",
        "40",
        "--checkpoint-dir",
        str(work / "ckpt-busy"),
        "--checkpoint-every",
        "25",
    )
    with background_load(2):
        found = run_and_detect(pipeline, "healthy_busy", Fault("healthy", options=options))
    for d in opened(found):
        ends = [e for e in found if e["id"] == d["id"] and e["state"] == "resolved"]
        assert ends, f"an incident on a healthy job stayed open to the end: {d}"
        lasted = _float(ends[0]["ts"]) - _float(d["ts"])
        assert lasted < page_after(str(d["type"])), (lasted, d)


def test_extra_forward_compute_on_one_rank(pipeline) -> None:  # type: ignore[no-untyped-def]
    fault = Fault("compute", 1, 2.5, START)
    d = hit(fault_run(pipeline, "compute", fault), fault)
    assert (d["type"], d["rank"], d["cause"]) == ("straggler", 1, "gpu"), d


@full
def test_slow_data_loader_on_one_rank(pipeline) -> None:  # type: ignore[no-untyped-def]
    fault = Fault("data", 2, 3.0, START)
    d = hit(fault_run(pipeline, "data", fault), fault)
    assert (d["type"], d["rank"], d["cause"]) == ("straggler", 2, "host_input"), d


@full
def test_cpu_contention_on_one_host(pipeline) -> None:  # type: ignore[no-untyped-def]
    """Busy processes pinned to host-1's core slow both its ranks: one host incident."""
    fault = Fault("cpu", 3, 3.0, START)  # two busy processes
    means: dict[int, dict[str, float]] = {}
    found = fault_run(pipeline, "cpu", fault, means)
    effect = compute_of(means, RANKS_OF["host-1"]) / compute_of(means, RANKS_OF["host-0"]) - 1
    if effect < 0.10:
        # the machine's other load (unpinned) moved to host-0's core: no fault to find
        pytest.skip(f"contention slowed host-1 by only {effect:.0%} on this loaded machine")
    d = hit(found, fault)
    if d["type"] == "job_slowdown":
        # the machine's other work ran on host-0's core while it lasted and slowed host-0
        # as well: the whole job slowed, and the incident names host-1 as its suspect (seen
        # with two bursty busy processes on the machine: host-0 as slow as host-1 for 22 of
        # the first 26 fault steps, 0.15 s forward against 0.075 s alone)
        assert d["host"] == "host-1", d
    elif d["rank"] is None:
        assert d["type"] == "straggler", d
        assert sorted(d["ranks"]) == list(RANKS_OF["host-1"]), d  # type: ignore[call-overload]
    else:
        # one rank crossed the threshold two steps before its neighbour (seen once in
        # make test: rank 3 at step 42): the host-level finding then joins its incident
        assert d["type"] == "straggler", d
        host_level = [
            e
            for e in found
            if e["state"] == "open" and e.get("related") == d["id"] and e["rank"] is None
        ]
        assert [(e["type"], sorted(e["ranks"])) for e in host_level] == [  # type: ignore[call-overload]
            ("straggler", list(RANKS_OF["host-1"]))
        ], found
    # the run-queue wait tells contention from a slower GPU, at the latest once the fault's
    # own steps decide the cause: on the CI machine host-1's core also carries the machine's
    # other work before the fault, and that slowness (14 % more backward from step 36,
    # with no extra run-queue wait: cause gpu) opened the incident at step 40; the update
    # at step 53 read the fault's CPU contention. Cause at open is measured by the detect
    # bench on the recorded runs.
    last = [e for e in found if e.get("id") == d["id"]][-1]
    assert (last["cause"], _evidence(last).get("host_reasons")) == (
        "host_input",
        "cpu_contention",
    ), (last, found)


def compute_of(means: dict[int, dict[str, float]], ranks: tuple[int, ...]) -> float:
    return sum(means[r]["forward"] + means[r]["backward"] for r in ranks) / len(ranks)


@full
def test_plain_loop_without_integration_finds_the_slow_forward(pipeline) -> None:  # type: ignore[no-untyped-def]
    """The README loop, phases only: the wait stays inside backward, busy sums are equal."""
    fault = Fault("compute", 1, 2.5, START, options=("--plain",))
    d = hit(fault_run(pipeline, "compute_plain", fault), fault)
    # On this 2-core machine the two ranks of an emulated host share its cores: the slow
    # rank's extra compute can slow its neighbour enough to be material too (one run in
    # three, before and after this round's changes), and the detector then reports the
    # host with the slow rank as its lead. Either names the rank that is slow.
    assert (d["type"], d["cause"]) == ("straggler", "gpu"), d
    assert d["rank"] == 1 or (d["rank"] is None and _evidence(d).get("lead_rank") == 1), d


@full
def test_fsdp_extra_forward_compute_on_one_rank(pipeline) -> None:  # type: ignore[no-untyped-def]
    fault = Fault("compute", 1, 4.0, START, options=("--parallel", "fsdp"))
    d = hit(fault_run(pipeline, "fsdp_compute", fault), fault)
    assert (d["type"], d["rank"], d["cause"]) == ("straggler", 1, "gpu"), d

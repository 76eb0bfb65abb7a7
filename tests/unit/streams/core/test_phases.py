"""Per-phase peer comparison: a DDP straggler hides in equal sums (the wait is in backward)."""

from __future__ import annotations

import numpy as np
import pytest

from stepwatch.contract import Phases, StepMessage, StepRecord
from stepwatch.streams.core import Engine
from tests.support.detect_synth import T0, drive, num, opened

pytestmark = pytest.mark.unit

WORLD, PER_HOST = 16, 8
DATA, FWD, BWD, OPT, AR = 0.02, 0.30, 0.55, 0.05, 0.08


def ddp_job(
    slow: dict[int, tuple[str, float]],
    steps: int = 60,
    start: int = 20,
    comm: bool = False,
    seed: int = 0,
    cpu_wait: dict[int, float] | None = None,
    wait_share: float = 0.02,
) -> list[StepMessage]:
    """DDP accounting: every rank's backward ends when the slowest rank's gradients are
    reduced, so data + forward + backward + optimizer is equal on every rank.
    ``slow[rank] = (phase, seconds)`` adds work to one phase of one rank from ``start``.
    With ``cpu_wait``, every rank reports its busy time as CPU time, a run-queue wait
    of ``wait_share`` of its runnable time (a busy machine: a rank that computes
    more waits more) plus ``cpu_wait[rank]`` seconds from ``start``."""
    rng = np.random.default_rng(seed)
    out, t = [], T0
    for s in range(steps):
        x = np.array([DATA, FWD, BWD, OPT])[:, None] * (1 + 0.01 * rng.standard_normal((4, WORLD)))
        for rank, (phase, extra) in slow.items():
            if s >= start:
                x[("data", "forward", "backward").index(phase), rank] += extra
        pre = x[0] + x[1] + x[2]
        wait = pre.max() + AR - pre
        if not comm:
            x[2] += wait
        end = t + pre.max() + AR + x[3].max()
        for h in range(WORLD // PER_HOST):
            recs = []
            for r in range(h * PER_HOST, (h + 1) * PER_HOST):
                ph = Phases(
                    data=x[0, r],
                    forward=x[1, r],
                    backward=x[2, r],
                    optimizer=x[3, r],
                    comm_wait=float(wait[r]) if comm else None,
                )
                cw = ct = None
                if cpu_wait is not None:
                    ct = float(pre[r])
                    cw = wait_share / (1 - wait_share) * ct + (
                        cpu_wait.get(r, 0.0) if s >= start else 0.0
                    )
                recs.append(
                    StepRecord(
                        job_id="ddp",
                        rank=r,
                        world_size=WORLD,
                        step=s,
                        start=t,
                        end=end,
                        host=f"h{h}",
                        local_rank=r % PER_HOST,
                        phases=ph,
                        cpu_wait=cw,
                        cpu_time=ct,
                    )
                )
            out.append(StepMessage(host=f"h{h}", ts=end + 0.01, job_id="ddp", steps=recs))
        t = end + 0.001
    return out


def test_ddp_straggler_found_by_its_forward_although_busy_is_equal() -> None:
    found = opened(drive(Engine(), ddp_job({5: ("forward", 0.06)})), "straggler")
    assert [d.rank for d in found] == [5]
    d = found[0]
    assert "forward" in str(d.evidence["phases_longer"])
    assert num(d, "forward_excess") > 0.04
    # equal sums: the busy time of the straggler is not above its peers'
    assert abs(num(d, "busy_s") - num(d, "busy_peer_median_s")) < 0.02
    assert (d.cause, d.fault) == ("gpu", "system")  # compute longer, healthy telemetry


def test_longer_backward_alone_is_not_evidence_without_comm_wait() -> None:
    """Under DDP a longer backward is what waiting looks like: no verdict from it alone."""
    found = opened(drive(Engine(), ddp_job({5: ("backward", 0.08)})), "straggler")
    assert found == []


def test_longer_backward_counts_when_comm_wait_is_measured() -> None:
    found = opened(drive(Engine(), ddp_job({5: ("backward", 0.08)}, comm=True)), "straggler")
    assert [d.rank for d in found] == [5]
    assert "backward" in str(found[0].evidence["phases_longer"])


def test_ddp_data_stall_is_host_input() -> None:
    found = opened(drive(Engine(), ddp_job({3: ("data", 0.08)})), "straggler")
    assert [(d.rank, d.cause) for d in found] == [(3, "host_input")]


def test_healthy_ddp_is_silent() -> None:
    assert opened(drive(Engine(), ddp_job({}, steps=200))) == []


def test_cpu_contention_is_told_from_a_slower_gpu_by_the_run_queue_wait() -> None:
    """Same longer forward; the thread that waited for a CPU for it is CPU contention."""
    slow = {5: ("forward", 0.06)}
    contended = opened(drive(Engine(), ddp_job(slow, cpu_wait={5: 0.05})), "straggler")
    assert [(d.rank, d.cause) for d in contended] == [(5, "host_input")]
    assert contended[0].evidence["host_reasons"] == "cpu_contention"
    assert num(contended[0], "cpu_wait_share_of_excess") >= 0.5
    assert num(contended[0], "cpu_wait_s") > num(contended[0], "cpu_wait_peer_median_s") + 0.04
    gpu = opened(drive(Engine(), ddp_job(slow, cpu_wait={})), "straggler")
    assert [(d.rank, d.cause) for d in gpu] == [(5, "gpu")]
    assert gpu[0].evidence["gpu_reasons"] == "compute"


def test_more_compute_on_a_busy_machine_waits_more_but_not_for_a_larger_share() -> None:
    """Every thread waits 40 % of its runnable time: the rank computing more waits more
    seconds than its peers, at the same share. A slower GPU, not CPU contention."""
    job = ddp_job({5: ("forward", 0.06)}, cpu_wait={}, wait_share=0.4)
    (d,) = opened(drive(Engine(), job), "straggler")
    assert num(d, "cpu_wait_s") > num(d, "cpu_wait_peer_median_s") + 0.03
    assert (d.rank, d.cause, d.evidence["gpu_reasons"]) == (5, "gpu", "compute")


def test_cpu_contention_on_a_host_is_one_host_incident() -> None:
    host1 = range(PER_HOST, 2 * PER_HOST)
    job = ddp_job({r: ("forward", 0.06) for r in host1}, cpu_wait={r: 0.06 for r in host1})
    (d,) = opened(drive(Engine(), job), "straggler")
    assert (d.rank, d.host, sorted(d.ranks)) == (None, "h1", list(host1))
    assert (d.cause, d.evidence["host_reasons"]) == ("host_input", "cpu_contention")

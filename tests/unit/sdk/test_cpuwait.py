"""The step's CPU time and run-queue wait: read from the thread's schedstat, in the record."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import stepwatch
from stepwatch.sdk.cpuwait import SCHEDSTAT, SchedStat
from tests.support.sdk_agent import FakeAgent

pytestmark = pytest.mark.unit
HAS_SCHEDSTAT = os.path.exists(SCHEDSTAT)


def _init(agent: FakeAgent, **kw: object) -> stepwatch.StepWatch:
    return stepwatch.init(
        "job-cpu",
        rank=0,
        world_size=2,
        host="n1",
        agent_socket=agent.path,
        env={},
        background=False,
        job_events=False,
        **kw,
    )  # type: ignore[arg-type]


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        sum(range(1000))


def test_missing_file_is_unavailable_and_never_raises(tmp_path: Path) -> None:
    sched = SchedStat(str(tmp_path / "absent"))
    assert sched.read() is None
    assert sched.start(0) is None and sched.since(None, 1) is None  # stops trying


def test_garbage_file_is_unavailable(tmp_path: Path) -> None:
    f = tmp_path / "schedstat"
    f.write_text("garbage\n")
    assert SchedStat(str(f)).read() is None


def test_reading_is_the_first_two_fields(tmp_path: Path) -> None:
    f = tmp_path / "schedstat"
    f.write_text("669856 116379 3\n")
    assert SchedStat(str(f)).read() == (669856, 116379)


@pytest.mark.skipif(not HAS_SCHEDSTAT, reason="no /proc/thread-self/schedstat here")
def test_step_record_carries_cpu_wait(agent: FakeAgent) -> None:
    sw = _init(agent)
    with sw.step() as s, s.phase("forward"):
        _spin(0.01)
    sw.close()
    (rec,) = [d.step for d in agent.steps()]
    assert rec.cpu_wait is not None and 0 <= rec.cpu_wait <= rec.end - rec.start + 0.01
    # it spun for 10 ms: on a CPU for most of that time it was not waiting
    assert rec.cpu_time is not None and 0.001 < rec.cpu_time <= rec.end - rec.start + 0.01


def test_switched_off_steps_carry_none(agent: FakeAgent) -> None:
    sw = _init(agent, cpu_wait=False)
    with sw.step() as s, s.phase("forward"):
        pass
    sw.close()
    (rec,) = [d.step for d in agent.steps()]
    assert rec.cpu_wait is None and rec.cpu_time is None


@pytest.mark.skipif(not HAS_SCHEDSTAT, reason="no /proc/thread-self/schedstat here")
def test_step_ended_on_another_thread_has_no_cpu_wait(agent: FakeAgent) -> None:
    sw = _init(agent)
    sw.mark("forward")
    t = threading.Thread(target=sw.end_step)
    t.start()
    t.join()
    sw.close()
    (rec,) = [d.step for d in agent.steps()]
    assert rec.cpu_wait is None


@pytest.mark.skipif(
    not HAS_SCHEDSTAT or not hasattr(os, "sched_setaffinity"),
    reason="needs Linux schedstat and CPU affinity",
)
def test_contention_on_the_ranks_core_shows_as_cpu_wait(agent: FakeAgent) -> None:
    """Two busy processes on this thread's core: the thread waits for about 2/3 of the
    time it is runnable (the kernel shares the core); alone it waits much less."""
    core = min(os.sched_getaffinity(0))
    before = os.sched_getaffinity(0)
    sw = _init(agent)
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        for p in busy:
            os.sched_setaffinity(p.pid, {core})
        os.sched_setaffinity(0, {core})
        time.sleep(0.2)  # let them start spinning
        with sw.step() as s, s.phase("forward"):
            _spin(0.5)
    finally:
        for p in busy:
            p.kill()
            p.wait()
        os.sched_setaffinity(0, before)
    sw.close()
    (rec,) = [d.step for d in agent.steps()]
    assert rec.cpu_wait is not None and rec.cpu_time is not None
    assert rec.cpu_wait > 0.3 * (rec.end - rec.start), rec
    # three runnable threads on one core: it waits for more than half its runnable time
    assert rec.cpu_wait / (rec.cpu_wait + rec.cpu_time) > 0.5, rec


class _Counting(SchedStat):
    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    def read(self) -> tuple[int, int]:
        self.reads += 1
        return 10_000 * self.reads, 1000 * self.reads


def test_back_to_back_steps_read_once_each() -> None:
    """A step that starts right after the last one ended counts from that step's reading."""
    sched = _Counting()
    first = sched.start(0)
    assert sched.since(first, 10) == (10_000, 1000)
    second = sched.start(10 + 1000)  # 1 us later: reused
    assert second is not None and second[1:] == (20_000, 2000, 10)
    assert sched.since(second, 20) == (10_000, 1000)
    assert sched.reads == 3
    late = sched.start(20 + 5_000_000)  # 5 ms later (an eval loop between steps): fresh
    assert late is not None and late[2] == 4000 and sched.reads == 4

"""The step's CPU run-queue wait: read from the thread's schedstat, carried in the record."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sdk_agent import FakeAgent

import stepwatch
from stepwatch.sdk.cpuwait import SCHEDSTAT, UNAVAILABLE, RunDelay

pytestmark = pytest.mark.unit
HAS_SCHEDSTAT = os.path.exists(SCHEDSTAT)


@pytest.fixture()
def agent() -> Iterator[FakeAgent]:
    fake = FakeAgent()
    yield fake
    fake.close()


def _init(agent: FakeAgent, **kw: object) -> stepwatch.StepWatch:
    return stepwatch.init("job-cpu", rank=0, world_size=2, host="n1", agent_socket=agent.path,
                          env={}, background=False, job_events=False, **kw)  # type: ignore[arg-type]


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        sum(range(1000))


def test_missing_file_is_unavailable_and_never_raises(tmp_path: Path) -> None:
    delay = RunDelay(str(tmp_path / "absent"))
    assert delay.read() == UNAVAILABLE
    assert delay.read() == UNAVAILABLE  # stops trying


def test_garbage_file_is_unavailable(tmp_path: Path) -> None:
    f = tmp_path / "schedstat"
    f.write_text("garbage\n")
    assert RunDelay(str(f)).read() == UNAVAILABLE


def test_reading_is_the_second_field(tmp_path: Path) -> None:
    f = tmp_path / "schedstat"
    f.write_text("669856 116379 3\n")
    assert RunDelay(str(f)).read() == 116379


@pytest.mark.skipif(not HAS_SCHEDSTAT, reason="no /proc/thread-self/schedstat here")
def test_step_record_carries_cpu_wait(agent: FakeAgent) -> None:
    sw = _init(agent)
    with sw.step() as s, s.phase("forward"):
        _spin(0.01)
    sw.close()
    (rec,) = [d.step for d in agent.steps()]
    assert rec.cpu_wait is not None and 0 <= rec.cpu_wait <= rec.end - rec.start + 0.01


def test_switched_off_steps_carry_none(agent: FakeAgent) -> None:
    sw = _init(agent, cpu_wait=False)
    with sw.step() as s, s.phase("forward"):
        pass
    sw.close()
    (rec,) = [d.step for d in agent.steps()]
    assert rec.cpu_wait is None


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


@pytest.mark.skipif(not HAS_SCHEDSTAT or not hasattr(os, "sched_setaffinity"),
                    reason="needs Linux schedstat and CPU affinity")
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
    assert rec.cpu_wait is not None
    assert rec.cpu_wait > 0.3 * (rec.end - rec.start), rec


class _Counting(RunDelay):
    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    def read(self) -> int:
        self.reads += 1
        return 1000 * self.reads


def test_back_to_back_steps_read_once_each() -> None:
    """A step that starts right after the last one ended counts from that step's reading."""
    delay = _Counting()
    first = delay.start(0)
    assert delay.since(first, 10) == 1000  # 2000 - 1000
    second = delay.start(10 + 1000)  # 1 us later: reused
    assert second == first[:1] + (2000, 10)
    assert delay.since(second, 20) == 1000
    assert delay.reads == 3
    late = delay.start(20 + 5_000_000)  # 5 ms later (an eval loop between steps): fresh
    assert late[1] == 4000 and delay.reads == 4

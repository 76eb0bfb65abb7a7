"""The agent tells of rank processes that end without a job_end (real processes, pidfds)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from stepwatch.agents.collectors.exits import GRACE_SECONDS, ExitWatch
from stepwatch.agents.collectors.proc_events import open_proc_events
from stepwatch.agents.collectors.procfs import ProcFS
from stepwatch.contract import EventType

pytestmark = [
    pytest.mark.unit,
    pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="no pidfds on this system"),
]


@pytest.fixture
def watch() -> Iterator[ExitWatch]:
    w = ExitWatch(ProcFS())
    try:
        yield w
    finally:
        w.close()


@pytest.fixture
def rank() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def start_of(pid: int) -> int:
    start = ProcFS().start_time(pid)
    assert start is not None
    return start


def told(watch: ExitWatch, within: float = 5.0) -> list:  # type: ignore[type-arg]
    """What the watch tells, once an exit is older than the grace (polled)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        events = watch.take("h1", time.time())
        if events:
            return events
        time.sleep(0.05)
    return []


def test_a_killed_rank_is_told_with_its_job_rank_and_time(
    watch: ExitWatch, rank: subprocess.Popen[bytes]
) -> None:
    watch.watch(rank.pid, start_of(rank.pid), "job-1", 2, 0, 41)
    watch.watch(rank.pid, start_of(rank.pid), "job-1", 2, 0, 42)  # a later step: one watch
    assert watch.watched == 1
    killed = time.time()
    rank.kill()  # reaped by the fixture: how it ended is read while it waits for that
    events = told(watch)
    assert [(e.type, e.job_id, e.rank, e.gpu, e.host) for e in events] == [
        (EventType.RANK_EXIT, "job-1", 2, 0, "h1")
    ]
    assert events[0].attrs == {"last_step": 42, "pid": rank.pid, "signal": signal.SIGKILL}
    assert killed - 0.01 <= events[0].ts <= killed + 2.0  # stamped when it ended, not at a tick
    assert watch.watched == 0
    assert watch.take("h1", time.time() + 10) == []  # told once
    assert watch.told == 1


def test_an_exit_is_held_back_for_the_grace(
    watch: ExitWatch, rank: subprocess.Popen[bytes]
) -> None:
    watch.watch(rank.pid, start_of(rank.pid), "job-1", 2, None, 1)
    rank.kill()
    rank.wait()
    deadline = time.monotonic() + 5
    while watch.watched and time.monotonic() < deadline:
        time.sleep(0.02)
    assert watch.take("h1", time.time() - GRACE_SECONDS - 1) == []  # too young yet
    assert len(watch.take("h1", time.time() + GRACE_SECONDS)) == 1


@pytest.mark.parametrize("end_after_exit", [False, True])
def test_a_rank_that_sent_job_end_is_not_told(
    watch: ExitWatch, rank: subprocess.Popen[bytes], end_after_exit: bool
) -> None:
    """Rank 0's job_end: also when the tick reads it after the exit was seen (before, it
    was looked for among live processes only, and rank 0 of every job was told)."""
    watch.watch(rank.pid, start_of(rank.pid), "job-1", 0, 0, 9)
    if not end_after_exit:
        watch.ended(rank.pid, "job-1")
    rank.kill()
    rank.wait()
    deadline = time.monotonic() + 5
    while watch.watched and time.monotonic() < deadline:
        time.sleep(0.02)
    if end_after_exit:
        watch.ended(rank.pid, "job-1")
    assert watch.take("h1", time.time() + 10) == []


def test_a_pid_that_is_another_process_now_is_not_watched(
    watch: ExitWatch, rank: subprocess.Popen[bytes]
) -> None:
    watch.watch(rank.pid, start_of(rank.pid) - 1, "job-1", 2, 0, 1)
    assert watch.watched == 0


def test_a_process_already_gone_is_not_watched(watch: ExitWatch) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    start = start_of(proc.pid)
    proc.wait()
    watch.watch(proc.pid, start, "job-1", 2, 0, 1)
    assert watch.watched == 0


def test_the_bound_holds(rank: subprocess.Popen[bytes]) -> None:
    watch = ExitWatch(ProcFS(), max_watched=1)
    try:
        watch.watch(rank.pid, start_of(rank.pid), "job-1", 2, 0, 1)
        watch.watch(os.getpid(), start_of(os.getpid()), "job-1", 3, 1, 1)
        assert (watch.watched, watch.skipped) == (1, 1)
    finally:
        watch.close()


def test_a_fake_proc_tree_watches_nothing(tmp_path, rank: subprocess.Popen[bytes]) -> None:  # type: ignore[no-untyped-def]
    watch = ExitWatch(ProcFS(tmp_path))
    watch.watch(rank.pid, 1, "job-1", 2, 0, 1)
    assert watch.watched == 0
    watch.close()


def test_one_user_cannot_take_every_watch(rank: subprocess.Popen[bytes]) -> None:
    """Each watch holds one of the agent's descriptors: one user's processes are bounded."""
    watch = ExitWatch(ProcFS(), max_per_user=1)
    try:
        watch.watch(rank.pid, start_of(rank.pid), "job-1", 2, 0, 1, uid=1000)
        watch.watch(os.getpid(), start_of(os.getpid()), "job-1", 3, 1, 1, uid=1000)
        assert (watch.watched, watch.skipped) == (1, 1)
        watch.watch(os.getpid(), start_of(os.getpid()), "job-2", 0, 1, 1, uid=1001)
        assert watch.watched == 2  # another user's rank is still watched
    finally:
        watch.close()


def test_the_bound_is_a_share_of_the_descriptor_limit() -> None:
    import resource

    from stepwatch.agents.collectors.exits import FD_SHARE, MAX_WATCHED, default_bound

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
        assert default_bound() == 256 // FD_SHARE
        assert ExitWatch(ProcFS()).max_watched == 256 // FD_SHARE
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert default_bound() <= MAX_WATCHED


def test_a_child_that_spoke_for_a_live_rank_is_not_its_exit(
    watch: ExitWatch, rank: subprocess.Popen[bytes]
) -> None:
    """A forked child (a data-loader worker) that sent steps as rank 2 ends with its epoch
    while rank 2's own process runs on: no rank_exit."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    watch.watch(rank.pid, start_of(rank.pid), "job-1", 2, 0, 5)
    watch.watch(child.pid, start_of(child.pid), "job-1", 2, 0, 5)
    child.kill()
    child.wait()
    deadline = time.monotonic() + 5
    while watch.watched > 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert watch.take("h1", time.time() + 10) == []
    rank.kill()
    rank.wait()
    assert [e.rank for e in told(watch)] == [2]


def test_one_process_driving_several_ranks_tells_each(
    watch: ExitWatch, rank: subprocess.Popen[bytes]
) -> None:
    """The SDK lets one process drive several ranks: each is told (before, only the last
    rank it sent a step for was, so a cancel never counted as every rank ended)."""
    for r in range(4):
        watch.watch(rank.pid, start_of(rank.pid), "job-1", r, r, 7)
    rank.kill()
    rank.wait()
    assert sorted(e.rank for e in told(watch)) == [0, 1, 2, 3]


def test_a_process_that_ended_one_job_is_watched_for_the_next(
    watch: ExitWatch, rank: subprocess.Popen[bytes]
) -> None:
    watch.watch(rank.pid, start_of(rank.pid), "job-a", 0, 0, 9)
    watch.ended(rank.pid, "job-a")
    watch.watch(rank.pid, start_of(rank.pid), "job-b", 0, 0, 3)
    rank.kill()
    rank.wait()
    assert [(e.job_id, e.rank) for e in told(watch)] == [("job-b", 0)]


def test_a_watch_after_close_holds_nothing(rank: subprocess.Popen[bytes]) -> None:
    watch = ExitWatch(ProcFS())
    watch.close()
    before = len(os.listdir("/proc/self/fd"))
    watch.watch(rank.pid, start_of(rank.pid), "job-1", 2, 0, 1)
    assert watch.watched == 0
    assert len(os.listdir("/proc/self/fd")) == before


@pytest.mark.parametrize(("jobs", "watched"), [(frozenset({"llama"}), 1), (frozenset(), 0)])
def test_only_a_sender_tied_to_a_job_is_watched(
    tmp_path, rank: subprocess.Popen[bytes], jobs: frozenset[str], watched: int
) -> None:  # type: ignore[no-untyped-def]
    """Under --verify-job when_known a process nothing ties to any job may send steps for
    job llama; its exit must not count as llama's rank ending (with every rank's: the job
    ended, its hang unreported)."""
    from stepwatch.agents.collectors.base import HostContext
    from stepwatch.agents.collectors.creds import Creds
    from stepwatch.agents.collectors.procfs import ProcIdentity
    from stepwatch.agents.collectors.senders import Sender
    from stepwatch.agents.collectors.steps import StepsCollector
    from stepwatch.contract import StepRecord
    from stepwatch.contract.wire import RankStep, encode_datagram

    now = time.time()
    steps = StepsCollector(str(tmp_path / "a.sock"), clock=lambda: now)
    try:
        record = StepRecord(
            job_id="llama", rank=3, world_size=8, step=1, start=now - 1, end=now, local_rank=3
        )
        ident = ProcIdentity(rank.pid, start_of(rank.pid), env_jobs=jobs)
        sender = Sender(Creds(rank.pid, os.getuid(), os.getgid()), ident)
        steps.feed(encode_datagram(RankStep(step=record)), sender)
        out = steps.collect(HostContext("node07", now, {}))
        assert sum(len(m.steps) for m in out if hasattr(m, "steps")) == 1  # the step goes on
        assert steps.exits.watched == watched
    finally:
        steps.close()


@pytest.mark.parametrize(
    ("code", "how"),
    [
        ("import os; os.kill(os.getpid(), 11)", {"signal": 11}),
        ("import sys; sys.exit(3)", {"exit_code": 3}),
        ("pass", {"exit_code": 0}),
    ],
)
def test_how_a_rank_ended_is_told_until_it_is_reaped(
    watch: ExitWatch, code: str, how: dict[str, int]
) -> None:
    """The kernel keeps a process's exit status until its parent reaps it (this test
    reaps it only once told): a segfault, an exit code, a clean exit."""
    proc = subprocess.Popen([sys.executable, "-c", f"import time; time.sleep(0.5); {code}"])
    try:
        watch.watch(proc.pid, start_of(proc.pid), "job-1", 1, 0, 7)
        events = told(watch)
        assert [e.attrs for e in events] == [{"last_step": 7, "pid": proc.pid, **how}]
    finally:
        proc.kill()
        proc.wait()


def test_a_reaped_rank_is_told_without_how_it_ended(
    watch: ExitWatch, rank: subprocess.Popen[bytes]
) -> None:
    """Its parent reaped it before the watch read its status, and no process events
    told it (no CAP_NET_ADMIN): the exit alone."""
    watch.proc, watch.proc_events = _Reaped(), lambda: None
    watch.watch(rank.pid, start_of(rank.pid), "job-1", 2, 0, 5)
    rank.kill()
    events = told(watch)
    assert [e.attrs for e in events] == [{"last_step": 5, "pid": rank.pid}]


class _Reaped(ProcFS):
    def exit_status(self, pid: int, start_time: int) -> int | None:
        return None


def test_the_status_is_read_only_until_the_process_is_reaped(
    rank: subprocess.Popen[bytes],
) -> None:
    start, proc = start_of(rank.pid), ProcFS()
    assert proc.exit_status(rank.pid, start) is None  # alive: no status yet
    rank.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 5
    while proc.exit_status(rank.pid, start) is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert proc.exit_status(rank.pid, start) == signal.SIGTERM
    assert proc.exit_status(rank.pid, start + 1) is None  # another process's pid
    rank.wait()
    assert proc.exit_status(rank.pid, start) is None  # reaped


def test_the_kernels_process_events_tell_how_a_rank_reaped_at_once_ended(
    rank: subprocess.Popen[bytes],
) -> None:
    """A parent that reaps its child the moment it ends (``mp.spawn``, torchrun's
    teardown) won the race with the stat read about half the time; the kernel's
    process events queue the status before the pidfd fires. The stat read here
    always loses (``_Reaped``)."""
    probe = open_proc_events()
    if probe is None:
        pytest.skip("no process events here (not root, or not the host's pid namespace)")
    probe.close()
    watch = ExitWatch(_Reaped())
    try:
        watch.watch(rank.pid, start_of(rank.pid), "job-1", 2, 0, 5)
        deadline = time.monotonic() + 5
        while not watch.listening and time.monotonic() < deadline:
            time.sleep(0.01)  # it listens from a thread of its own, once it checked
        rank.kill()
        rank.wait()  # reaped at once
        events = told(watch)
        assert [e.attrs for e in events] == [
            {"last_step": 5, "pid": rank.pid, "signal": signal.SIGKILL}
        ]
    finally:
        watch.close()


@pytest.mark.parametrize("told_first", [False, True])
def test_a_record_read_after_its_process_ended_tells_no_second_exit(
    watch: ExitWatch, rank: subprocess.Popen[bytes], told_first: bool
) -> None:
    """A step record queued before the SIGKILL is read after the exit (a real torchrun
    run told rank 2's exit twice, 40 ms apart): the process, not yet reaped, still
    pins and its start time matches. Before its exit is told the record's step is
    added to it; after, nothing."""
    start = start_of(rank.pid)
    watch.watch(rank.pid, start, "job-1", 2, 0, 12)
    rank.kill()  # not reaped until the fixture's end
    deadline = time.monotonic() + 5
    while watch.watched and time.monotonic() < deadline:
        time.sleep(0.01)
    events = told(watch) if told_first else []
    watch.watch(rank.pid, start, "job-1", 2, 0, 13)  # the late record
    events += told(watch, within=2.0)
    if not told_first:
        assert [e.attrs["last_step"] for e in events] == [13]
    assert len(events) == 1 and watch.told == 1, events
    assert watch.watched == 0

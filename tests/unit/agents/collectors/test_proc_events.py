"""The kernel's process events: exit statuses no parent can reap away (real netlink)."""

from __future__ import annotations

import select
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

import pytest

from stepwatch.agents.collectors.proc_events import (
    PROC_EVENT_EXIT,
    ProcEvents,
    open_proc_events,
    sees,
)

pytestmark = pytest.mark.unit

THREADS_THEN_EXIT = (
    "import sys, threading, time\n"
    "ts = [threading.Thread(target=time.sleep, args=(0.05,)) for _ in range(20)]\n"
    "[t.start() for t in ts]; [t.join() for t in ts]\n"
    "sys.exit(3)\n"
)


@pytest.fixture
def events() -> Iterator[ProcEvents]:
    ev = open_proc_events()
    if ev is None:
        pytest.skip("no process events here (not root, or not the host's pid namespace)")
    try:
        yield ev
    finally:
        ev.close()


def test_events_are_used_only_when_they_tell_a_childs_exit_under_its_pid(
    events: ProcEvents,
) -> None:
    """The events carry the host's pids: in a container's pid namespace a pid with the
    same number is another process. At start the agent runs a child and listens only
    if its exit comes under the pid it knows."""
    assert sees(events, 2.0)
    assert not sees(_OtherPids(events.sock), 0.3)


class _OtherPids(ProcEvents):
    """Events of another pid namespace: none comes under a pid this process knows."""

    def drain(self, wanted: Callable[[int], bool]) -> dict[int, int]:
        return {pid + 100_000: s for pid, s in super().drain(lambda _: True).items()}


def test_an_exit_code_is_told_after_the_parent_reaped(events: ProcEvents) -> None:
    proc = subprocess.Popen([sys.executable, "-c", THREADS_THEN_EXIT])
    proc.wait()  # reaped: /proc has nothing left of it
    told: dict[int, int] = {}
    deadline = time.monotonic() + 5
    while proc.pid not in told and time.monotonic() < deadline:
        select.select([events], [], [], 0.2)
        told.update(events.drain(lambda pid: pid == proc.pid))
    assert told == {proc.pid: 3 << 8}  # a wait status: exit code 3


def test_only_whole_processes_exits_reach_the_socket(events: ProcEvents) -> None:
    """The BPF filter drops forks, execs and the exits of threads (20 here) in the
    kernel: every datagram read is a process's exit."""
    proc = subprocess.Popen([sys.executable, "-c", THREADS_THEN_EXIT])
    proc.wait()
    seen: list[tuple[int, int, int]] = []
    deadline = time.monotonic() + 5
    while proc.pid not in [p for _, p, _ in seen] and time.monotonic() < deadline:
        select.select([events], [], [], 0.2)
        try:
            while True:
                data = events.sock.recv(4096)
                (what,) = struct.unpack_from("=I", data, 36)
                pid, tgid = struct.unpack_from("=ii", data, 52)
                seen.append((what, pid, tgid))
        except BlockingIOError:
            pass
    assert (PROC_EVENT_EXIT, proc.pid, proc.pid) in seen
    assert all(what == PROC_EVENT_EXIT and pid == tgid for what, pid, tgid in seen), seen

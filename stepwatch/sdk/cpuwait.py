"""CPU time and run-queue wait of the training thread over each step (Linux).

Linux accounts, per thread, the time spent running on a CPU and the time spent
runnable on a run queue without running (``/proc/thread-self/schedstat``: the
first two fields, nanoseconds; present whenever the kernel has
``CONFIG_SCHED_INFO``, which every distribution kernel has). Their growth over
a step is the step's ``cpu_time`` and ``cpu_wait``. On a machine with enough
cores the wait is near 0; when other processes compete for the rank's CPU (a
stray process, an over-subscribed node, data-loader workers pinned to the same
cores) the thread waits for a larger share of the time it could run. That share,
``cpu_wait / (cpu_time + cpu_wait)``, compared with the peers', tells CPU
contention apart from slower compute, which the phase durations alone cannot:
a rank that merely computes more waits more in proportion, at the same share.

A read is one ``pread`` of an already open file (1-2 us on an idle machine, up
to 5 us under load), one per step in a loop. The file is opened once per
thread (``/proc/thread-self`` names the thread that opens it). Where it cannot
be read (another OS, a hardened ``/proc``), steps carry neither field; nothing
is raised.
"""

from __future__ import annotations

import os
import threading
from threading import get_ident

SCHEDSTAT = "/proc/thread-self/schedstat"
REUSE_NS = 1_000_000  # a step starting within 1 ms of the last one's end reuses its reading

# (thread ident, cumulative on-CPU ns, cumulative run-queue wait ns, perf_counter_ns)
Reading = tuple[int, int, int, int]
# (on-CPU ns, run-queue wait ns) over one step
Usage = tuple[int, int]


class _ThreadFile:
    """One thread's open schedstat file, closed when the thread's local state goes."""

    __slots__ = ("fd",)

    def __init__(self, path: str) -> None:
        self.fd = -1
        self.fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)

    def __del__(self) -> None:
        if self.fd >= 0:
            try:
                os.close(self.fd)
            except OSError:
                pass


class SchedStat:
    """Readings of the calling thread's cumulative CPU time and run-queue wait.

    One read per step in a loop: a step that starts right after the previous one
    ended on the same thread starts from that step's closing reading.
    """

    def __init__(self, path: str = SCHEDSTAT) -> None:
        self._path = path
        self._local = threading.local()
        self._broken = False
        self._last: Reading | None = None

    def read(self) -> tuple[int, int] | None:
        """The calling thread's cumulative (on-CPU ns, wait ns), None when unreadable."""
        if self._broken:
            return None
        try:
            f = getattr(self._local, "file", None)
            if f is None:
                f = self._local.file = _ThreadFile(self._path)
            fields = os.pread(f.fd, 64, 0).split()
            return int(fields[0]), int(fields[1])
        except (OSError, ValueError, IndexError):
            self._broken = True  # absent or unreadable here: stop trying
            return None

    def start(self, now_ns: int) -> Reading | None:
        """The reading a step starting at ``now_ns`` (perf_counter_ns) counts from."""
        ident = get_ident()
        last = self._last
        if last is not None and last[0] == ident and now_ns - last[3] < REUSE_NS:
            return last
        value = self.read()
        return None if value is None else (ident, value[0], value[1], now_ns)

    def since(self, first: Reading | None, end_ns: int) -> Usage | None:
        """(on-CPU ns, wait ns) from ``first`` to now; None without a reading or on
        another thread than the one ``first`` was read on."""
        ident = get_ident()
        if first is None or first[0] != ident:
            return None
        value = self.read()
        if value is None:
            return None
        self._last = (ident, value[0], value[1], end_ns)
        ran, waited = value[0] - first[1], value[1] - first[2]
        return (ran, waited) if ran >= 0 and waited >= 0 else None


def seconds(usage: Usage | None) -> tuple[float | None, float | None]:
    """(cpu_time, cpu_wait) in seconds; (None, None) when not measured."""
    if usage is None:
        return None, None
    return usage[0] / 1e9, usage[1] / 1e9

"""Run-queue wait of the training thread: how long it was ready to run but had no CPU.

Linux accounts, per thread, the time spent runnable on a run queue without
running (``/proc/thread-self/schedstat``, second field, nanoseconds; present
whenever the kernel has ``CONFIG_SCHED_INFO``, which every distribution kernel
has). Its growth over a step is the step's ``cpu_wait``: near 0 on an idle
core, a large share of the step when other processes compete for the rank's
CPU (a stray process, an over-subscribed node, data-loader workers pinned to
the same cores). It tells CPU contention apart from slower compute, which the
phase durations alone cannot.

A read is one ``pread`` of an already open file (1-2 us on an idle machine, up
to 5 us under load), one per step in a loop. The file is opened once per
thread (``/proc/thread-self`` names the thread that opens it).
Where it cannot be read (another OS, a hardened ``/proc``), every reading is
``-1`` and steps carry no ``cpu_wait``; nothing is raised.
"""

from __future__ import annotations

import os
import threading
from threading import get_ident

SCHEDSTAT = "/proc/thread-self/schedstat"
UNAVAILABLE = -1


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


# (thread ident, cumulative wait ns, perf_counter_ns of the reading)
Reading = tuple[int, int, int]
REUSE_NS = 1_000_000  # a step starting within 1 ms of the last one's end reuses its reading


class RunDelay:
    """Readings of the calling thread's cumulative run-queue wait (ns).

    One read per step in a loop: a step that starts right after the previous one
    ended on the same thread starts from that step's closing reading.
    """

    def __init__(self, path: str = SCHEDSTAT) -> None:
        self._path = path
        self._local = threading.local()
        self._broken = False
        self._last: Reading | None = None

    def read(self) -> int:
        """The calling thread's cumulative run-queue wait in ns, or ``UNAVAILABLE``."""
        if self._broken:
            return UNAVAILABLE
        try:
            f = getattr(self._local, "file", None)
            if f is None:
                f = self._local.file = _ThreadFile(self._path)
            return int(os.pread(f.fd, 64, 0).split()[1])
        except (OSError, ValueError, IndexError):
            self._broken = True  # absent or unreadable here: stop trying
            return UNAVAILABLE

    def start(self, now_ns: int) -> Reading:
        """The reading a step starting at ``now_ns`` (perf_counter_ns) counts from."""
        ident = get_ident()
        last = self._last
        if last is not None and last[0] == ident and now_ns - last[2] < REUSE_NS:
            return last
        return ident, self.read(), now_ns

    def since(self, first: Reading, end_ns: int) -> int:
        """The wait (ns) from ``first`` to now, or ``UNAVAILABLE`` (no reading, or another
        thread than the one ``first`` was read on)."""
        ident = get_ident()
        if first[1] < 0 or first[0] != ident:
            return UNAVAILABLE
        value = self.read()
        self._last = (ident, value, end_ns)
        return value - first[1] if value >= first[1] else UNAVAILABLE


def wait_seconds(wait_ns: int) -> float | None:
    """A measured wait in seconds; None when it was not measured (negative)."""
    return wait_ns / 1e9 if wait_ns >= 0 else None

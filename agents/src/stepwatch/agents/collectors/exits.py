"""Rank processes that end without the SDK's ``job_end``: the agent says so (``rank_exit``).

A rank killed by a signal (``kill -9``, the kernel's OOM killer, a segfault in a
library) sends nothing more: no ``job_end``, no exception. Its peers then fail in
their next collective (gloo: "Connection closed by peer"), or block there, and
their own exceptions were all the stream worker had: a real two-node job whose
rank 2 was killed was reported as a ``user_error`` of rank 1.

The steps collector hands each process whose step records it admitted (its
identity read from /proc at receipt, so its pid is known to be that process, and
tying it to a job: a process tied to none says nothing of any job's rank) to
:class:`ExitWatch`, which holds a pidfd for it (Linux 5.3+) and waits on all of
them in one thread (``epoll``): the kernel marks a pidfd readable the moment its
process exits, so the exit is stamped within the thread's wake-up, not a tick. A
pidfd is opened only when the process's start time still matches the one read at
receipt (pids are reused). At the next tick each exit becomes one ``rank_exit``
event of the rank's job (``detail`` "process ended without job_end", ``attrs``
``last_step`` and ``pid``, and ``signal`` or ``exit_code``: how it ended, from
the kernel's process events where the agent may listen (proc_events.py), else
read from its stat as the thread wakes, while it waits for its parent to reap it),
unless the process sent a ``job_end`` first (rank 0, at
its ``close``) or another process that spoke for the same job and rank still runs (a
forked child that sent steps, a data-loader worker ending with its epoch). Other
ranks end without one when the job ends well, so an exit alone means nothing to the
stream worker: docs/detection.md, "Dead ranks".

Without pidfds (an older kernel, a fake /proc in tests) or without the senders'
identities (``--verify-job off``, senders in another pid namespace) nothing is
watched. Each watched process holds a descriptor of the agent's, so at most
:data:`MAX_WATCHED` are held, and no more than a quarter of the agent's
descriptor limit (``RLIMIT_NOFILE``), and :data:`MAX_PER_USER` of one user's:
a user who kept a thousand processes alive, each sending a step, would
otherwise have taken the descriptors the agent's Kafka connections and spool
need.
"""

from __future__ import annotations

import logging
import os
import resource
import select
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from stepwatch.agents.collectors.proc_events import ProcEvents, open_proc_events
from stepwatch.agents.collectors.procfs import ProcFS
from stepwatch.contract import EventMessage, EventType

log = logging.getLogger(__name__)

MAX_WATCHED = 1024  # processes watched at once (a descriptor each) ...
FD_SHARE = 4  # ... and at most this share of the agent's descriptor limit (1 / FD_SHARE)
MAX_PER_USER = 64  # processes of one user watched at once (a node's ranks are a few)
POLL_SECONDS = 1.0  # the watcher thread's wait: how soon it notices close()
# an exit is told this long after it at the earliest: a job_end the process sent just
# before it ended is read from the socket by then (it must not read as a failure)
GRACE_SECONDS = 0.5


def default_bound() -> int:
    """MAX_WATCHED, or a quarter of the descriptor limit when that is less."""
    try:
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (OSError, ValueError):
        return MAX_WATCHED
    if soft == resource.RLIM_INFINITY or soft <= 0:
        return MAX_WATCHED
    return max(1, min(MAX_WATCHED, soft // FD_SHARE))


@dataclass
class Watched:
    """One rank process: the ranks it spoke for (one process may drive several) and
    the jobs it sent a ``job_end`` for."""

    pid: int
    start_time: int
    uid: int = -1
    ranks: dict[tuple[str, int], tuple[int | None, int]] = field(default_factory=dict)
    ended: set[str] = field(default_factory=set)  # jobs whose job_end it sent


@dataclass
class ExitWatch:
    """See the module docstring. ``watch``, ``ended`` and ``take`` are called by the
    agent's tick; the exits are seen by a thread of its own."""

    proc: ProcFS = field(default_factory=ProcFS)
    clock: Callable[[], float] = time.time
    max_watched: int = field(default_factory=lambda: default_bound())
    max_per_user: int = MAX_PER_USER
    skipped: int = 0  # processes not watched: over a bound
    told: int = 0  # rank_exit events made
    _by_pid: dict[int, Watched] = field(default_factory=dict)
    _by_fd: dict[int, Watched] = field(default_factory=dict)
    _exited: list[tuple[Watched, float, dict[str, int]]] = field(default_factory=list)
    # exit statuses the kernel's process events told, of watched or exited pids
    proc_events: Callable[[], ProcEvents | None] = open_proc_events
    _events: ProcEvents | None = None
    _status: dict[int, int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stop: threading.Event = field(default_factory=threading.Event)
    _epoll: select.epoll | None = None
    _thread: threading.Thread | None = None

    def watch(
        self,
        pid: int,
        start_time: int,
        job_id: str,
        rank: int,
        gpu: int | None,
        step: int,
        uid: int = -1,
    ) -> None:
        """A record from process ``pid`` (started at ``start_time``, of user ``uid``) was
        admitted, for ``rank`` of ``job_id``."""
        if self._stop.is_set():
            return
        with self._lock:
            known = self._by_pid.get(pid)
            if known is not None and known.start_time == start_time:
                _note(known, job_id, rank, gpu, step)
                return
            for gone, _, _ in self._exited:  # a record read after its process ended
                if gone.pid == pid and gone.start_time == start_time:
                    _note(gone, job_id, rank, gpu, step)
                    return
            mine = sum(1 for w in self._by_pid.values() if w.uid == uid)
            if len(self._by_pid) >= self.max_watched or mine >= self.max_per_user:
                self.skipped += 1
                return
        fd = self.proc.pin(pid)
        if fd < 0:
            return  # no pidfds here, or the process is gone
        if not self.proc.alive_as(pid, start_time):
            os.close(fd)  # another process has the pid, or it ended (its exit told already)
            return
        w = Watched(pid, start_time, uid)
        _note(w, job_id, rank, gpu, step)
        self._start()
        with self._lock:
            try:
                assert self._epoll is not None
                self._epoll.register(fd, select.EPOLLIN)
            except (OSError, ValueError):  # closed meanwhile
                os.close(fd)
                return
            self._by_pid[pid] = w
            self._by_fd[fd] = w
            self._status.pop(pid, None)  # an earlier process's with this pid

    def ended(self, pid: int, job_id: str) -> None:
        """Process ``pid`` sent ``job_id``'s job_end: its exit says nothing of a failure
        of that job (another job it runs later is watched on)."""
        with self._lock:
            w = self._by_pid.get(pid)
            if w is not None:
                w.ended.add(job_id)
            for gone, _, _ in self._exited:  # it ended before its last datagram was read
                if gone.pid == pid:
                    gone.ended.add(job_id)

    def take(self, host: str, now: float) -> list[EventMessage]:
        """One ``rank_exit`` event per rank whose process ended, at least GRACE_SECONDS
        before ``now``, without its job's job_end (those ended later wait for the next
        call), unless another live process speaks for the same job and rank."""
        with self._lock:
            due = [
                (w, t, how or _decoded(self._status.pop(w.pid, None)))
                for w, t, how in self._exited
                if t <= now - GRACE_SECONDS
            ]
            self._exited = [x for x in self._exited if x[1] > now - GRACE_SECONDS]
            for w, _, _ in due:
                self._status.pop(w.pid, None)
            live = {key for w in self._by_pid.values() for key in w.ranks}
        events = [
            EventMessage(
                host=host,
                ts=t,
                type=EventType.RANK_EXIT,
                job_id=job,
                rank=rank,
                gpu=gpu,
                detail="process ended without job_end",
                attrs={"last_step": step, "pid": w.pid, **how},
            )
            for w, t, how in due
            for (job, rank), (gpu, step) in w.ranks.items()
            if job not in w.ended and (job, rank) not in live
        ]
        self.told += len(events)
        return events

    @property
    def watched(self) -> int:
        return len(self._by_pid)

    @property
    def listening(self) -> bool:
        """Whether the kernel's process events tell exit statuses (proc_events.py)."""
        return self._events is not None

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2 * POLL_SECONDS)
        with self._lock:
            for fd in self._by_fd:
                os.close(fd)
            self._by_fd.clear()
            self._by_pid.clear()
        if self._epoll is not None:
            self._epoll.close()
        with self._lock:
            events, self._events = self._events, None
        if events is not None:
            events.close()

    # ------------------------------------------------------------------ watcher thread
    def _start(self) -> None:
        if self._thread is not None or self._stop.is_set():
            return
        self._epoll = select.epoll()
        self._thread = threading.Thread(target=self._run, name="stepwatch-exits", daemon=True)
        self._thread.start()
        if self.proc.live:  # its check runs a child: not in the caller's way, nor the watch's
            threading.Thread(
                target=self._listen, name="stepwatch-exits-events", daemon=True
            ).start()

    def _listen(self) -> None:
        """Listen to the kernel's process events, where this agent may (proc_events.py)."""
        events = self.proc_events()
        if events is None:
            return
        with self._lock:
            if self._stop.is_set() or self._epoll is None:
                events.close()
                return
            try:
                self._epoll.register(events.fileno(), select.EPOLLIN)
            except (OSError, ValueError):  # closed meanwhile
                events.close()
                return
            self._events = events

    def _run(self) -> None:
        assert self._epoll is not None
        while not self._stop.is_set():
            try:
                ready = self._epoll.poll(POLL_SECONDS)
            except OSError:
                return  # closed under us
            if ready:
                t = self.clock()
                fds = [fd for fd, _ in ready]
                self._statuses(fds)  # first: a pidfd's exit may be among them
                self._exits(fds, t)

    def _statuses(self, fds: list[int]) -> None:
        with self._lock:
            events = self._events
            if events is None or events.fileno() not in fds:
                return
            exited = {w.pid for w, _, _ in self._exited}
            self._status.update(events.drain(lambda pid: pid in self._by_pid or pid in exited))

    def _exits(self, fds: list[int], t: float) -> None:
        with self._lock:
            for fd in fds:
                w = self._by_fd.pop(fd, None)
                if w is None:
                    continue
                if self._by_pid.get(w.pid) is w:
                    del self._by_pid[w.pid]
                self._exited.append((w, t, self._how(w)))
                try:
                    assert self._epoll is not None
                    self._epoll.unregister(fd)
                except (OSError, ValueError):
                    pass
                os.close(fd)

    def _how(self, w: Watched) -> dict[str, int]:
        """How ``w`` ended (``signal`` or ``exit_code``): the kernel's process events
        told it, or read from its stat before its parent reaps it; {} once reaped, or
        where the kernel would show this agent 0 (another user's process, the agent
        not root): ``take`` looks at the events again."""
        status = self._status.pop(w.pid, None)
        if status is None and (os.geteuid() == 0 or w.uid == os.geteuid()):
            status = self.proc.exit_status(w.pid, w.start_time)
        return _decoded(status)


def _decoded(status: int | None) -> dict[str, int]:
    """A wait status as ``rank_exit`` attributes: the signal that ended the process, or
    its exit code; {} when unknown."""
    if status is None:
        return {}
    if status & 0x7F:
        return {"signal": status & 0x7F}
    return {"exit_code": (status >> 8) & 0xFF}


def _note(w: Watched, job_id: str, rank: int, gpu: int | None, step: int) -> None:
    """Process ``w`` spoke for ``rank`` of ``job_id`` at ``step``."""
    old = w.ranks.get((job_id, rank))
    w.ranks[(job_id, rank)] = (gpu, step if old is None else max(old[1], step))

"""The steps collector: the agent's end of the SDK's Unix datagram socket.

Training ranks on the host send one datagram per step (and per discrete event)
to ``Settings.agent_socket`` (see :mod:`stepwatch.sdk.wire`). A reader thread
receives and decodes them into a bounded buffer (the kernel's datagram queue
is short: ``net.unix.max_dgram_qlen`` is often 10), and each tick
:meth:`StepsCollector.collect` turns what arrived into one ``StepMessage`` per
job plus one ``EventMessage`` per rank event. Garbage is counted by reason and
logged once; nothing here can stop the agent.

The collector also learns which job (and rank) owns each local GPU from the
step records (``gpu``, or ``local_rank`` when ``gpu`` is absent), so the agent
can attribute GPU and port samples to a job (``HostContext.job_of_gpu``).
"""

from __future__ import annotations

import logging
import os
import socket
import stat
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from pathlib import Path

import msgspec

from stepwatch.agents.collectors.base import CollectorHealth, HealthState, HostContext
from stepwatch.contract import (
    EventMessage,
    EventType,
    Message,
    StepMessage,
    StepRecord,
    check_step,
    check_values,
)
from stepwatch.errors import CollectorError, ContractError
from stepwatch.logs import LogOnce
from stepwatch.sdk.wire import MAX_DATAGRAM_BYTES, RankEvent, RankStep, decode_datagram

log = logging.getLogger(__name__)

MAX_BUFFERED = 100_000  # datagrams held between two ticks; beyond: dropped and counted
GPU_OWNER_TTL = 600.0  # seconds without a step before a GPU's job mapping is forgotten
REBIND_SECONDS = 30.0
RECV_BUFFER_BYTES = 4 * 1024 * 1024


class StepsCollector:
    """Receives SDK datagrams on a Unix socket; see the module docstring."""

    name = "steps"

    def __init__(self, path: str, *, max_buffered: int = MAX_BUFFERED,
                 clock: Callable[[], float] = time.time, mode: int = 0o666) -> None:
        self.path = path
        self._max = max_buffered
        self._clock = clock
        self._mode = mode
        self._log = LogOnce(log)
        self._buf: deque[bytes] = deque()  # raw datagrams: appended by the reader, popped by collect
        self._overflow = 0
        self._owners: dict[int, tuple[str, int, float]] = {}  # gpu -> (job, rank, last seen)
        self.steps_received = 0
        self.events_received = 0
        self.rejected: Counter[str] = Counter()
        self._errors = 0
        self._rejected_seen = 0  # rejections already reported by health()
        self._last_error = ""
        self._sock: socket.socket | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._next_bind = 0.0
        self._bind()

    # ------------------------------------------------------------------ socket
    def _bind(self) -> None:
        self._next_bind = time.monotonic() + REBIND_SECONDS
        try:
            self._sock = _bind_socket(self.path, self._mode)
        except (OSError, CollectorError) as err:
            self._fail("bind", f"cannot listen on {self.path}: {err}")
            return
        self._thread = threading.Thread(target=self._read_loop, name="stepwatch-steps", daemon=True)
        self._thread.start()
        log.info("steps socket listening path=%s", self.path)

    def _read_loop(self) -> None:
        """Only receive here (the kernel queue is short): decoding happens in collect()."""
        sock, buf, limit, stop = self._sock, self._buf, self._max, self._stop
        assert sock is not None
        recv = sock.recv
        while not stop.is_set():
            try:
                data = recv(MAX_DATAGRAM_BYTES + 1)
            except TimeoutError:
                continue
            except OSError as err:
                if not stop.is_set():
                    self._fail("recv", f"receive failed on {self.path}: {err!r}")
                return
            if len(buf) < limit:
                buf.append(data)
            else:
                self._overflow += 1

    def feed(self, data: bytes) -> None:
        """Queue one datagram as if it came from the socket (tests, replays)."""
        if len(self._buf) < self._max:
            self._buf.append(data)
        else:
            self._overflow += 1

    def _decode(self, data: bytes) -> RankStep | RankEvent | None:
        try:
            item = decode_datagram(data)
            if isinstance(item, RankStep):
                check_step(item.step, self._clock())
            else:
                check_values(_event(item, "-"), self._clock())
        except ContractError as err:
            self.rejected[err.reason] += 1
            self._log("reject:" + err.reason, "datagram rejected reason=%s detail=%s",
                      err.reason, err.detail[:200])
            return None
        return item

    # ------------------------------------------------------------------ Collector
    def collect(self, ctx: HostContext) -> list[Message]:
        if self._sock is None and time.monotonic() >= self._next_bind:
            self._bind()
        self._take_overflow()
        by_job: dict[str, list[StepRecord]] = {}
        events: list[Message] = []
        buf = self._buf
        for _ in range(len(buf)):
            item = self._decode(buf.popleft())
            if item is None:
                continue
            if isinstance(item, RankStep):
                record = item.step if item.step.host else msgspec.structs.replace(item.step, host=ctx.host)
                by_job.setdefault(record.job_id, []).append(record)
                self._own(record, ctx.now)
            else:
                events.append(_event(item, ctx.host))
                if item.type is EventType.JOB_END:
                    self._release(item.job_id)
        self.steps_received += sum(len(v) for v in by_job.values())
        self.events_received += len(events)
        steps: list[Message] = [StepMessage(host=ctx.host, ts=ctx.now, job_id=job, steps=recs)
                                for job, recs in by_job.items()]
        self._expire(ctx.now)
        return steps + events

    def _take_overflow(self) -> None:
        overflow, self._overflow = self._overflow, 0  # a rare race only miscounts by one
        if overflow:
            self.rejected["buffer_full"] += overflow
            self._log("buffer_full", "steps buffer full, datagrams dropped count=%d max=%d",
                      overflow, self._max)

    def health(self) -> CollectorHealth:
        reading = self._thread is not None and self._thread.is_alive()
        if self._sock is None or not reading:
            state = HealthState.DOWN
        else:
            rejected = sum(self.rejected.values())
            state = HealthState.DEGRADED if rejected > self._rejected_seen else HealthState.OK
            self._rejected_seen = rejected
        return CollectorHealth(state, self._errors, self._last_error)

    def close(self) -> None:
        self._stop.set()
        sock, self._sock = self._sock, None
        if sock is not None:
            _wake(self.path)
            if self._thread is not None:
                self._thread.join(timeout=2.0)
            sock.close()
            try:
                os.unlink(self.path)
            except OSError:
                pass

    # ------------------------------------------------------------------ GPU ownership
    def job_of_gpu(self) -> dict[int, str]:
        return {gpu: job for gpu, (job, _rank, _seen) in self._owners.items()}

    def owners(self) -> dict[int, tuple[str, int]]:
        """GPU index -> (job id, rank) for the GPUs seen in recent steps."""
        return {gpu: (job, rank) for gpu, (job, rank, _seen) in self._owners.items()}

    def _own(self, record: StepRecord, now: float) -> None:
        gpu = record.gpu if record.gpu is not None else record.local_rank
        self._owners[gpu] = (record.job_id, record.rank, now)

    def _release(self, job_id: str) -> None:
        for gpu in [g for g, (job, _, _) in self._owners.items() if job == job_id]:
            del self._owners[gpu]

    def _expire(self, now: float) -> None:
        for gpu in [g for g, (_, _, seen) in self._owners.items() if now - seen > GPU_OWNER_TTL]:
            del self._owners[gpu]

    def _fail(self, key: str, message: str) -> None:
        self._errors += 1
        self._last_error = message
        self._log(key, "steps collector: %s", message, level=logging.ERROR)


def _event(item: RankEvent, host: str) -> EventMessage:
    return EventMessage(host=host, ts=item.ts, type=item.type, job_id=item.job_id,
                        rank=item.rank, gpu=item.gpu, code=item.code, detail=item.detail,
                        attrs=dict(item.attrs))


def _bind_socket(path: str, mode: int) -> socket.socket:
    """Bind a datagram socket at ``path``: create its directory, clear a stale socket."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        st = target.lstat()
    except FileNotFoundError:
        st = None
    if st is not None:
        if not stat.S_ISSOCK(st.st_mode):
            raise CollectorError(f"{path} exists and is not a socket: not removing it")
        if _alive(path):
            raise CollectorError(f"another process is listening on {path}")
        target.unlink()
        log.info("stale agent socket removed path=%s", path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECV_BUFFER_BYTES)
        sock.bind(path)
        os.chmod(path, mode)
        sock.settimeout(1.0)
    except OSError:
        sock.close()
        raise
    return sock


def _wake(path: str) -> None:
    """Unblock the reader thread with an empty datagram."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as waker:
            waker.sendto(b"", path)
    except OSError:
        pass


def _alive(path: str) -> bool:
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        probe.connect(path)
    except OSError:
        return False
    finally:
        probe.close()
    return True

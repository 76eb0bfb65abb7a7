"""The steps collector: the agent's end of the SDK's Unix datagram socket.

Training ranks on the host send one datagram per step (and per discrete event)
to ``Settings.agent_socket`` (see :mod:`stepwatch.contract.wire`). A reader thread
receives and decodes them into a bounded buffer (the kernel's datagram queue
is short: ``net.unix.max_dgram_qlen`` is often 10), and each tick
:meth:`StepsCollector.collect` turns what arrived into one ``StepMessage`` per
job plus one ``EventMessage`` per rank event. Garbage is counted by reason and
logged once; nothing here can stop the agent.

The collector also learns which job (and rank) owns each local GPU from the
step records (``gpu``, or ``local_rank`` when ``gpu`` is absent), so the agent
can attribute GPU and port samples to a job (``HostContext.job_of_gpu``).

The socket is a trust boundary (docs/security.md, "Boundary 1"): it lives in a
directory of its own (created 0750) and is itself 0620, both of the
configured group, so only the agent's user and that group can send; the
kernel tells the agent each datagram's sender (``SO_PASSCRED``) and
:class:`~stepwatch.agents.collectors.senders.SenderGate` rate-limits senders
and rejects records that claim another host, job or rank (counted by reason).
The agent stamps its own host on everything. A job's steps of one tick are
split into several messages of at most ``max_message_bytes`` each.
"""

from __future__ import annotations

import grp
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
from stepwatch.agents.collectors.creds import enable_passcred, recv_with_creds
from stepwatch.agents.collectors.exits import ExitWatch
from stepwatch.agents.collectors.senders import LOCAL, Sender, SenderGate
from stepwatch.contract import (
    EventMessage,
    EventType,
    Message,
    StepMessage,
    StepRecord,
    check_step,
    check_values,
    plain_text,
)
from stepwatch.contract.wire import MAX_DATAGRAM_BYTES, RankEvent, RankStep, decode_datagram
from stepwatch.errors import CollectorError, ConfigError, ContractError
from stepwatch.logs import LogOnce

log = logging.getLogger(__name__)

MAX_BUFFERED = 100_000  # datagrams held between two ticks; beyond: dropped and counted
GPU_OWNER_TTL = 600.0  # seconds without a step before a GPU's job mapping is forgotten
REBIND_SECONDS = 30.0
RECV_BUFFER_BYTES = 4 * 1024 * 1024
SOCKET_MODE = 0o620  # owner and group may send; nobody else
DIR_MODE = 0o750
MAX_MESSAGE_BYTES = 256 * 1024
ENVELOPE_BYTES = 1024  # a step message's own fields, beyond its records
# A step record's times, against the agent's clock. Within the stream worker's window
# (120 s ahead, 24 h back, against its own clock) with room for the clocks' offset, so
# that what the worker would refuse never leaves the node (before, the worker refused a
# whole message for one such record: every record of its job from this host in that
# tick; it now refuses the record alone, for other producers too).
STEP_AHEAD_S = 60.0
STEP_BEHIND_S = 12 * 3600.0


class StepsCollector:
    """Receives SDK datagrams on a Unix socket; see the module docstring."""

    name = "steps"

    def __init__(
        self,
        path: str,
        *,
        gate: SenderGate | None = None,
        group: str = "",
        max_message_bytes: int = MAX_MESSAGE_BYTES,
        max_buffered: int = MAX_BUFFERED,
        clock: Callable[[], float] = time.time,
        mode: int = SOCKET_MODE,
    ) -> None:
        self.path = path
        self.gate = gate or SenderGate()
        self._gid = resolve_group(group)
        self._budget = max(1024, max_message_bytes - ENVELOPE_BYTES)
        self._max = max_buffered
        self._clock = clock
        self._mode = mode
        self._log = LogOnce(log)
        # raw datagrams and their senders: appended by the reader, popped by collect
        self._buf: deque[tuple[bytes, Sender]] = deque()
        self._rate_limited_seen = 0
        self._overflow = 0
        self._owners: dict[int, tuple[str, int, float]] = {}  # gpu -> (job, rank, last seen)
        self.exits = ExitWatch(self.gate.identities.proc, clock)  # ranks ending unannounced
        self.steps_received = 0
        self.events_received = 0
        self.rejected: Counter[str] = Counter()
        self._errors = 0
        self._rejected_seen = 0  # rejections already reported by health()
        self._last_error = ""
        self._sock: socket.socket | None = None
        self._inode: tuple[int, int] | None = None  # (dev, ino) of the socket file we bound
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._next_bind = 0.0
        self._bind()

    # ------------------------------------------------------------------ socket
    def _bind(self) -> None:
        self._next_bind = time.monotonic() + REBIND_SECONDS
        try:
            self._sock = _bind_socket(self.path, self._mode, self._gid)
            self._inode = _inode(self.path)
        except (OSError, CollectorError) as err:
            self._fail("bind", f"cannot listen on {self.path}: {err}")
            return
        self._thread = threading.Thread(target=self._read_loop, name="stepwatch-steps", daemon=True)
        self._thread.start()
        log.info("steps socket listening path=%s", self.path)

    def _read_loop(self) -> None:
        """Only receive here (the kernel queue is short): decoding happens in collect()."""
        sock, buf, limit, stop, admit = (
            self._sock,
            self._buf,
            self._max,
            self._stop,
            self.gate.admit,
        )
        assert sock is not None
        while not stop.is_set():
            try:
                data, creds = recv_with_creds(sock, MAX_DATAGRAM_BYTES + 1)
            except TimeoutError:
                continue
            except OSError as err:
                if not stop.is_set():
                    self._fail("recv", f"receive failed on {self.path}: {err!r}")
                return
            if not data:
                continue  # a wake-up (shutdown), never a record
            sender = admit(creds, len(data))
            if sender is None:
                continue  # over its rate limit: counted by the gate
            if len(buf) < limit:
                buf.append((data, sender))
            else:
                self._overflow += 1

    def feed(self, data: bytes, sender: Sender = LOCAL) -> None:
        """Queue one datagram as if it came from the socket (tests, replays)."""
        if len(self._buf) < self._max:
            self._buf.append((data, sender))
        else:
            self._overflow += 1

    def _decode(self, data: bytes) -> RankStep | RankEvent | None:
        try:
            item = decode_datagram(data)
            if isinstance(item, RankStep):
                now = self._clock()
                check_step(item.step, now)
                _check_window(item.step, now)
            else:
                check_values(_event(item, "-"), self._clock())
        except ContractError as err:
            self.rejected[err.reason] += 1
            self._log(
                "reject:" + err.reason,
                "datagram rejected reason=%s detail=%s",
                err.reason,
                err.detail[:200],
            )
            return None
        return item

    # ------------------------------------------------------------------ Collector
    def collect(self, ctx: HostContext) -> list[Message]:
        if self._sock is None and time.monotonic() >= self._next_bind:
            self._bind()
        self._take_overflow()
        by_job: dict[str, list[tuple[StepRecord, int]]] = {}
        events: list[Message] = []
        buf = self._buf
        for _ in range(len(buf)):
            data, sender = buf.popleft()
            item = self._decode(data)
            if item is None or not self._admitted(item, sender, ctx.host):
                continue
            if isinstance(item, RankStep):
                record = item.step
                if record.host != ctx.host:
                    record = msgspec.structs.replace(record, host=ctx.host)
                by_job.setdefault(record.job_id, []).append((record, len(data) + len(ctx.host)))
                self._own(record, ctx.now)
                self._watch(sender, record)
            else:
                events.append(_event(item, ctx.host))
                if item.type is EventType.JOB_END:
                    self._release(item.job_id)
                    if sender.creds is not None:
                        self.exits.ended(sender.creds.pid, item.job_id)
        self.steps_received += sum(len(v) for v in by_job.values())
        self.events_received += len(events)
        steps: list[Message] = [
            StepMessage(host=ctx.host, ts=ctx.now, job_id=job, steps=part)
            for job, recs in by_job.items()
            for part in _chunks(recs, self._budget)
        ]
        self._expire(ctx.now)
        events.extend(self.exits.take(ctx.host, self._clock()))
        return steps + events

    def _watch(self, sender: Sender, record: StepRecord) -> None:
        """Watch the sender's process for an exit without job_end (exits.py): only one
        whose identity was read at receipt (its pid was that process then) and ties it
        to a job (its Slurm job, pod or environment, which the gate held the record's
        job to). An exit tells the worker that a rank died, or with every rank's that
        the job ended: under ``--verify-job when_known`` a process nothing ties to any
        job may still send steps, but its exit is no word on anyone's job."""
        ident = sender.identity
        if sender.creds is None or ident is None or not ident.start_time or not ident.known:
            return
        gpu = record.gpu if record.gpu is not None else record.local_rank
        self.exits.watch(
            sender.creds.pid,
            ident.start_time,
            record.job_id,
            record.rank,
            gpu,
            record.step,
            sender.creds.uid,
        )

    def _admitted(self, item: RankStep | RankEvent, sender: Sender, host: str) -> bool:
        """Whether ``sender`` may say what ``item`` claims; a rejection is counted and
        logged once per sender, and the record is never forwarded."""
        claim: tuple[str, str, int | None, int | None]
        if isinstance(item, RankStep):
            rec = item.step
            claim = (
                rec.host,
                rec.job_id,
                rec.rank,
                rec.gpu if rec.gpu is not None else rec.local_rank,
            )
        else:
            claim = ("", item.job_id, item.rank, item.gpu)
        reason = self.gate.check(sender, host, *claim)
        if reason is None:
            return True
        self.rejected[reason] += 1
        ident = sender.identity
        self.gate.log_once(
            reason,
            sender.creds,
            "datagram rejected: claims host=%r job=%r rank=%s gpu=%s; the "
            "sender runs slurm_job=%r env_jobs=%s env_rank=%s env_gpus=%s pod=%r",
            *claim,
            ident.slurm_job if ident else "",
            sorted(ident.env_jobs) if ident else [],
            ident.env_rank if ident else None,
            sorted(ident.env_gpus) if ident and ident.env_gpus is not None else None,
            ident.pod_uid if ident else "",
        )
        return False

    def _take_overflow(self) -> None:
        limited = self.gate.rate_limited  # written by the reader thread only
        if limited > self._rate_limited_seen:
            self.rejected["rate_limited"] += limited - self._rate_limited_seen
            self._rate_limited_seen = limited
        overflow, self._overflow = self._overflow, 0  # a rare race only miscounts by one
        if overflow:
            self.rejected["buffer_full"] += overflow
            self._log(
                "buffer_full",
                "steps buffer full, datagrams dropped count=%d max=%d",
                overflow,
                self._max,
            )

    def health(self) -> CollectorHealth:
        reading = self._thread is not None and self._thread.is_alive()
        if self._sock is None or not reading:
            state = HealthState.DOWN
        else:
            rejected = sum(self.rejected.values())
            state = HealthState.DEGRADED if rejected > self._rejected_seen else HealthState.OK
            self._rejected_seen = rejected
        return CollectorHealth(state, self._errors, self._last_error)

    def stop_intake(self) -> int:
        """Stop taking datagrams, keeping every one the kernel queued (the agent's
        shutdown, before its final tick). The path goes first, so a rank's next send
        finds no agent and is counted as dropped (``no_agent``) on its side; what is
        already queued is read into the buffer, for the final tick to spool. Before,
        the socket stayed bound through the final tick and the flush (up to 10 s with
        Kafka down): ranks' datagrams kept landing, counted as sent, and none was ever
        collected. Returns how many datagrams were read from the kernel's queue."""
        sock = self._sock
        if sock is None or self._stop.is_set():
            return 0
        waker = _connected(self.path)  # before the unlink: it still reaches our socket
        self._unlink_own()
        self._stop.set()
        if waker is not None:
            with waker:
                _send_quietly(waker)
        if self._thread is not None:
            self._thread.join(timeout=2.0)
        if self._thread is not None and self._thread.is_alive():
            return 0  # still in a receive: it stops on its own, close() ends it
        return self._drain_kernel_queue(sock)

    def _drain_kernel_queue(self, sock: socket.socket) -> int:
        """Refuse further datagrams (a sender that resolved the path before the unlink
        gets an error, not a silent loss), then read what the kernel holds into the
        buffer, without waiting."""
        taken = 0
        try:
            sock.shutdown(socket.SHUT_RD)
        except OSError:
            pass
        sock.settimeout(0.0)
        for _ in range(self._max + 1):  # the queue is bounded; the loop is too
            try:
                data, creds = recv_with_creds(sock, MAX_DATAGRAM_BYTES + 1)
            except OSError:  # BlockingIOError: empty; anything else: nothing more to read
                break
            if not data:
                if creds is None:
                    break  # the end of a shut-down socket's queue
                continue  # a wake-up, not a record
            taken += 1
            sender = self.gate.admit(creds, len(data))
            if sender is not None:
                self.feed(data, sender)
        return taken

    def _unlink_own(self) -> None:
        """Remove the socket path, only while it is still the socket this collector bound
        (a successor agent may have bound the path since: its socket stays)."""
        if self._inode is None or _inode(self.path) != self._inode:
            return
        self._inode = None
        try:
            os.unlink(self.path)
        except OSError:
            pass

    def close(self) -> None:
        self._stop.set()
        sock, self._sock = self._sock, None
        if sock is not None:
            if self._inode is not None and _inode(self.path) == self._inode:
                _wake(self.path)
            if self._thread is not None:
                self._thread.join(timeout=2.0)
            sock.close()
            self._unlink_own()
        self.exits.close()
        self.gate.close()

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
    return EventMessage(
        host=host,
        ts=item.ts,
        type=item.type,
        job_id=item.job_id,
        rank=item.rank,
        gpu=item.gpu,
        code=item.code,
        detail=plain_text(item.detail),  # another SDK's text made safe, not refused
        attrs=dict(item.attrs),
    )


def _chunks(records: list[tuple[StepRecord, int]], budget: int) -> list[list[StepRecord]]:
    """Split a job's records (with their sizes) into runs of at most ``budget`` bytes."""
    out: list[list[StepRecord]] = [[]]
    used = 0
    for record, size in records:
        if out[-1] and used + size > budget:
            out.append([])
            used = 0
        out[-1].append(record)
        used += size
    return out


def resolve_group(group: str | int | None) -> int | None:
    """A group name or number -> gid; empty -> None (the agent's own group)."""
    text = str(group).strip() if group is not None else ""
    if not text:
        return None
    if text.isdigit():
        return int(text)
    try:
        return grp.getgrnam(text).gr_gid
    except KeyError as err:
        raise ConfigError(f"setting agent_socket_group: no group named {text!r}") from err


def _prepare_dir(directory: Path, gid: int | None) -> None:
    """Create the socket's directory 0750 (of ``gid``); refuse one others could tamper with."""
    if not directory.exists():
        directory.mkdir(parents=True, mode=DIR_MODE)
        os.chmod(directory, DIR_MODE)  # mkdir's mode is masked by the umask
        if gid is not None:
            os.chown(directory, -1, gid)
        log.info(
            "socket directory created path=%s mode=%o gid=%s",
            directory,
            DIR_MODE,
            gid if gid is not None else os.getegid(),
        )
        return
    st = directory.stat()
    if st.st_uid not in (os.geteuid(), 0):
        raise CollectorError(
            f"socket directory {directory} belongs to uid {st.st_uid}, not to "
            "the agent or root: refusing to listen there"
        )
    if st.st_mode & stat.S_IWOTH and not st.st_mode & stat.S_ISVTX:
        raise CollectorError(
            f"socket directory {directory} is world-writable: refusing to listen there"
        )
    if (
        gid is not None
        and not (st.st_gid == gid and st.st_mode & stat.S_IXGRP)
        and not st.st_mode & stat.S_IXOTH
    ):
        log.warning(
            "socket directory does not let group gid=%s reach the socket path=%s "
            "mode=%o (create it 0750 of that group)",
            gid,
            directory,
            stat.S_IMODE(st.st_mode),
        )


def _bind_socket(path: str, mode: int, gid: int | None = None) -> socket.socket:
    """Bind a datagram socket at ``path``: prepare its directory, clear a stale socket,
    set its mode and group, ask for senders' credentials."""
    target = Path(path)
    _prepare_dir(target.parent, gid)
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
        if gid is not None:
            os.chown(path, -1, gid)
        if not enable_passcred(sock):
            log.warning("no SO_PASSCRED on this platform: senders cannot be verified")
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


def _connected(path: str) -> socket.socket | None:
    """A datagram socket connected to ``path``: it reaches that socket after an unlink."""
    waker = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        waker.connect(path)
    except OSError:
        waker.close()
        return None
    return waker


def _send_quietly(waker: socket.socket) -> None:
    try:
        waker.send(b"", socket.MSG_DONTWAIT)
    except OSError:
        pass  # a full queue wakes the reader by itself


def _inode(path: str) -> tuple[int, int] | None:
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


def _alive(path: str) -> bool:
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        probe.connect(path)
    except OSError:
        return False
    finally:
        probe.close()
    return True


def _check_window(step: StepRecord, now: float) -> None:
    """Refuse a step record stamped outside the window the stream worker admits."""
    if step.end > now + STEP_AHEAD_S or step.start < now - STEP_BEHIND_S:
        raise ContractError(
            "step_time_window",
            f"step {step.step} runs {step.start:.3f}..{step.end:.3f}: more than "
            f"{STEP_AHEAD_S:.0f} s ahead of or {STEP_BEHIND_S:.0f} s behind this host's clock",
        )

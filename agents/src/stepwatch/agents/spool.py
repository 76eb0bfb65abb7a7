"""A bounded, crash-safe, append-only on-disk spool: the agent's write-ahead log.

Every message the agent publishes is appended here first; a sender reads it
back in order, produces it to Kafka and acknowledges positions only when the
broker confirmed delivery (in order). Nothing is lost while Kafka is down: the
records wait on disk, and survive an agent restart.

Layout: ``<dir>/<first record number>.seg`` segment files plus ``<dir>/ack``
(the persisted acknowledged position). A frame is::

    u32 body length | u32 crc32(body) | body = u16 topic len | u16 key len | topic | key | value

A position is ``(segment, byte offset, record number)``. On open, the last
segment is scanned and a torn last frame (a crash mid-write) is detected by its
length or crc and truncated (counted in ``torn_frames``). When the spool would
exceed ``max_bytes``, the *oldest* segment is deleted even if unsent: the only
way data is ever dropped (counted in ``dropped``, reason ``bound``, and logged).
Writes reach the OS on every append (a process crash loses nothing); they are
not fsync'ed, so a power loss can lose the last seconds.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import struct
import threading
import zlib
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, NamedTuple

from stepwatch.agents.private import (
    append_file,
    open_private,
    private_dir,
    regular_file,
    write_file,
)
from stepwatch.errors import SpoolError

log = logging.getLogger(__name__)

_HEAD = struct.Struct("<II")  # body length, crc32(body)
_LENS = struct.Struct("<HHq")  # topic length, key length, event time (ms; 0: none)
MAX_BODY = 16 * 1024 * 1024
READ_CHUNK = 1024 * 1024
TAIL_MAX_RECORDS = 20_000  # bounded: during an outage nobody reads it
TAIL_MAX_BYTES = 8 * 1024 * 1024
SUFFIX = ".seg"
ACK_FILE = "ack"
LOCK_FILE = "lock"


class Pos(NamedTuple):
    """A place in the spool: segment (its first record number), byte offset, record number."""

    segment: int
    offset: int
    record: int


# Per-record values are plain tuples (a NamedTuple costs ~10x more to build, and the
# publisher handles every record): End = (segment, offset, record) just after a record,
# what acknowledging it means; Record = (topic, key, value, end, timestamp_ms), where
# timestamp_ms is the message's event time, produced as the Kafka record timestamp
# (0: none, the broker stamps it) so consumers can order a replayed backlog by it.
End = tuple[int, int, int]
Record = tuple[str, bytes, bytes, End, int]
Entry = tuple[str, bytes, bytes, int]  # what append takes: topic, key, value, timestamp_ms


@dataclass
class _Segment:
    first: int
    path: Path
    size: int = 0
    count: int = 0


@dataclass(frozen=True)
class SpoolStats:
    records: int  # appended and not yet acknowledged
    bytes: int  # on disk, not yet acknowledged
    segments: int
    max_bytes: int
    appended_total: int
    acked_total: int
    dropped: dict[str, int] = field(default_factory=dict)  # records dropped by reason
    torn_frames: int = 0


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def lock_dir(directory: Path) -> int:
    """Hold ``<directory>/lock`` (a POSIX record lock: one holder process) for as long
    as the returned descriptor is open; ``SpoolError`` when another process holds it.

    Two agents on one spool (a second run by hand, or with the default relative
    ``var/spool`` from the same directory) each appended to the same segment with
    their own idea of its size, resent each other's records (half of all records
    arrived twice in a red-team run), deleted segments the other still read and
    wrote their ack positions over each other's (a pending count of -40)."""
    fd = open_private(directory / LOCK_FILE, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as err:
        holder = _holder(fd)
        os.close(fd)
        raise SpoolError(
            f"spool directory {directory} is in use by another agent ({holder}): "
            "give each agent a spool directory of its own (--spool-dir)"
        ) from err
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    except OSError:
        pass  # the lock is what counts; the pid only helps the message
    return fd


def _holder(fd: int) -> str:
    try:
        pid = os.pread(fd, 32, 0).decode().strip()
    except (OSError, UnicodeDecodeError):
        pid = ""
    return f"pid {pid}" if pid.isdigit() else "pid unknown"


def frame(topic: str, key: bytes, value: bytes, timestamp_ms: int = 0) -> bytes:
    t = topic.encode()
    body = _LENS.pack(len(t), len(key), timestamp_ms) + t + key + value
    return _HEAD.pack(len(body), zlib.crc32(body)) + body


class Spool:
    """Append records, read them back in order, acknowledge, rewind. Thread-safe."""

    def __init__(
        self, directory: str | os.PathLike[str], max_bytes: int, segment_bytes: int | None = None
    ) -> None:
        self.dir = Path(directory)
        self.max_bytes = max_bytes
        self.segment_bytes = segment_bytes or max(64 * 1024, min(64 * 1024 * 1024, max_bytes // 16))
        self._lock = threading.Lock()
        self._segments: list[_Segment] = []
        self._fd: int | None = None  # the last segment, O_APPEND, unbuffered (os.write)
        self._reader: IO[bytes] | None = None
        self._rbuf = b""
        self._roff = 0  # parse offset in _rbuf
        self._rbase = 0  # file offset of _rbuf[0]
        self._topics: dict[bytes, str] = {}
        self._tail: deque[Record] = deque()  # appended, not yet read, still in memory
        self._tail_bytes = 0
        self.appended_total = 0
        self.acked_total = 0
        self.dropped: Counter[str] = Counter()
        self.torn_frames = 0
        self._lock_fd: int | None = None
        try:
            private_dir(self.dir)  # the agent's alone: agents/private.py says why
            self._lock_fd = lock_dir(self.dir)
            self._open()
        except OSError as err:
            self._unlock()
            raise SpoolError(f"cannot open spool {self.dir}: {err}") from err
        except SpoolError:
            self._unlock()
            raise

    # ------------------------------------------------------------------ open / recovery
    def _open(self) -> None:
        firsts = sorted(int(p.stem) for p in self.dir.glob("*" + SUFFIX) if p.stem.isdigit())
        for first in firsts:
            path = self._path(first)
            regular_file(path)
            self._segments.append(_Segment(first, path, path.stat().st_size))
        for seg, nxt in zip(self._segments, self._segments[1:], strict=False):
            seg.count = nxt.first - seg.first
        if not self._segments:
            self._segments.append(_Segment(0, self._path(0)))
            os.close(append_file(self._path(0)))
        else:
            self._recover_tail(self._segments[-1])
        self._fd = append_file(self._segments[-1].path)
        self._ack = self._load_ack()
        self._cursor = self._ack
        pending = self._end().record - self._ack.record
        if pending:
            log.info(
                "spool resumed dir=%s pending_records=%d pending_bytes=%d",
                self.dir,
                pending,
                self._pending_bytes(),
            )

    def _recover_tail(self, seg: _Segment) -> None:
        data = seg.path.read_bytes()
        off, count = 0, 0
        while off + _HEAD.size <= len(data):
            blen, crc = _HEAD.unpack_from(data, off)
            end = off + _HEAD.size + blen
            if blen < _LENS.size or blen > MAX_BODY or end > len(data):
                break
            if zlib.crc32(data[off + _HEAD.size : end]) != crc:
                break
            off, count = end, count + 1
        if off < len(data):
            self.torn_frames += 1
            log.warning(
                "spool torn frame truncated segment=%s kept_bytes=%d cut_bytes=%d",
                seg.path.name,
                off,
                len(data) - off,
            )
            fd = open_private(seg.path, os.O_WRONLY)
            try:
                os.ftruncate(fd, off)
            finally:
                os.close(fd)
        seg.size, seg.count = off, count

    def _load_ack(self) -> Pos:
        start = Pos(self._segments[0].first, 0, self._segments[0].first)
        try:
            raw = json.loads((self.dir / ACK_FILE).read_text())
            pos = Pos(int(raw["segment"]), int(raw["offset"]), int(raw["record"]))
        except FileNotFoundError:
            return start
        except (OSError, ValueError, KeyError, TypeError) as err:
            log.warning("spool ack file unreadable, replaying from the oldest record err=%r", err)
            return start
        seg = self._find(pos.segment)
        if seg is None:
            if pos.segment > start.segment:
                log.warning(
                    "spool ack names a missing segment, replaying from the oldest pos=%s", pos
                )
            return start
        if not (0 <= pos.offset <= seg.size and seg.first <= pos.record <= seg.first + seg.count):
            found = self._locate(seg, pos.offset)
            log.warning(
                "spool ack position out of range (a cut tail?), resuming at the nearest "
                "record boundary pos=%s resume=%s",
                pos,
                found,
            )
            return found
        return pos

    def _locate(self, seg: _Segment, offset: int) -> Pos:
        """The last frame boundary of ``seg`` at or before ``offset``, with its record number.

        An acknowledged position beyond the segment's end (its tail was cut
        after the ack was written) resumes at the end: what is left of the
        segment was delivered already, so nothing of it is sent again; an
        inconsistent position inside the segment resends at most one record.
        """
        try:
            data = seg.path.read_bytes()[: max(0, offset)]
        except OSError:
            return Pos(seg.first, 0, seg.first)
        off, record = 0, seg.first
        while off + _HEAD.size <= len(data):
            blen, _crc = _HEAD.unpack_from(data, off)
            end = off + _HEAD.size + blen
            if end > len(data):
                break
            off, record = end, record + 1
        return Pos(seg.first, off, record)

    # ------------------------------------------------------------------ write side
    def append(self, records: Sequence[Entry]) -> int:
        """Append (topic, key, value, timestamp_ms) records; returns how many. Raises SpoolError."""
        if not records:
            return 0
        frames = [frame(t, k, v, ts) for t, k, v, ts in records]
        with self._lock:
            seg = self._segments[-1]
            if self._fd is None:
                raise SpoolError(f"cannot append to spool {seg.path}: spool is closed")
            try:
                _write_all(self._fd, b"".join(frames))
            except OSError as err:
                self._undo(seg)
                raise SpoolError(f"cannot append to spool {seg.path}: {err}") from err
            self._remember(seg, records, frames)
            seg.size += sum(map(len, frames))
            seg.count += len(records)
            self.appended_total += len(records)
            if seg.size >= self.segment_bytes:
                self._rotate()
            self._enforce_bound()
        return len(records)

    def _undo(self, seg: _Segment) -> None:
        """Cut what a failed append wrote (a full disk takes part of a frame): left there,
        every later frame sat after garbage that the reader took for the segment's end,
        and records appended once the disk had room again never reached Kafka. When the
        cut fails too, the next append goes to a new segment (the reader stops at the
        garbage, which holds no record)."""
        assert self._fd is not None
        try:
            os.ftruncate(self._fd, seg.size)
        except OSError as err:
            log.error("spool cannot cut a failed append segment=%s error=%s", seg.path, err)
            try:
                seg.size = os.fstat(self._fd).st_size
                self._rotate()
            except OSError as again:
                log.error("spool cannot start a new segment error=%s", again)

    def _remember(self, seg: _Segment, records: Sequence[Entry], frames: list[bytes]) -> None:
        """Keep just-written records in memory while the reader is caught up with them,
        so the sender need not read them back from disk."""
        start = seg.first + seg.count
        if not self._tail:
            if self._cursor.record != start:
                return  # the reader is behind: it reads from disk
            self._tail_bytes = 0
        off, rec, tail, first = seg.size, start, self._tail, seg.first
        for (t, k, v, ts), f in zip(records, frames, strict=True):
            off, rec = off + len(f), rec + 1
            tail.append((t, k, v, (first, off, rec), ts))
        self._tail_bytes += off - seg.size
        if len(tail) > TAIL_MAX_RECORDS or self._tail_bytes > TAIL_MAX_BYTES:
            self._forget()

    def _forget(self) -> None:
        self._tail.clear()
        self._tail_bytes = 0

    def _rotate(self) -> None:
        nxt = self._end().record
        seg = _Segment(nxt, self._path(nxt))
        fd = append_file(seg.path)  # first: when it fails, the current segment stays open
        if self._fd is not None:
            os.close(self._fd)
        self._fd = fd
        self._segments.append(seg)

    def _enforce_bound(self) -> None:
        while sum(s.size for s in self._segments) > self.max_bytes:
            if len(self._segments) == 1:
                self._rotate()
            oldest = self._segments[0]
            lost = oldest.first + oldest.count - max(self._ack.record, oldest.first)
            self._delete_oldest()
            if lost > 0:
                self.dropped["bound"] += lost
                log.warning(
                    "spool full, oldest unsent data dropped segment=%s records=%d bytes=%d "
                    "max_bytes=%d dropped_total=%d",
                    oldest.path.name,
                    lost,
                    oldest.size,
                    self.max_bytes,
                    self.dropped["bound"],
                )

    def _delete_oldest(self) -> None:
        oldest = self._segments.pop(0)
        oldest.path.unlink(missing_ok=True)
        head = self._segments[0]
        start = Pos(head.first, 0, head.first)
        if self._ack.segment <= oldest.first:
            self._ack = start
        if self._cursor.segment <= oldest.first:
            self._cursor = start
            self._close_reader()
            self._forget()

    # ------------------------------------------------------------------ read side
    def read(self, limit: int) -> list[Record]:
        """Up to ``limit`` records from the read cursor on, in order; advances the cursor."""
        out: list[Record] = []
        with self._lock:
            tail = self._tail
            if tail and tail[0][3][2] == self._cursor.record + 1:
                self._close_reader()
                while tail and len(out) < limit:
                    out.append(tail.popleft())
                self._cursor = Pos(*out[-1][3])
                return out
            self._forget()
            while len(out) < limit:
                seg = self._find(self._cursor.segment)
                if seg is None:
                    break
                if self._reader is None:
                    self._open_reader(seg)
                self._parse(seg, out, limit)
                if len(out) >= limit or self._reader is None or self._refill():
                    continue  # full, moved past a corrupt segment, or more bytes to parse
                if not self._next_segment(seg):
                    break
        return out

    def _open_reader(self, seg: _Segment) -> None:
        self._reader = open(seg.path, "rb", buffering=0)  # noqa: SIM115
        self._reader.seek(self._cursor.offset)
        self._rbuf, self._roff, self._rbase = b"", 0, self._cursor.offset

    def _refill(self) -> bool:
        assert self._reader is not None
        chunk = self._reader.read(READ_CHUNK)
        if not chunk:
            return False
        self._rbase += self._roff
        self._rbuf = self._rbuf[self._roff :] + chunk
        self._roff = 0
        return True

    def _parse(self, seg: _Segment, out: list[Record], limit: int) -> None:
        buf, off, size = self._rbuf, self._roff, len(self._rbuf)
        first, base, record = seg.first, self._rbase, self._cursor.record
        topics = self._topics
        while len(out) < limit and off + 8 <= size:
            blen, crc = _HEAD.unpack_from(buf, off)
            end = off + 8 + blen
            if end > size:
                break
            body = buf[off + 8 : end]
            if blen < _LENS.size or zlib.crc32(body) != crc:
                self._corrupt(seg, record)
                return
            tl, kl, ts = _LENS.unpack_from(body)
            h = _LENS.size
            raw_topic = body[h : h + tl]
            topic = topics.get(raw_topic) or topics.setdefault(raw_topic, raw_topic.decode())
            off, record = end, record + 1
            out.append(
                (
                    topic,
                    body[h + tl : h + tl + kl],
                    body[h + tl + kl :],
                    (first, base + off, record),
                    ts,
                )
            )
        self._roff = off
        self._cursor = Pos(first, base + off, record)

    def _corrupt(self, seg: _Segment, record: int) -> None:
        lost = seg.first + seg.count - record
        self.dropped["corrupt"] += lost
        log.error(
            "spool segment corrupt, skipping its rest segment=%s records=%d", seg.path.name, lost
        )
        self._cursor = Pos(seg.first, seg.size, seg.first + seg.count)
        self._rbuf, self._roff, self._rbase = b"", 0, seg.size
        if not self._next_segment(seg):
            self._close_reader()

    def _next_segment(self, seg: _Segment) -> bool:
        """At the end of ``seg``: move to the next one if ``seg`` is sealed."""
        idx = self._segments.index(seg)
        if idx + 1 >= len(self._segments):
            return False
        if self._cursor.record < seg.first + seg.count:  # trailing garbage in a sealed segment
            self._corrupt(seg, self._cursor.record)
            return True
        nxt = self._segments[idx + 1]
        self._close_reader()
        self._cursor = Pos(nxt.first, 0, nxt.first)
        return True

    def _close_reader(self) -> None:
        if self._reader is not None:
            self._reader.close()
        self._reader, self._rbuf, self._roff = None, b"", 0

    # ------------------------------------------------------------------ ack / rewind
    def ack(self, end: End) -> None:
        """Everything before ``end`` was delivered; delete fully acknowledged segments."""
        pos = Pos(*end)
        with self._lock:
            if pos.record <= self._ack.record:
                return  # stale (e.g. from before a rewind or a bound drop)
            self.acked_total += pos.record - self._ack.record
            self._ack = pos
            while len(self._segments) > 1 and self._segments[1].first <= pos.record:
                self._delete_oldest()

    def rewind(self) -> int:
        """Move the read cursor back to the first unacknowledged record; returns how far."""
        with self._lock:
            back = self._cursor.record - self._ack.record
            self._cursor = self._ack
            self._close_reader()
            self._forget()
            return back

    def persist(self) -> None:
        """Write the acknowledged position to disk (atomically)."""
        with self._lock:
            pos = self._ack
        tmp = self.dir / (ACK_FILE + ".tmp")
        try:
            tmp.unlink(missing_ok=True)  # whatever is there (a link) goes, not its target
            write_file(tmp, json.dumps(pos._asdict()).encode())
            os.replace(tmp, self.dir / ACK_FILE)
        except OSError as err:
            raise SpoolError(f"cannot persist spool position in {self.dir}: {err}") from err

    # ------------------------------------------------------------------ state
    @property
    def acked(self) -> Pos:
        return self._ack

    @property
    def cursor(self) -> Pos:
        return self._cursor

    def pending(self) -> int:
        """Records appended and not yet acknowledged."""
        return self._end().record - self._ack.record

    def unread(self) -> int:
        """Records appended and not yet read by the sender."""
        return self._end().record - self._cursor.record

    def stats(self) -> SpoolStats:
        with self._lock:
            return SpoolStats(
                records=self.pending(),
                bytes=self._pending_bytes(),
                segments=len(self._segments),
                max_bytes=self.max_bytes,
                appended_total=self.appended_total,
                acked_total=self.acked_total,
                dropped=dict(self.dropped),
                torn_frames=self.torn_frames,
            )

    def close(self) -> None:
        try:
            self.persist()
        finally:
            with self._lock:
                self._close_reader()
                if self._fd is not None:
                    os.close(self._fd)
                    self._fd = None
                self._unlock()

    def _unlock(self) -> None:
        fd, self._lock_fd = self._lock_fd, None
        if fd is not None:
            os.close(fd)  # closing it releases the lock

    # ------------------------------------------------------------------ helpers
    def _path(self, first: int) -> Path:
        return self.dir / f"{first:020d}{SUFFIX}"

    def _end(self) -> Pos:
        last = self._segments[-1]
        return Pos(last.first, last.size, last.first + last.count)

    def _find(self, first: int) -> _Segment | None:
        for seg in self._segments:
            if seg.first == first:
                return seg
        return None

    def _pending_bytes(self) -> int:
        total = sum(s.size for s in self._segments)
        head = self._find(self._ack.segment)
        return total - self._ack.offset if head is self._segments[0] else total

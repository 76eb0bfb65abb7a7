"""Kafka records -> checked table rows and dead letters (no Kafka, no I/O but seeding).

For each record: decode and validate against the contract (a bad record
becomes a dead letter with the contract's reason: ``malformed_json``,
``schema``, ``unknown_kind``, ``unsupported_version``, ``absurd_value``,
``overflow``, ``too_large``: the contract's bounds, the same as the stream worker's;
``wrong_topic`` and ``future_timestamp``, as the worker refuses them);
drop a message already seen by its (host, inst, kind, seq) *and content*, in
memory or in the store's ``sender_seqs``
(:mod:`stepwatch.exporters.clickhouse.senders`,
:mod:`stepwatch.exporters.clickhouse.accepted`: the same number with other
content is not stored, it is dead-lettered ``seq_conflict``); dead-letter raw rows older
than the store keeps them (``too_old``: the raw tables' TTL would drop them
silently) and detections from a producer outside the allow-list
(``unknown_producer``); map it to rows; check each row against its column
types (``overflow``, ``invalid_value``).
Counter rates are computed here (:mod:`stepwatch.exporters.clickhouse.rates`).
Both lookups in the store (accepted numbers, counter seeds) go in bounded
chunks, so one absurd key costs only its own answer
(:mod:`stepwatch.exporters.clickhouse.lookups`).
"""

from __future__ import annotations

import base64
import logging
import re
import time
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from stepwatch.contract import (
    KIND_OF,
    DetectionMessage,
    EventMessage,
    GpuMessage,
    Kind,
    Message,
    PortMessage,
    StepMessage,
    decode,
)
from stepwatch.contract.codec import MAX_MESSAGE_BYTES
from stepwatch.contract.seen import Verdict
from stepwatch.errors import ContractError
from stepwatch.exporters.clickhouse import rows as R
from stepwatch.exporters.clickhouse.accepted import accepted_row, lookup_accepted
from stepwatch.exporters.clickhouse.lookups import Key, Lookup, lookup, tuple_literal
from stepwatch.exporters.clickhouse.ops_rows import Mapper
from stepwatch.exporters.clickhouse.rates import (
    GPU_COUNTERS,
    GPU_WRAPS,
    MAX_GAP_SECONDS,
    PORT_COUNTERS,
    PORT_SATURATION,
    PORT_WRAPS,
    CounterTracker,
    Reading,
    gpu_derived,
    gpu_values,
    port_ceilings,
    port_values,
)
from stepwatch.exporters.clickhouse.senders import (
    SenderFilter,
    SenderSeq,
    content_digest,
    sender_seq,
)
from stepwatch.exporters.clickhouse.store import Store
from stepwatch.logs import LogOnce

log = logging.getLogger(__name__)

MAX_PAYLOAD = 1 << 20
FUTURE_SECONDS = 120.0  # the stream worker's default tolerance (Settings.stream_future_seconds)
# A counter's previous reading is the same sender's: another agent instance's reading of
# the host (a restart, a second agent, a forged or reused host name) is not its baseline,
# and the reset rule would have counted its whole value as new traffic or errors.
GPU_KEY = ("host", "inst", "gpu")
PORT_KEY = ("host", "inst", "device", "port")


@dataclass(frozen=True)
class Record:
    """One Kafka record, as the sink sees it."""

    topic: str
    partition: int
    offset: int
    value: bytes | None
    key: bytes | None = None


@dataclass
class TableRows:
    table: R.Table
    rows: list[tuple[Any, ...]] = field(default_factory=list)
    sources: list[Record] = field(default_factory=list)
    wheres: list[str] = field(default_factory=list)  # which part of the message each row is

    def remove(self, indexes: set[int]) -> None:
        keep = [i for i in range(len(self.rows)) if i not in indexes]
        self.rows = [self.rows[i] for i in keep]
        self.sources = [self.sources[i] for i in keep]
        self.wheres = [self.wheres[i] for i in keep]


@dataclass(frozen=True)
class Admitted:
    """A message that passed the sender filter, and its ``sender_seqs`` row (None: no inst)."""

    record: Record
    message: Message
    accepted: tuple[Any, ...] | None


@dataclass
class Prepared:
    tables: dict[str, TableRows] = field(default_factory=dict)
    dead: list[tuple[Any, ...]] = field(default_factory=list)
    messages: int = 0
    duplicates: int = 0
    # sender_seqs rows of the messages mapped: written after the tables (accepted.py)
    accepted: list[tuple[Any, ...]] = field(default_factory=list)

    def add(self, table: R.Table, row: tuple[Any, ...], source: Record, where: str) -> None:
        bucket = self.tables.setdefault(table.name, TableRows(table))
        bucket.rows.append(row)
        bucket.sources.append(source)
        bucket.wheres.append(where)


class _Header(msgspec.Struct):
    kind: Any = None
    host: Any = None
    inst: Any = None
    seq: Any = None


_lenient = msgspec.json.Decoder(_Header)


def _scan_header(payload: bytes) -> _Header:
    """Header fields from JSON too broken to parse, when they can be spotted."""
    found: dict[str, Any] = {}
    for name in ("kind", "host", "inst"):
        match = re.search(rb'"' + name.encode() + rb'"\s*:\s*"([^"\\]{0,256})"', payload)
        if match:
            found[name] = match.group(1).decode("utf-8", "replace")
    match = re.search(rb'"seq"\s*:\s*(\d{1,20})\b', payload)
    if match:
        found["seq"] = int(match.group(1))
    return _Header(**found)


def dead_row(record: Record, reason: str, detail: str, now: float) -> tuple[Any, ...]:
    """A dead_letters row; the header fields are read leniently when they can be.

    Its key is the record's place in the log and the CRC-32 of its value: the same
    record read again collapses into one row, another record at a reused offset
    (a re-created topic) does not replace it."""
    payload = record.value or b""
    try:
        header = _lenient.decode(payload)
    except (msgspec.DecodeError, UnicodeDecodeError):  # (ValidationError included)
        header = _scan_header(payload[:65536])
    seq = header.seq if isinstance(header.seq, int) and 0 <= header.seq < 2**64 else None
    text, encoding = payload_text(payload)
    return (
        now,
        record.topic,
        record.partition,
        record.offset,
        (record.key or b"").decode("utf-8", "replace"),
        reason,
        detail[:8192],
        text,
        _s(header.kind),
        _s(header.host),
        _s(header.inst),
        seq,
        encoding,
        len(payload) > MAX_PAYLOAD,
        zlib.crc32(payload),
    )


def payload_text(payload: bytes) -> tuple[str, str]:
    """(text, encoding) of a dead letter's payload, at most :data:`MAX_PAYLOAD` bytes of it:
    valid UTF-8 as it is (a character the cut splits left out), anything else as base64,
    so that the bytes as sent can always be had back."""
    kept = payload[:MAX_PAYLOAD]
    for cut in range(4 if len(payload) > MAX_PAYLOAD else 1):
        try:
            return kept[: len(kept) - cut].decode("utf-8"), "utf-8"
        except UnicodeDecodeError:
            continue
    return base64.b64encode(kept).decode("ascii"), "base64"


def _s(value: Any) -> str:
    return value if isinstance(value, str) else ""


def row_reason(problem: str) -> str:
    return "overflow" if "overflows" in problem else "invalid_value"


class Preparer:
    """Turns a batch of records into rows; keeps counter state across batches."""

    def __init__(
        self,
        store: Store | None = None,
        *,
        now: Callable[[], float] = time.time,
        max_message_bytes: int = MAX_MESSAGE_BYTES,
        ops: dict[str, Mapper] | None = None,
        max_age_seconds: float = 0.0,
        producers: frozenset[str] = frozenset(),
        senders: SenderFilter | None = None,
        kinds: Mapping[str, Kind] | None = None,
        future_seconds: float = FUTURE_SECONDS,
    ) -> None:
        self.store = store
        self.ops = ops or {}  # operations topics (alerts, remediations) -> their row mapper
        self.kinds = dict(kinds or {})  # message topics -> the kind each carries
        self.future_seconds = future_seconds  # a timestamp further ahead: refused; <= 0: off
        self.now = now
        self.gpus = CounterTracker(len(GPU_COUNTERS), wraps=GPU_WRAPS)
        self.ports = CounterTracker(
            len(PORT_COUNTERS), wraps=PORT_WRAPS, saturation=PORT_SATURATION
        )
        self.senders = senders or SenderFilter()  # memory; the store has sender_seqs
        self.max_message_bytes = max_message_bytes
        self.max_age_seconds = max_age_seconds  # raw rows older than this: too_old; 0: no limit
        self.producers = producers  # detections accepted only from these; empty: from any
        self._warn = LogOnce(log)

    def prepare(self, records: Sequence[Record]) -> Prepared:
        out = Prepared(messages=len(records))
        now = self.now()
        decoded: list[tuple[Record, Message]] = []
        for record in records:
            if record.topic in self.ops:
                self._ops_record(record, out, now)
                continue
            message = self._decode(record, out, now)
            if message is not None:
                decoded.append((record, message))
        admitted = self._admit(decoded, out, now)
        self._seed([a.message for a in admitted])
        for a in admitted:
            try:
                self._map(a.record, a.message, out, now)
            except Exception as err:  # a bug must not stall the partition: keep the record
                self._warn("map", "cannot map a record error=%r", err, level=logging.ERROR)
                out.dead.append(dead_row(a.record, "internal_error", repr(err), now))
                continue
            if a.accepted is not None:
                out.accepted.append(a.accepted)
        self._check(out, now)
        return out

    def _check(self, out: Prepared, now: float) -> None:
        """Rows whose values do not fit their columns become dead letters: one per record
        and reason, naming every such row (the dead letters' key is the record's place,
        reason and CRC, so a second row's letter folded into the first and was lost)."""
        letters: dict[tuple[int, str], tuple[Record, list[str]]] = {}
        for bucket in out.tables.values():
            bad = bucket.table.check_rows(bucket.rows)
            for i, problem in sorted(bad.items()):
                source = bucket.sources[i]
                entry = letters.setdefault((id(source), row_reason(problem)), (source, []))
                entry[1].append(f"{bucket.wheres[i]}: {problem}")
            if bad:
                bucket.remove(set(bad))
        for (_, reason), (source, details) in letters.items():
            many = f"{len(details)} rows: " if len(details) > 1 else ""
            out.dead.append(dead_row(source, reason, many + "; ".join(details), now))

    def _ops_record(self, record: Record, out: Prepared, now: float) -> None:
        """An alert or remediation record: one row, or a dead letter with the reason."""
        if not record.value:
            out.dead.append(dead_row(record, "malformed_json", "empty record value", now))
            return
        try:
            table, row = self.ops[record.topic](record.value)
        except ContractError as err:
            out.dead.append(dead_row(record, err.reason, err.detail, now))
            return
        out.add(table, row, record, table.name)

    def _decode(self, record: Record, out: Prepared, now: float) -> Message | None:
        if not record.value:
            out.dead.append(dead_row(record, "malformed_json", "empty record value", now))
            return None
        try:
            message = decode(record.value, now=lambda: now, max_bytes=self.max_message_bytes)
        except ContractError as err:
            out.dead.append(dead_row(record, err.reason, err.detail, now))
            return None
        refused = self._wrong_topic(record, message) or self._refusal(message, now)
        if refused is not None:
            out.dead.append(dead_row(record, refused[0], refused[1], now))
            return None
        return message

    # ------------------------------------------------------------------ senders
    def _admit(
        self, decoded: list[tuple[Record, Message]], out: Prepared, now: float
    ) -> list[Admitted]:
        """Drop duplicates, dead-letter conflicts; the store's answer first, then memory's."""
        keys = [sender_seq(m) for _, m in decoded]
        accepted = self._accepted([k for k in keys if k is not None])
        admitted: list[Admitted] = []
        for (record, message), key in zip(decoded, keys, strict=True):
            if key is None:  # an unstamped sender: not filtered
                admitted.append(Admitted(record, message, None))
                continue
            digest = content_digest(message, record.value or b"")
            verdict = self.senders.judge(key, digest, accepted.get(key, ()))
            if verdict is Verdict.DUPLICATE:
                out.duplicates += 1
            elif verdict is Verdict.CONFLICT:
                out.dead.append(dead_row(record, "seq_conflict", conflict_detail(message), now))
            else:
                admitted.append(Admitted(record, message, accepted_row(key, digest, now)))
        return admitted

    def _accepted(self, keys: list[SenderSeq]) -> dict[Key, frozenset[int]]:
        """What the store accepted for these sender numbers (nothing known without a store)."""
        if self.store is None or not keys:
            return {}
        found = lookup_accepted(self.store, keys)
        self._incomplete("accepted", "sender_seqs", found)
        return found.found

    def _incomplete(self, what: str, table: str, found: Lookup[Any]) -> None:
        if found.skipped:
            self._warn(
                f"{what}-skipped",
                "store lookup skipped keys it cannot ask about table=%s keys=%d first=%.80r why=%s",
                table,
                len(found.skipped),
                found.skipped[0],
                found.error or "longer than a lookup query may hold",
            )
        if found.unasked:
            self._warn(
                f"{what}-failed",
                "store lookup failed table=%s keys=%d error=%s",
                table,
                len(found.unasked),
                found.error,
            )

    def _wrong_topic(self, record: Record, message: Message) -> tuple[str, str] | None:
        """A valid message of another kind than its topic's: the stream worker refuses it
        (it never reached detection), so the store does not hold it either."""
        expected = self.kinds.get(record.topic)
        kind = KIND_OF[type(message)]
        if expected is None or kind is expected:
            return None
        return "wrong_topic", f"a {kind.value} message on the {expected.value} topic"

    def _refusal(self, message: Message, now: float) -> tuple[str, str] | None:
        """(reason, detail) when the message must not be stored as it is."""
        if isinstance(message, DetectionMessage):
            if self.producers and message.producer not in self.producers:
                return "unknown_producer", (
                    f"detection from producer {message.producer!r}, not "
                    f"one of the {len(self.producers)} allowed"
                )
            return None
        if 0 < self.future_seconds < message.ts - now:
            return "future_timestamp", (
                f"timestamp {message.ts:.3f} is {message.ts - now:.0f} s ahead of the "
                f"sink's clock (tolerance {self.future_seconds:.0f} s)"
            )
        if self.max_age_seconds <= 0 or isinstance(message, EventMessage):
            return None
        oldest = message.ts
        if isinstance(message, StepMessage) and message.steps:
            oldest = min(oldest, min(r.start for r in message.steps))
        if oldest < now - self.max_age_seconds:
            return "too_old", (
                f"timestamp {oldest:.3f} is {(now - oldest) / 86400:.0f} days old: "
                f"the raw tables keep {self.max_age_seconds / 86400:.0f} days"
            )
        return None

    def _map(self, record: Record, message: Message, out: Prepared, now: float) -> None:
        """Add the message's rows; all of them or, if mapping fails, none. A record that
        repeats an earlier one of the message (the same step of a rank, the same GPU or
        port) is left out with one dead letter: the raw table would fold it into the first
        row, but the rollups fed by the insert would count it again."""
        repeats: list[str] = []
        ahead: list[str] = []
        for table, row, where in list(self._rows(message, repeats, ahead, now)):
            out.add(table, row, record, where)
        if repeats:
            detail = f"{len(repeats)} record(s) repeat an earlier one: " + ", ".join(repeats[:8])
            out.dead.append(dead_row(record, "duplicate_record", detail, now))
        if ahead:
            detail = (
                f"{len(ahead)} record(s) end more than {self.future_seconds:.0f} s ahead of "
                "the sink's clock: " + ", ".join(ahead[:8])
            )
            out.dead.append(dead_row(record, "future_timestamp", detail, now))

    def _rows(
        self, message: Message, repeats: list[str], ahead: list[str], now: float
    ) -> Iterator[tuple[R.Table, tuple[Any, ...], str]]:
        if isinstance(message, StepMessage):
            steps: set[tuple[str, int, int, str]] = set()
            latest = now + self.future_seconds if self.future_seconds > 0 else float("inf")
            for i, step in enumerate(message.steps):
                if step.end > latest:  # as the worker judges it: this record alone
                    ahead.append(f"steps[{i}]")
                    continue
                host = step.host or message.host  # as the row holds it (R.step_row)
                key = (step.job_id or message.job_id, step.step, step.rank, host)
                if key in steps:
                    repeats.append(f"steps[{i}]")
                    continue
                steps.add(key)
                yield R.STEPS, R.step_row(message, step), f"steps[{i}]"
        elif isinstance(message, GpuMessage):
            gpus: set[int] = set()
            for g in message.gpus:
                if g.index in gpus:
                    repeats.append(f"gpus[{g.index}]")
                    continue
                gpus.add(g.index)
                change = self.gpus.update(
                    (message.host, message.inst, g.index), message.ts, gpu_values(g)
                )
                yield (
                    R.GPUS,
                    R.gpu_row(message, g, gpu_derived(change), int(change.known)),
                    f"gpus[{g.index}]",
                )
        elif isinstance(message, PortMessage):
            ports: set[tuple[str, int]] = set()
            for p in message.ports:
                if (p.device, p.port) in ports:
                    repeats.append(f"ports[{p.device}:{p.port}]")
                    continue
                ports.add((p.device, p.port))
                change = self.ports.update(
                    (message.host, message.inst, p.device, p.port),
                    message.ts,
                    port_values(p),
                    port_ceilings(p),
                )
                if change.impossible:
                    self._warn(
                        "impossible-increase",
                        "counter increase beyond the link rate, rates left unknown "
                        "host=%s inst=%s device=%s port=%s rate_gbps=%s",
                        message.host,
                        message.inst,
                        p.device,
                        p.port,
                        p.rate_gbps,
                    )
                row = R.port_row(message, p, (change.dt, *change.rates()), int(change.known))
                yield R.PORTS, row, f"ports[{p.device}:{p.port}]"
        elif isinstance(message, EventMessage):
            yield R.EVENTS, R.event_row(message), "event"
        elif isinstance(message, DetectionMessage):
            yield R.DETECTIONS, R.detection_row(message), "detection"

    # ------------------------------------------------------------------ seeding
    def _seed(self, messages: list[Message]) -> None:
        """Fetch the last stored reading of counter keys this process has not seen."""
        if self.store is None:
            return
        gpu_keys: dict[Any, float] = {}
        port_keys: dict[Any, float] = {}
        for m in messages:
            if isinstance(m, GpuMessage):
                for g in m.gpus:
                    k = (m.host, m.inst, g.index)
                    if self.gpus.needs_seed(k):
                        gpu_keys[k] = min(gpu_keys.get(k, m.ts), m.ts)
            elif isinstance(m, PortMessage):
                for p in m.ports:
                    k2 = (m.host, m.inst, p.device, p.port)
                    if self.ports.needs_seed(k2):
                        port_keys[k2] = min(port_keys.get(k2, m.ts), m.ts)
        self._seed_table(self.gpus, gpu_keys, "gpu_samples", GPU_KEY, GPU_COUNTERS)
        self._seed_table(self.ports, port_keys, "port_samples", PORT_KEY, PORT_COUNTERS)

    def _seed_table(
        self,
        tracker: CounterTracker,
        wanted: dict[Any, float],
        table: str,
        key_cols: tuple[str, ...],
        counters: tuple[str, ...],
    ) -> None:
        """Seed each key the store answered about; a key it cannot be asked about has no seed.

        A key left unasked (the store did not answer) stays unseeded: the next
        batch asks again.
        """
        if not wanted:
            return
        keys = list(wanted)
        found = lookup(
            keys,
            lambda chunk: self._lookup({k: wanted[k] for k in chunk}, table, key_cols, counters),
        )
        self._incomplete(f"seed-{table}", table, found)
        for key in [*found.answered(keys), *found.skipped]:
            tracker.seed(key, found.found.get(key))

    def _lookup(
        self,
        chunk: dict[Any, float],
        table: str,
        key_cols: tuple[str, ...],
        counters: tuple[str, ...],
    ) -> dict[Any, Reading]:
        assert self.store is not None
        keys = ", ".join(tuple_literal(k) for k in chunk)
        bounds = ", ".join(repr(float(b)) for b in chunk.values())
        cols = ", ".join(key_cols)
        # each counter's last value and when it was read: a sample that lacked one (a
        # failed NVML call) does not leave the counter without a baseline
        last = ", ".join(
            f"argMaxIf({c}, ts, {c} IS NOT NULL), toFloat64(maxIf(ts, {c} IS NOT NULL))"
            for c in counters
        )
        sql = (
            f"SELECT {cols}, toFloat64(max(ts)) AS t, {last} FROM {table} "
            f"WHERE ({cols}) IN ({keys}) "
            f"AND ts >= toDateTime64({min(chunk.values()) - MAX_GAP_SECONDS!r}, 3, 'UTC') "
            f"AND toFloat64(ts) < arrayElement([{bounds}], indexOf([{keys}], ({cols}))) "
            f"GROUP BY {cols}"
        )
        result = self.store.query(sql)
        n = len(key_cols)
        return {tuple(row[:n]): _seed_reading(row[n:]) for row in result.rows}


def _seed_reading(row: Sequence[Any]) -> Reading:
    """(latest ts, then per counter: its last value, the time of it) -> a Reading."""
    ts = float(row[0])
    values = tuple(row[1::2])
    since = tuple(ts if v is None else float(at) for v, at in zip(values, row[2::2], strict=True))
    return Reading(ts, values, since if any(at != ts for at in since) else None)


def conflict_detail(message: Message) -> str:
    return (
        f"{KIND_OF[type(message)].value} seq {message.seq} "
        f"of host {message.host!r} inst {message.inst!r} "
        "was accepted before with other content: not stored (the content accepted first stays)"
    )

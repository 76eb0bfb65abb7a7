"""The chaos audit's two halves: a tap on the broker while the run lasts, and
the end-to-end comparison of what was produced with what the store holds.

* :class:`Tap` reads the detections, the dead-letter topic and the ledger's
  changelog as they are written (its own consumer group). What it read is the
  run's record of every detection state change (the store must hold each),
  and the copy the harness re-drives after a development-broker loss.
* :func:`audit` reads the agents' outboxes (what was produced) and the
  ClickHouse tables (through the embedded engine, after the sink stopped).
"""

from __future__ import annotations

import base64
import json
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TABLES = {"step": "step_events", "gpu": "gpu_samples", "port": "port_samples", "event": "events"}


@dataclass(frozen=True)
class Tapped:
    topic: str
    partition: int
    key: bytes | None
    value: bytes | None
    seen: float  # wall clock when the tap read it


class Tap:
    """Reads ``topics`` from the beginning until stopped; survives broker restarts."""

    def __init__(self, bootstrap: str, topics: list[str]) -> None:
        self.bootstrap, self.topics = bootstrap, topics
        self.records: list[Tapped] = []
        self._seen: set[tuple[str, bytes | None, bytes | None]] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="chaos-tap")

    def start(self) -> Tap:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(15)

    def snapshot(self) -> list[Tapped]:
        with self._lock:
            return list(self.records)

    def _run(self) -> None:
        from confluent_kafka import Consumer

        consumer = Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": f"tap-{time.time()}",
                "auto.offset.reset": "earliest",
                "log_level": 0,
                "topic.metadata.refresh.interval.ms": 2000,
            }
        )
        consumer.subscribe(self.topics)
        try:
            while not self._stop.is_set():
                for msg in consumer.consume(500, timeout=0.5):
                    if msg.error():
                        continue
                    ident = (str(msg.topic()), msg.key(), msg.value())
                    if ident in self._seen:  # a re-drive or a re-read after a broker loss
                        continue
                    self._seen.add(ident)
                    with self._lock:
                        self.records.append(
                            Tapped(
                                ident[0],
                                int(msg.partition() or 0),
                                msg.key(),
                                msg.value(),
                                time.time(),
                            )
                        )
        finally:
            consumer.close()


@dataclass(frozen=True)
class Produced:
    kind: str
    host: str
    inst: str
    seq: int
    rows: int
    ts: float
    value: bytes


def read_outboxes(paths: list[Path]) -> dict[tuple[str, str, str, int], Produced]:
    from stepwatch.contract import decode

    out: dict[tuple[str, str, str, int], Produced] = {}
    for path in paths:
        if not path.exists():
            continue
        for line in path.read_bytes().splitlines():
            parts = line.split(b" ")
            if len(parts) != 6:
                continue  # a line torn by kill -9
            kind, host, inst, seq, rows = (p.decode() for p in parts[:5])
            value = base64.b64decode(parts[5])
            key = (kind, host, inst, int(seq))
            if key not in out:
                out[key] = Produced(kind, host, inst, int(seq), int(rows), decode(value).ts, value)
    return out


@dataclass
class Report:
    produced: int = 0
    produced_rows: int = 0
    lost: int = 0
    partial: int = 0
    duplicated: int = 0
    duplicated_final: int = 0
    unexpected: int = 0
    lost_by_kind: Counter[str] = field(default_factory=Counter)
    dup_by_kind: Counter[str] = field(default_factory=Counter)
    lost_after: Counter[str] = field(default_factory=Counter)  # by the last fault before it
    opens_after: Counter[str] = field(default_factory=Counter)
    lost_examples: list[str] = field(default_factory=list)
    dup_examples: list[str] = field(default_factory=list)
    changes: int = 0
    changes_missing: int = 0
    changes_duplicated: int = 0
    duplicate_opens: int = 0
    inconsistent: int = 0  # changes whose opened_at / first_step differ from their open's
    reopened: int = 0
    open_examples: list[str] = field(default_factory=list)
    dlq_topic: int = 0
    dead_rows: Counter[str] = field(default_factory=Counter)


def last_fault(events: list[tuple[float, str]], ts: float) -> str:
    """The kind of the last fault injected before ``ts`` (``none`` before the first);
    ``after-broker`` once a broker was killed (within 10 s after ``ts``: records it
    acknowledged just before it died), whatever came since: a broker loss's
    consequences (re-used offsets, a forgotten changelog) outlive the next faults."""
    if any(kind == "broker" and t <= ts + 10 for t, kind in events):
        return "after-broker"
    before = [kind for t, kind in events if t <= ts]
    return before[-1] if before else "none"


def audit(
    store_path: Path,
    produced: dict[tuple[str, str, str, int], Produced],
    tapped: list[Tapped],
    detections_topic: str,
    dlq_topic: str,
    events: list[tuple[float, str]] | None = None,
) -> Report:
    from stepwatch.exporters.clickhouse.chdb_backend import ChdbStore

    report = Report(produced=len(produced), produced_rows=sum(p.rows for p in produced.values()))
    with ChdbStore(str(store_path)) as store:
        for kind, table in TABLES.items():
            raw = _counts(store, table, final=False)
            final = _counts(store, table, final=True)
            _compare(report, kind, raw, final, produced, events or [])
        changes = [json.loads(t.value) for t in tapped if t.topic == detections_topic and t.value]
        _detections(report, store, changes, events or [])
        for reason, n in store.query(
            "SELECT reason, count() FROM dead_letters GROUP BY reason"
        ).rows:
            report.dead_rows[str(reason)] = int(n)
    report.dlq_topic = sum(1 for t in tapped if t.topic == dlq_topic)
    return report


def _counts(store: Any, table: str, final: bool) -> dict[tuple[str, str, int], int]:
    rows = store.query(
        f"SELECT host, inst, seq, count() FROM {table} {'FINAL' if final else ''} "
        "GROUP BY host, inst, seq"
    ).rows
    return {(str(h), str(i), int(s)): int(n) for h, i, s, n in rows}


def _compare(
    report: Report,
    kind: str,
    raw: dict[tuple[str, str, int], int],
    final: dict[tuple[str, str, int], int],
    produced: dict[tuple[str, str, str, int], Produced],
    events: list[tuple[float, str]],
) -> None:
    mine = {(p.host, p.inst, p.seq): p for (k, *_), p in produced.items() if k == kind}
    for ident, p in mine.items():
        got = raw.get(ident, 0)
        if got == 0:
            report.lost += 1
            report.lost_by_kind[kind] += 1
            report.lost_after[last_fault(events, p.ts)] += 1
            if len(report.lost_examples) < 8:
                report.lost_examples.append(f"{kind} {ident} ts={p.ts:.1f}")
        elif got < p.rows:
            report.partial += 1
        elif got > p.rows:
            report.duplicated += 1
            report.dup_by_kind[kind] += 1
            if len(report.dup_examples) < 8:
                report.dup_examples.append(f"{kind} {ident} rows={got}/{p.rows}")
        if final.get(ident, 0) > p.rows:
            report.duplicated_final += 1
    report.unexpected += sum(1 for ident in raw if ident not in mine)


def _detections(
    report: Report, store: Any, changes: list[dict[str, Any]], events: list[tuple[float, str]]
) -> None:
    report.changes = len(changes)
    stored: Counter[tuple[str, str, int | None]] = Counter(
        (str(i), str(s), None if st is None else int(st))
        for i, s, st in store.query("SELECT id, state, step FROM detections").rows
    )
    wanted = Counter((c["id"], c["state"], c.get("step")) for c in changes)
    for ident in wanted:
        if stored.get(ident, 0) == 0:
            report.changes_missing += 1
        elif stored[ident] > wanted[ident]:
            report.changes_duplicated += 1
    first = {
        c["id"]: (c.get("opened_at"), c.get("first_step"))
        for c in sorted(changes, key=lambda c: c.get("ts", 0.0))
        if c["state"] == "open"
    }
    for c in changes:
        if c["id"] in first and (c.get("opened_at"), c.get("first_step")) != first[c["id"]]:
            report.inconsistent += 1
            if len(report.open_examples) < 8:
                report.open_examples.append(
                    f"id={c['id']} {c['state']} opened_at/first_step {c.get('opened_at')}/"
                    f"{c.get('first_step')} != open's {first[c['id']]}"
                )
    opens = Counter(c["id"] for c in changes if c["state"] == "open")
    report.duplicate_opens = sum(n - 1 for n in opens.values() if n > 1)
    for ident, n in opens.items():
        if n > 1 and len(report.open_examples) < 8:
            report.open_examples.append(f"id={ident} opened {n}x")
    report.reopened = _reopened(changes, report.open_examples, report.opens_after, events)


def _reopened(
    changes: list[dict[str, Any]],
    examples: list[str],
    after: Counter[str],
    events: list[tuple[float, str]],
) -> int:
    """Opens of a subject (job, type, rank, gpu, group, host) while another id of it is open."""
    open_ids: dict[tuple[Any, ...], set[str]] = defaultdict(set)
    count = 0
    for c in sorted(changes, key=lambda c: c.get("ts", 0.0)):
        subject = (
            c["job_id"],
            c["type"],
            c.get("rank"),
            c.get("gpu"),
            c.get("group"),
            c.get("host"),
        )
        if c["state"] == "open":
            others = open_ids[subject] - {c["id"]}
            if others:
                count += 1
                after[last_fault(events, float(c.get("ts", 0.0)))] += 1
                if len(examples) < 8:
                    examples.append(f"{subject} opened as {c['id']} while {sorted(others)} open")
            open_ids[subject].add(c["id"])
        elif c["state"] == "resolved":
            open_ids[subject].discard(c["id"])
    return count


def print_report(report: Report, faults: Counter[str], takeovers: list[float]) -> None:
    took = sorted(takeovers)
    print(
        f"faults injected        {sum(faults.values())}  "
        + " ".join(f"{k}={v}" for k, v in sorted(faults.items()))
    )
    print(f"messages produced      {report.produced}  (rows {report.produced_rows})")
    print(
        f"lost                   {report.lost}  "
        + " ".join(f"{k}={v}" for k, v in sorted(report.lost_by_kind.items()))
        + (f"  (+{report.partial} partly stored)" if report.partial else "")
        + _after(report.lost_after)
    )
    print(
        f"duplicated in store    {report.duplicated}  "
        + " ".join(f"{k}={v}" for k, v in sorted(report.dup_by_kind.items()))
        + f"  (after FINAL: {report.duplicated_final})"
    )
    print(
        f"unexpected in store    {report.unexpected}  (stored, not in an outbox: an agent "
        "killed between spool append and outbox write)"
    )
    print(
        f"detection changes      {report.changes}  missing in store {report.changes_missing}"
        f"  duplicated in store {report.changes_duplicated}"
    )
    print(
        f"inconsistent changes   {report.inconsistent}  (opened_at or first_step differ from "
        "the open's)"
    )
    print(
        f"duplicate opens        {report.duplicate_opens + report.reopened}  (same id "
        f"{report.duplicate_opens}, subject re-opened under a new id {report.reopened})"
        + _after(report.opens_after)
    )
    print(
        f"dead letters           topic {report.dlq_topic}  store "
        + (" ".join(f"{k}={v}" for k, v in report.dead_rows.items()) or "0")
    )
    if took:
        print(
            f"takeover times (s)     n={len(took)} min={took[0]:.1f} "
            f"median={took[len(took) // 2]:.1f} max={took[-1]:.1f}"
        )
    else:
        print("takeover times (s)     none measured")
    for line in report.lost_examples + report.dup_examples + report.open_examples:
        print(f"  example: {line}")


def _after(counts: Counter[str]) -> str:
    if not counts:
        return ""
    return "  by last fault before: " + " ".join(f"{k}={v}" for k, v in sorted(counts.items()))

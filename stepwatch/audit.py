"""Prove no loss and no invention downstream, from the agents' sequence numbers.

Every message carries a gap-free ``seq`` per (host, inst, kind). A
:class:`SeqAudit` fed with everything a consumer received says how many were
missing (gaps), duplicated, or arrived out of order, per stream.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from stepwatch.contract import KIND_OF, Message

StreamKey = tuple[str, str, str]  # (host, inst, kind)


@dataclass(frozen=True)
class AuditReport:
    messages: int
    streams: int
    missing: int
    duplicates: int
    out_of_order: int
    by_kind: dict[str, int]
    by_host: dict[str, int]

    @property
    def clean(self) -> bool:
        return self.missing == 0 and self.duplicates == 0 and self.out_of_order == 0


@dataclass
class SeqAudit:
    _seen: dict[StreamKey, set[int]] = field(default_factory=dict)
    _last: dict[StreamKey, int] = field(default_factory=dict)
    _dups: int = 0
    _ooo: int = 0
    _by_kind: Counter[str] = field(default_factory=Counter)
    _by_host: Counter[str] = field(default_factory=Counter)

    def add(self, message: Message) -> None:
        kind = KIND_OF[type(message)].value
        key = (message.host, message.inst, kind)
        seen = self._seen.setdefault(key, set())
        if message.seq in seen:
            self._dups += 1
            return
        seen.add(message.seq)
        if message.seq < self._last.get(key, -1):
            self._ooo += 1
        self._last[key] = max(message.seq, self._last.get(key, -1))
        self._by_kind[kind] += 1
        self._by_host[message.host] += 1

    def report(self) -> AuditReport:
        missing = sum(max(s) + 1 - len(s) for s in self._seen.values() if s)
        return AuditReport(
            messages=sum(self._by_kind.values()),
            streams=len(self._seen),
            missing=missing,
            duplicates=self._dups,
            out_of_order=self._ooo,
            by_kind=dict(self._by_kind),
            by_host=dict(self._by_host),
        )

"""Per-partition buffers and where each batch is cut.

A batch is a run of offsets of one topic partition, cut by size or age. Its
bounds name its insert_deduplication_token, so a batch inserted again after a
crash must have the *same* bounds. The sink records each new batch's bounds in
``sink_batches`` before inserting it; on assignment those plans (beyond the
committed offset) are handed to :meth:`Planner.assign`, and the planner cuts
exactly there again, whatever the size and age rules would say. Past the
plans, batching is normal.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from stepwatch.exporters.clickhouse.prepare import Record

TP = tuple[str, int]


@dataclass(frozen=True)
class Batch:
    topic: str
    partition: int
    first: int
    last: int
    records: list[Record]
    replayed: bool = False  # bounds come from a plan an earlier run left

    @property
    def tp(self) -> TP:
        return (self.topic, self.partition)


@dataclass
class _Partition:
    records: deque[Record] = field(default_factory=deque)
    since: float | None = None
    plans: deque[tuple[int, int]] = field(default_factory=deque)
    next_offset: int = -1  # every offset below this was buffered already


class Planner:
    def __init__(
        self,
        batch_messages: int = 5000,
        batch_seconds: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.batch_messages = batch_messages
        self.batch_seconds = batch_seconds
        self.clock = clock
        self._parts: dict[TP, _Partition] = {}

    def assign(self, tp: TP, plans: Iterable[tuple[int, int]] = ()) -> None:
        state = self._parts.setdefault(tp, _Partition())
        state.plans = deque(sorted(set(plans)))

    def revoke(self, tp: TP) -> None:
        self._parts.pop(tp, None)

    def pending_plans(self, tp: TP) -> list[tuple[int, int]]:
        state = self._parts.get(tp)
        return list(state.plans) if state else []

    def waiting(self) -> list[TP]:
        """Partitions whose next batch is a plan still waiting for its last records."""
        out: list[TP] = []
        for tp, state in self._parts.items():
            plan = state.plans[0] if state.plans else None
            if plan is not None and state.records and state.records[-1].offset < plan[1]:
                out.append(tp)
        return out

    def drop_plans(self, tp: TP, end: int) -> int:
        """Forget the plans of ``tp`` that end at or past ``end`` (the log's end); how many."""
        state = self._parts.get(tp)
        if state is None:
            return 0
        kept = deque(plan for plan in state.plans if plan[1] < end)
        dropped = len(state.plans) - len(kept)
        state.plans = kept
        return dropped

    @property
    def buffered(self) -> int:
        return sum(len(p.records) for p in self._parts.values())

    def add(self, record: Record) -> None:
        state = self._parts.setdefault((record.topic, record.partition), _Partition())
        if record.offset < state.next_offset:
            return  # a re-delivery: already buffered or written
        if not state.records:
            state.since = self.clock()
        state.records.append(record)
        state.next_offset = record.offset + 1

    def due(self, force: bool = False, only: Iterable[TP] | None = None) -> list[Batch]:
        """The batches ready to write (``force``: everything that can be cut now)."""
        wanted = set(only) if only is not None else None
        out: list[Batch] = []
        for tp, state in self._parts.items():
            if wanted is None or tp in wanted:
                out.extend(self._cut(tp, state, force))
        return out

    def _cut(self, tp: TP, state: _Partition, force: bool) -> list[Batch]:
        out: list[Batch] = []
        while state.records:
            head = state.records[0].offset
            plan = state.plans[0] if state.plans else None
            if plan is not None and plan[1] < head:
                state.plans.popleft()  # already behind us
                continue
            if plan is not None and head >= plan[0]:
                if state.records[-1].offset < plan[1]:
                    break  # wait for the rest of the planned batch
                taken = self._take_through(state, plan[1])
                state.plans.popleft()
                out.append(Batch(tp[0], tp[1], plan[0], plan[1], taken, replayed=True))
                continue
            limit = plan[0] if plan is not None else None
            before = self._count(state, limit)
            now = self.clock()
            age = now - (now if state.since is None else state.since)
            if before >= self.batch_messages:
                n = self.batch_messages
            elif before and (force or limit is not None or age >= self.batch_seconds):
                n = before
            else:
                break
            taken = [state.records.popleft() for _ in range(n)]
            out.append(Batch(tp[0], tp[1], taken[0].offset, taken[-1].offset, taken))
        if out or not state.records:
            state.since = self.clock() if state.records else None
        return out

    @staticmethod
    def _count(state: _Partition, limit: int | None) -> int:
        if limit is None:
            return len(state.records)
        n = 0
        for record in state.records:
            if record.offset >= limit:
                break
            n += 1
        return n

    @staticmethod
    def _take_through(state: _Partition, last: int) -> list[Record]:
        taken: list[Record] = []
        while state.records and state.records[0].offset <= last:
            taken.append(state.records.popleft())
        return taken

"""Drive one scenario tick by tick, and merge scenarios into one time-ordered stream.

Each host's agent ticks every ``tick_seconds`` at its own phase; at each tick it
sends one StepMessage (the records of its ranks whose step ended since the
previous tick), one GpuMessage and one PortMessage. Events go out at their own
time. Messages of one scenario are generated in time order; scenarios are
merged by timestamp, then stamped with ``inst`` and a gap-free ``seq`` per
(host, kind), as an agent would.
"""

from __future__ import annotations

import heapq
import itertools
import zlib
from collections import defaultdict, deque
from collections.abc import Iterator

import msgspec
import numpy as np

from stepwatch.contract import KIND_OF, EventMessage, Message, StepMessage, StepRecord
from stepwatch.sim.activity import activity
from stepwatch.sim.gpu import GpuModel
from stepwatch.sim.ports import Carry, PortModel
from stepwatch.sim.records import RecordBuilder
from stepwatch.sim.scenario import Scenario, Target, resolve_all
from stepwatch.sim.timing import Outcome, StepBlock, StepModel


def rngs(sc: Scenario) -> list[np.random.Generator]:
    """Independent streams (steps, gpu, ports, agent phases) for one scenario."""
    entropy = [sc.seed & 0xFFFFFFFF, zlib.crc32(sc.job_id.encode())]
    return [np.random.default_rng(s) for s in np.random.SeedSequence(entropy).spawn(4)]


class JobRun:
    """The message stream of one scenario."""

    def __init__(self, sc: Scenario, carry: Carry | None = None) -> None:
        self.sc = sc
        r_steps, r_gpu, r_ports, r_phase = rngs(sc)
        self.model = StepModel(sc, r_steps)
        self.records = RecordBuilder(sc, self.model.has_loss)
        self.gpu = GpuModel(sc, r_gpu) if sc.with_gpu else None
        self.ports = PortModel(sc, r_ports, carry) if sc.with_ports else None
        self.phase = r_phase.random(sc.nodes) * sc.tick_seconds
        self.rank_phase = np.repeat(self.phase, sc.gpus_per_node)
        self.blocks: deque[StepBlock] = deque()
        self.pending: dict[int, dict[int, list[StepRecord]]] = defaultdict(
            lambda: defaultdict(list)
        )
        self.events: list[tuple[float, int, EventMessage]] = []
        self._event_no = 0

    def __iter__(self) -> Iterator[Message]:
        sc, tick = self.sc, self.sc.tick_seconds
        steps = iter(self.model)
        last_t1, exhausted, k = float("-inf"), False, 0
        while True:
            w0 = sc.start_ts + k * tick
            w1 = w0 + tick
            while not exhausted and last_t1 <= w1:
                block = next(steps, None)
                if block is None:
                    exhausted = True
                    break
                self._add(block)
                last_t1 = block.t1
            self._drain_events()
            stop = self.model.stop if exhausted else None
            if stop is not None and w0 > stop.ts + self._tail(stop.outcome):
                return
            yield from self._window(k, w0, w1)
            while self.blocks and float(self.blocks[0].end.max()) < w0 - tick:
                self.blocks.popleft()
            k += 1

    def _tail(self, outcome: Outcome) -> float:
        if outcome in (Outcome.HANG, Outcome.CRASH):
            return self.sc.hang_tail
        return self.sc.end_tail_seconds

    def _add(self, block: StepBlock) -> None:
        sc = self.sc
        self.blocks.append(block)
        ranks, records = self.records.build(block)
        if not records:
            return
        ticks = np.ceil((block.end[ranks] - sc.start_ts - self.rank_phase[ranks]) / sc.tick_seconds)
        hosts = ranks // sc.gpus_per_node
        key = ticks.astype(np.int64) * sc.nodes + hosts
        cuts = [0, *(np.flatnonzero(np.diff(key)) + 1).tolist(), len(records)]
        tick_of, host_of = ticks.astype(np.int64).tolist(), hosts.tolist()
        for lo, hi in itertools.pairwise(cuts):  # runs of one host and tick
            self.pending[tick_of[lo]][host_of[lo]].extend(records[lo:hi])

    def _drain_events(self) -> None:
        for event in self.model.events:
            heapq.heappush(self.events, (event.ts, self._event_no, event))
            self._event_no += 1
        self.model.events.clear()

    def _window(self, k: int, w0: float, w1: float) -> list[Message]:
        sc = self.sc
        out: list[Message] = []
        while self.events and self.events[0][0] < w1:
            out.append(heapq.heappop(self.events)[2])
        host_ts = w0 + self.phase
        for h, records in sorted(self.pending.pop(k, {}).items()):
            out.append(
                StepMessage(
                    host=sc.host_names[h],
                    ts=round(float(host_ts[h]), 6),
                    job_id=sc.job_id,
                    steps=records,
                )
            )
        if self.gpu is not None or self.ports is not None:
            ts = w0 + self.rank_phase
            act = activity(sc, self.blocks, self.model.stop, ts - sc.tick_seconds, ts)
            active = self._active(float(w0))
            if self.gpu is not None:
                out.extend(self.gpu.sample(ts, act, active))
            if self.ports is not None:
                out.extend(self.ports.sample(ts, act, active, self.model.flap_windows))
        out.sort(key=lambda m: m.ts)
        return out

    def _active(self, t: float) -> list[Target]:
        marks = self.model.marks
        out = []
        for target in self.model.targets:
            mark = marks.get(target.index)
            if mark is not None and mark[0] <= t and (mark[1] is None or t < mark[1]):
                out.append(target)
        return out


def simulate(*scenarios: Scenario, carry: Carry | None = None) -> Iterator[Message]:
    """Contract messages of every scenario, merged in time order, deterministic.

    Realtime scenarios start now; pass the output of
    :func:`~stepwatch.sim.scenario.resolve_all` to get the same start in
    :func:`ground_truth`. ``carry`` keeps the hosts' NIC counters across calls (a job
    restarted on some of the same hosts: their counters go on, they do not reboot).
    """
    resolved = resolve_all(scenarios)
    streams = [iter(JobRun(sc, carry)) for sc in resolved]
    seeds = ",".join(f"{sc.seed}:{sc.job_id}" for sc in resolved)
    inst = f"sim{zlib.crc32(seeds.encode()):08x}"
    seq: dict[tuple[str, str], int] = {}
    for message in heapq.merge(*streams, key=lambda m: m.ts):
        key = (message.host, KIND_OF[type(message)].value)
        n = seq.get(key, 0)
        seq[key] = n + 1
        yield msgspec.structs.replace(message, inst=inst, seq=n)

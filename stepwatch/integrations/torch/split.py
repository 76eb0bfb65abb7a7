"""Split a framework's hidden communication wait out of the phase that holds it.

Pure Python (no torch): the torch hooks feed it *launch marks* and it rewrites
a step's spans when the step ends (a :data:`stepwatch.sdk.StepHook`).

DDP launches each gradient bucket's all-reduce from backward hooks and waits
for all of them at the end of ``backward()``. The last bucket is launched when
the rank's own backward compute is done, so the span of the phase ``backward``
splits at the last launch: before it, ``backward`` (compute, overlapped with
the earlier buckets' all-reduces); after it, ``comm_wait`` (the exposed wait
for the peers). With CUDA timing the launch also records a CUDA event on the
current stream, so the split point is GPU time too, without a synchronize.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field

from stepwatch.logs import LogOnce
from stepwatch.sdk import Span, TimingEvent
from stepwatch.sdk.phases import Phase, canonical

logger = logging.getLogger(__name__)

COMM_WAIT = Phase.COMM_WAIT.value


@dataclass(frozen=True, slots=True)
class Launch:
    """The last collective a backward pass launched: when, and its CUDA event."""

    ns: int
    event: TimingEvent | None


@dataclass(frozen=True, slots=True)
class Wait:
    """An interval the rank spent blocked in a framework's collective wait."""

    start: int
    end: int
    first: TimingEvent | None
    last: TimingEvent | None


@dataclass
class CommStats:
    """What the integration saw (``handle.stats()``); read it for your own logs."""

    steps: int = 0  # steps that ended
    split: int = 0  # backward spans split into backward + comm_wait
    unmatched: int = 0  # collectives launched outside a `backward` phase
    buckets: int = 0  # all-reduces timed
    comm_seconds: float = 0.0  # their summed wall time (overlapped or not; gloo only)
    errors: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, object]:
        return {
            "steps": self.steps,
            "split": self.split,
            "unmatched": self.unmatched,
            "buckets": self.buckets,
            "comm_seconds": round(self.comm_seconds, 6),
            "errors": dict(self.errors),
        }


class WaitSplitter:
    """Collects launch marks during a step; splits ``backward`` spans at step end.

    ``launched`` runs on whatever thread the framework calls its hook from;
    ``__call__`` (the step hook) on the training thread after ``backward()``
    returned, so every launch of the step is in by then.
    """

    def __init__(self, phase: Phase = Phase.BACKWARD) -> None:
        self.phase = phase
        self.stats = CommStats()
        self.log = LogOnce(logger)
        self._lock = threading.Lock()
        self._launches: list[Launch] = []
        self._waits: list[Wait] = []

    def launched(self, ns: int, event: TimingEvent | None) -> None:
        """The last collective of a backward pass was launched at ``ns``."""
        with self._lock:
            self._launches.append(Launch(ns, event))

    def waited(self, wait: Wait) -> None:
        """The rank waited for a collective from ``wait.start`` to ``wait.end``
        (e.g. FSDP's all-gather before a module's forward): carved out of the
        phase that holds it into ``comm_wait``."""
        with self._lock:
            self._waits.append(wait)

    def comm_done(self, seconds: float) -> None:
        self.stats.buckets += 1
        self.stats.comm_seconds += seconds

    def error(self, key: str, err: BaseException) -> None:
        self.stats.errors[key] = self.stats.errors.get(key, 0) + 1
        self.log(key, "stepwatch torch: %s failed err=%r; training continues untouched", key, err)

    def __call__(self, spans: list[Span], step: int) -> None:
        with self._lock:
            launches, self._launches = self._launches, []
            waits, self._waits = self._waits, []
        self.stats.steps += 1
        if launches:
            self._split_at_launches(spans, launches, step)
        if waits:
            spans[:] = carve(spans, waits, self.stats)

    def _split_at_launches(self, spans: list[Span], launches: list[Launch], step: int) -> None:
        out: list[Span] = []
        for span in spans:
            name, start, end, first, last = span
            inside = [x for x in launches if start <= x.ns <= end]
            if not inside or canonical(name) is not self.phase:
                out.append(span)
                continue
            cut = max(inside, key=lambda x: x.ns)
            launches = [x for x in launches if x not in inside]
            # with CUDA timing both halves need events; without the launch's, keep wall marks
            mid = cut.event if (first is not None and last is not None) else None
            if first is not None and mid is None:
                out.append(span)
                self.error("cuda_event", RuntimeError("no CUDA event at the last launch"))
                continue
            out.append((name, start, cut.ns, first, mid))
            out.append((COMM_WAIT, cut.ns, end, mid, last))
            self.stats.split += 1
        if launches:
            self.stats.unmatched += len(launches)
            self.log(
                "unmatched",
                "stepwatch torch: %s collective(s) launched outside a %r "
                "phase in step %s; wrap loss.backward() in sw.step's phase(%r) to measure "
                "the exposed wait",
                len(launches),
                self.phase.value,
                step,
                self.phase.value,
            )
        spans[:] = out


def carve(spans: list[Span], waits: list[Wait], stats: CommStats) -> list[Span]:
    """Cut each wait out of the span that holds it: (a, w0) + comm_wait (w0, w1) + (w1, b).

    A wait no span holds whole, or one without CUDA events inside an event-timed
    span, is left where it is (counted as unmatched)."""
    out = list(spans)
    for wait in sorted(waits, key=lambda w: w.start):
        for i, (name, a, b, first, last) in enumerate(out):
            if name == COMM_WAIT or not (a <= wait.start <= wait.end <= b):
                continue
            timed = first is not None and last is not None
            if timed and (wait.first is None or wait.last is None):
                break
            f0, f1 = (wait.first, wait.last) if timed else (None, None)
            out[i : i + 1] = [
                (name, a, wait.start, first, f0),
                (COMM_WAIT, wait.start, wait.end, f0, f1),
                (name, wait.end, b, f1, last),
            ]
            stats.split += 1
            break
        else:
            stats.unmatched += 1
    return out

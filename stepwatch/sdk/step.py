"""The hot path: a step and its phases, measured with ``perf_counter_ns`` marks.

Everything here runs on the training thread, so it only takes marks (and, with
CUDA timing, records CUDA events, which is asynchronous) and appends tuples.
Records, datagrams and spans are built later by the sender, off this thread.
Nothing here raises into the training loop: misuse is reported through the
owner's log-once channel.
"""

from __future__ import annotations

from collections.abc import Callable
from time import perf_counter_ns
from types import TracebackType
from typing import TYPE_CHECKING, Any

from stepwatch.sdk.cpuwait import Usage
from stepwatch.sdk.cuda import EventPool, TimingEvent
from stepwatch.sdk.identity import Identity

if TYPE_CHECKING:
    from stepwatch.sdk.client import StepWatch

# (name, start perf ns, end perf ns, start event, end event)
Span = tuple[str, int, int, TimingEvent | None, TimingEvent | None]
# Called on the training thread when a step ends, with the step's spans (which it
# may rewrite, e.g. split a framework's hidden wait out of a phase) and the step's
# number. See StepWatch.add_step_hook.
StepHook = Callable[[list[Span], int], None]


class RawStep:
    """A finished step as the training thread saw it: marks, events, counts."""

    __slots__ = (
        "cpu",
        "end_event",
        "end_ns",
        "flops",
        "identity",
        "loss",
        "number",
        "samples",
        "spans",
        "start_event",
        "start_ns",
        "tokens",
    )

    def __init__(
        self, step: Step, end_ns: int, end_event: TimingEvent | None, cpu: Usage | None = None
    ) -> None:
        self.identity: Identity = step._identity
        self.cpu = cpu  # the thread's (on-CPU ns, run-queue wait ns) over the step
        self.number: int = step._number
        self.start_ns: int = step._start_ns
        self.end_ns = end_ns
        self.start_event: TimingEvent | None = step._start_event
        self.end_event = end_event
        self.spans: list[Span] = step._spans
        self.samples: Any = step.samples
        self.tokens: Any = step.tokens
        self.loss: Any = step.loss
        self.flops: Any = step.flops

    def events(self) -> list[TimingEvent]:
        """Every distinct CUDA event of the step (a mark's event may end one span
        and start the next)."""
        seen: dict[int, TimingEvent] = {}
        for event in (self.start_event, self.end_event):
            if event is not None:
                seen[id(event)] = event
        for _, _, _, first, last in self.spans:
            for event in (first, last):
                if event is not None:
                    seen[id(event)] = event
        return list(seen.values())


def record_event(pool: EventPool, owner: StepWatch) -> TimingEvent | None:
    """Record a CUDA event from the pool on the current stream (asynchronous)."""
    try:
        event = pool.take()
        event.record()
        return event
    except Exception as err:  # a CUDA error must not escape into training
        owner._misuse(
            "cuda_record",
            "stepwatch: CUDA event record failed err=%r; this step falls back to wall time",
            err,
        )
        return None


class PhaseTimer:
    """Context manager timing one phase of a step."""

    __slots__ = ("_event", "_name", "_start", "_step")

    def __init__(self, step: Step, name: str) -> None:
        self._step = step
        self._name = name
        self._start = 0
        self._event: TimingEvent | None = None

    def __enter__(self) -> PhaseTimer:
        step = self._step
        self._event = None if step._pool is None else record_event(step._pool, step._owner)
        step._open.append(self)
        self._start = perf_counter_ns()
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        end = perf_counter_ns()
        step = self._step
        if self._start < 0:  # already closed at its step's end (reported then)
            return
        if step._done:
            step._owner._misuse(
                "phase_after_step",
                "stepwatch: phase %r ended after its step ended; not recorded",
                self._name,
            )
            return
        event = None if step._pool is None else record_event(step._pool, step._owner)
        try:
            step._open.remove(self)
        except ValueError:
            pass
        step._spans.append((self._name, self._start, end, self._event, event))

    def close_at(self, end: int, event: TimingEvent | None) -> None:
        """End a phase left open when its step ends (misuse, reported by the owner)."""
        self._step._spans.append((self._name, self._start, end, self._event, event))
        self._start = -1


class Step:
    """One training step on this rank. Use as a context manager (``with sw.step()``)
    or through the explicit marks (``sw.mark(...)`` ... ``sw.end_step()``).

    Set ``samples``, ``tokens``, ``loss`` (a float; a NaN/inf loss is reported as
    such) and ``flops`` any time before the step ends.
    """

    __slots__ = (
        "_depth",
        "_done",
        "_identity",
        "_mark",
        "_number",
        "_open",
        "_owner",
        "_pool",
        "_sched0",
        "_spans",
        "_start_event",
        "_start_ns",
        "flops",
        "loss",
        "samples",
        "tokens",
    )

    def __init__(
        self,
        owner: StepWatch,
        number: int,
        samples: int,
        tokens: int,
        flops: float | None,
        loss: Any,
    ) -> None:
        self._owner = owner
        self._identity = owner._identity
        self._pool = owner._pool
        self._number = number
        self._spans: list[Span] = []
        self._open: list[PhaseTimer] = []
        self._mark: tuple[str, int, TimingEvent | None] | None = None
        self._depth = 0
        self._done = False
        self.samples = samples
        self.tokens = tokens
        self.flops = flops
        self.loss = loss
        self._start_event = None if self._pool is None else record_event(self._pool, owner)
        self._start_ns = now = perf_counter_ns()
        sched = owner._sched
        self._sched0 = sched.start(now) if sched is not None else None

    @property
    def step(self) -> int:
        """This step's number."""
        return self._number

    def phase(self, name: str) -> PhaseTimer | _NullContext:
        """A context manager timing the phase ``name`` (see docs/sdk.md for names)."""
        if self._done:
            self._owner._misuse(
                "phase_outside_step", "stepwatch: phase %r used outside a step; not recorded", name
            )
            return NULL_CONTEXT
        return PhaseTimer(self, name)

    def mark(self, name: str) -> None:
        """End the phase started by the previous mark (if any) and start ``name``."""
        now = perf_counter_ns()
        if self._done:
            self._owner._misuse("mark_outside_step", "stepwatch: mark %r on an ended step", name)
            return
        event = None if self._pool is None else record_event(self._pool, self._owner)
        self._close_mark(now, event)
        self._mark = (name, now, event)

    def end_phase(self) -> None:
        """End the phase started by the last mark without starting another."""
        if not self._done:
            now = perf_counter_ns()
            pool = self._pool
            self._close_mark(now, None if pool is None else record_event(pool, self._owner))

    def _close_mark(self, now: int, event: TimingEvent | None) -> None:
        if self._mark is not None:
            name, start, first = self._mark
            self._spans.append((name, start, now, first, event))
            self._mark = None

    def _finish(self) -> RawStep:
        """Close what is still open and snapshot the step (called once by the owner)."""
        end = perf_counter_ns()
        event = None if self._pool is None else record_event(self._pool, self._owner)
        self._close_mark(end, event)
        if self._open:
            names = [timer._name for timer in self._open]
            self._owner._misuse(
                "phase_not_closed",
                "stepwatch: phase(s) %s still open when step %s ended; closed at the step's end",
                names,
                self._number,
            )
            for timer in self._open:
                timer.close_at(end, event)
            self._open.clear()
        for hook in self._owner._step_hooks:
            try:
                hook(self._spans, self._number)
            except Exception as err:  # an integration must not break the step
                self._owner._misuse("step_hook", "stepwatch: step hook %r failed err=%r", hook, err)
        self._done = True
        sched = self._owner._sched
        return RawStep(self, end, event, None if sched is None else sched.since(self._sched0, end))

    def __enter__(self) -> Step:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._depth > 0:  # the inner `with` of a nested step (misuse, already reported)
            self._depth -= 1
            return
        self._owner._end(self, exc)  # returns None: user exceptions propagate unchanged


class _NullContext:
    """What misuse gets instead of a timer: does nothing, swallows nothing."""

    __slots__ = ()

    def __enter__(self) -> _NullContext:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def mark(self, name: str) -> None:
        return None


NULL_CONTEXT = _NullContext()

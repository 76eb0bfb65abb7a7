"""``StepWatch``: what ``stepwatch.init()`` returns to a training script.

The training thread only takes marks; everything else happens on the
sender thread. No method raises into the training loop: misuse (nested
steps, a phase never closed, a step number going backwards, a phase outside a
step) is logged once and counted in :meth:`StepWatch.stats`; exceptions raised
by user code inside ``with sw.step()`` propagate unchanged and are reported to
the agent as an ``exception`` rank event.
"""

from __future__ import annotations

import atexit
import logging
import math
import operator
import os
import sys
import threading
import time
import weakref
from collections import Counter
from time import perf_counter_ns
from typing import Any

from stepwatch.contract.records import INT64_MAX, EventType, plain_name
from stepwatch.contract.wire import RANK_EVENT_TYPES
from stepwatch.logs import LogOnce
from stepwatch.sdk.cpuwait import SchedStat
from stepwatch.sdk.cuda import EventPool, TimingEvent
from stepwatch.sdk.events import (
    checkpoint_begin_event,
    checkpoint_event,
    custom_event,
    exception_event,
    job_end_event,
    job_start_event,
)
from stepwatch.sdk.identity import Identity
from stepwatch.sdk.sender import Item, Sender
from stepwatch.sdk.step import (
    NULL_CONTEXT,
    PhaseTimer,
    Step,
    StepHook,
    _NullContext,
    record_event,
)

logger = logging.getLogger(__name__)


class StepWatch:
    """Per-process SDK handle. Build it with :func:`stepwatch.init`."""

    def __init__(
        self,
        identity: Identity,
        sender: Sender | None,
        *,
        pool: EventPool | None = None,
        timing: str = "wall",
        start_step: int = 0,
        sched: SchedStat | None = None,
    ) -> None:
        self._identity = identity
        self._sender = sender
        self._pool = pool
        self._sched = sched  # the thread's CPU time and run-queue wait (None: not measured)
        self.timing = timing
        self._next = start_step
        self._last: int | None = None
        self._current: Step | None = None
        self._misuse = LogOnce(logger)
        self._closed = False
        self._lifecycle = False  # rank 0 sends job_start / job_end (see announce)
        self._failed: str | None = None  # class of the last exception out of a step
        self._pid = os.getpid()
        self._step_hooks: tuple[StepHook, ...] = ()
        _track(self)  # closed at exit, off in a forked child (one hook each for all)

    # ------------------------------------------------------------------ identity
    @property
    def identity(self) -> Identity:
        return self._identity

    @property
    def enabled(self) -> bool:
        return self._sender is not None and not self._closed

    def set_group(self, group: str) -> None:
        """Set the peer-group key (e.g. pipeline stage ``"pp3"``) for the next steps.

        A group the agent would refuse (a control character, over 256 characters) is
        sent made plain (U+FFFD, clipped) and counted (``bad_group``): before, every later
        step was counted as sent and refused by the agent."""
        try:
            given = str(group)
            name = plain_name(given) or "all"
        except Exception as err:  # a group whose str() raises: never into training
            self._misuse("bad_group", "stepwatch: group cannot be read err=%r; unchanged", err)
            return
        if name != (given or "all"):
            self._misuse(
                "bad_group", "stepwatch: group %r is not a plain name; sent as %r", given, name
            )
        self._identity = self._identity.replace(group=name)

    # ------------------------------------------------------------------ integrations
    def add_step_hook(self, hook: StepHook) -> None:
        """Call ``hook(spans, step_number)`` on the training thread as each step ends.

        ``spans`` is the step's list of ``(name, start_ns, end_ns, start_event,
        end_event)`` (``perf_counter_ns`` marks; CUDA events or None); the hook may
        rewrite it in place, for example to split a framework's hidden
        communication wait out of the phase that contains it
        (:mod:`stepwatch.integrations.torch`). It must be quick; an exception is
        logged once and counted, never raised into training."""
        self._step_hooks = (*self._step_hooks, hook)

    def remove_step_hook(self, hook: StepHook) -> None:
        """Stop calling ``hook`` (no-op when it was not added)."""
        self._step_hooks = tuple(h for h in self._step_hooks if h is not hook)

    def new_event(self) -> TimingEvent | None:
        """A CUDA timing event from the SDK's pool, recorded now on the current
        stream, or None with wall timing (or when recording fails). Integrations use
        it to mark points inside a phase; put it in a span so it returns to the pool."""
        if self._pool is None:
            return None
        return record_event(self._pool, self)

    # ------------------------------------------------------------------ steps
    def step(
        self,
        step: int | None = None,
        *,
        samples: int = 0,
        tokens: int = 0,
        flops: float | None = None,
        loss: float | None = None,
    ) -> Step:
        """Start a step (context manager). ``step`` defaults to the last one + 1."""
        current = self._current
        if current is not None:
            self._misuse(
                "nested_step",
                "stepwatch: step() while step %s is still open (nested "
                "step, or a step never ended); treated as part of the open step",
                current.step,
            )
            current._depth += 1
            return current
        started = Step(self, self._number(step), samples, tokens, flops, loss)
        self._current = started
        return started

    start_step = step

    def end_step(
        self,
        *,
        samples: int | None = None,
        tokens: int | None = None,
        loss: float | None = None,
        flops: float | None = None,
    ) -> None:
        """End the open step (explicit-mark API); given values override the step's."""
        current = self._current
        if current is None:
            self._misuse("end_without_step", "stepwatch: end_step() with no open step")
            return
        if samples is not None:
            current.samples = samples
        if tokens is not None:
            current.tokens = tokens
        if loss is not None:
            current.loss = loss
        if flops is not None:
            current.flops = flops
        current._depth = 0
        self._end(current, None)

    def phase(self, name: str) -> PhaseTimer | _NullContext:
        """Time a phase of the open step (``with sw.phase("forward"):``)."""
        current = self._current
        if current is None:
            self._misuse(
                "phase_outside_step", "stepwatch: phase %r outside a step; not recorded", name
            )
            return NULL_CONTEXT
        return current.phase(name)

    def mark(self, name: str) -> None:
        """Start phase ``name`` now, ending the previous mark's phase; starts a step if
        none is open. End the step with :meth:`end_step`."""
        current = self._current if self._current is not None else self.step()
        current.mark(name)

    def end_phase(self) -> None:
        """End the last mark's phase without starting another."""
        if self._current is not None:
            self._current.end_phase()

    def _number(self, given: Any) -> int:
        number = self._next
        if given is not None:
            try:
                number = operator.index(given)
            except Exception:  # TypeError; a tensor on the meta device: RuntimeError
                self._misuse(
                    "bad_step",
                    "stepwatch: step=%r is not an integer; numbering automatically",
                    given,
                )
            if not 0 <= number <= INT64_MAX:  # beyond: every later step would be refused
                self._misuse(
                    "bad_step",
                    "stepwatch: step=%r is negative or above 2^63-1; numbering automatically",
                    given,
                )
                number = self._next
            elif self._last is not None and number <= self._last:
                self._misuse(
                    "step_backwards",
                    "stepwatch: step number went backwards (%s after %s); recorded as given",
                    number,
                    self._last,
                )
        self._last = number
        self._next = number + 1
        return number

    def _end(self, step: Step, exc: BaseException | None) -> None:
        """Called once when a step ends: snapshot it and hand it to the sender."""
        if self._current is step:
            self._current = None
        if step._done:
            return
        try:
            raw = step._finish()
            if exc is None:
                self._failed = None  # a step completed: the job recovered from any earlier error
                self._submit(raw)
            elif isinstance(exc, Exception):  # not KeyboardInterrupt / SystemExit
                self._failed = type(exc).__name__
                self._submit(exception_event(step._identity, exc, step.step))
        except Exception as err:
            self._misuse("internal", "stepwatch: could not record a step err=%r", err)

    def _submit(self, item: Item) -> None:
        if self._sender is not None and not self._closed:
            self._sender.submit(item)

    # ------------------------------------------------------------------ events
    def checkpoint(
        self,
        kind: str = "save",
        *,
        duration: float | None = None,
        path: str | os.PathLike[str] = "",
        step: int | None = None,
    ) -> CheckpointTimer | _NullContext:
        """Time a checkpoint save/load (``with sw.checkpoint("save"):``): a
        ``checkpoint_begin`` event on entering (the hang checks allow for a save in
        progress), a ``checkpoint_save``/``checkpoint_load`` event with its duration on
        leaving. Inside a step the time also counts as the step's ``checkpoint`` phase.
        With ``duration`` (seconds, measured by the caller) the end event is emitted at
        once, without a begin."""
        try:
            load = str(kind).lower() == "load"
            if str(kind).lower() not in {"save", "load"}:
                self._misuse(
                    "checkpoint_kind",
                    "stepwatch: checkpoint kind=%r is not save|load; using save",
                    kind,
                )
            number = step if step is not None else self._step_number()
            where = os.fspath(path) if isinstance(path, os.PathLike) else str(path)  # a Path
        except Exception as err:  # a kind or path whose str() raises: never into training
            self._misuse("internal", "stepwatch: checkpoint not reported err=%r", err)
            return NULL_CONTEXT
        if duration is None:
            return CheckpointTimer(self, load, where, number)
        try:
            seconds = max(0.0, float(duration))
            if not math.isfinite(seconds):  # JSON null: the agent refused the event (schema)
                raise ValueError(duration)
        except (TypeError, ValueError):
            self._misuse(
                "checkpoint_duration",
                "stepwatch: checkpoint duration=%r is not a number; not reported",
                duration,
            )
            return NULL_CONTEXT
        try:
            self._submit(
                checkpoint_event(
                    self._identity, load, seconds, time.time() - seconds, number, where
                )
            )
        except Exception as err:
            self._misuse("internal", "stepwatch: checkpoint not reported err=%r", err)
        return NULL_CONTEXT

    def event(self, type: str | EventType, detail: str = "", **attrs: Any) -> None:
        """Emit a rank event of a contract ``EventType`` a rank may report (e.g.
        ``"restart"``; not ``xid``, ``ecc`` or ``link_state``: the agent's collectors report
        the host's hardware, and its socket refuses them from a rank)."""
        try:
            kind = EventType(type)
            if kind not in RANK_EVENT_TYPES:
                raise ValueError(f"a rank cannot report a {kind.value} event")
            self._submit(custom_event(self._identity, kind, detail, attrs))
        except Exception as err:  # a detail whose str() raises, too: never into training
            self._misuse("bad_event", "stepwatch: cannot emit event type=%r err=%r", type, err)

    def report_exception(self, exc: BaseException, step: int | None = None) -> None:
        """Report an exception caught by the script (e.g. around explicit marks)."""
        try:
            number = step if step is not None else self._step_number()
            self._submit(exception_event(self._identity, exc, number))
        except Exception as err:
            self._misuse("internal", "stepwatch: could not report exception err=%r", err)

    def _step_number(self) -> int | None:
        return self._current.step if self._current is not None else self._last

    # ------------------------------------------------------------------ lifecycle
    @property
    def sent(self) -> int:
        """Datagrams handed to the agent socket."""
        return self._counts()[0]

    @property
    def dropped(self) -> int:
        """Steps and events dropped (no agent, buffer or queue full, oversized, ...)."""
        return sum(self._counts()[1].values())

    def _counts(self) -> tuple[int, Counter[str]]:
        if self._sender is None:
            return 0, Counter()
        return self._sender.counts()

    def stats(self) -> dict[str, Any]:
        sent, dropped = self._counts()
        return {
            "enabled": self.enabled,
            "timing": self.timing,
            "sent": sent,
            "dropped": sum(dropped.values()),
            "dropped_by": dict(dropped),
            "held": self._held(),
            "misuse": dict(self._misuse.counts),
        }

    def _held(self) -> int:
        """Datagrams held for an agent that is away (sent when it is back)."""
        processor = getattr(self._sender, "_processor", None)
        transport = getattr(processor, "sender", None)
        return int(getattr(transport, "held", 0))

    def flush(self, timeout: float = 2.0) -> bool:
        """Wait until everything recorded so far has been sent (or dropped)."""
        if self._sender is None or self._closed or os.getpid() != self._pid:
            return True
        try:
            return self._sender.flush(timeout)
        except Exception as err:
            self._misuse("internal", "stepwatch: flush failed err=%r", err)
            return False

    def announce(self, restarts: int | None = None) -> None:
        """On rank 0, send ``job_start`` now and ``job_end`` at close (init does this)."""
        if self._identity.rank != 0 or self._closed:
            return
        self._lifecycle = True
        self._submit(job_start_event(self._identity, self.timing, restarts))

    def hand_over(self, timeout: float, job_id: str) -> bool:
        """Close this handle for a new ``init`` in the same process. When this handle
        sent ``job_start`` for ``job_id``, the job goes on: no ``job_end`` now (the new
        handle sends it at its close) and True. Otherwise as :meth:`close`."""
        if self._closed or os.getpid() != self._pid:
            return False
        keep = self._lifecycle and self._identity.job_id == job_id
        if keep:
            self._lifecycle = False
        self.close(timeout)
        return keep

    def take_over(self, failed: str | None = None) -> None:
        """Send ``job_end`` at close for a job an earlier handle announced (rank 0), with
        the error that handle saw leave a step (``failed``) unless a step completes."""
        self._lifecycle = self._identity.rank == 0 and not self._closed
        self._failed = self._failed or failed

    def close(
        self, timeout: float = 2.0, error: str | None = None, *, raised: BaseException | None = None
    ) -> None:
        """Flush and stop the sender (idempotent; also run at interpreter exit).

        On rank 0 this sends ``job_end``: ``finished``; ``error: <class>`` when an
        exception left a step, ``error`` names one, or one is on its way out as this
        runs (a ``finally`` around the loop) or is ``raised`` (the one that ended the
        script, at exit); ``interrupted: KeyboardInterrupt`` for a Ctrl-C or SIGINT.
        An exception on its way out is sent first, on every rank, as one that left a
        step is (the worker tells a peer's failure from the user's error by it)."""
        if self._closed or os.getpid() != self._pid:
            return
        flying = None if error or self._failed else _leaving(raised or sys.exc_info()[1])
        if isinstance(flying, Exception):  # told as a step's would be (a peer's failure?)
            self._submit(exception_event(self._identity, flying, self._last))
        if self._lifecycle:
            failed = error or self._failed or (type(flying).__name__ if flying else None)
            self._submit(job_end_event(self._identity, failed, self._last))
        self._closed = True
        if self._sender is not None:
            try:
                self._sender.close(timeout)
            except Exception as err:
                self._misuse("internal", "stepwatch: close failed err=%r", err)

    def __enter__(self) -> StepWatch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class CheckpointTimer:
    """Context manager returned by :meth:`StepWatch.checkpoint`."""

    def __init__(self, owner: StepWatch, load: bool, path: str, step: int | None) -> None:
        self._owner = owner
        self._load = load
        self._path = path
        self._step = step
        self._start = 0
        self._wall = 0.0
        self._phase: PhaseTimer | _NullContext = NULL_CONTEXT

    def __enter__(self) -> CheckpointTimer:
        current = self._owner._current
        if current is not None:
            self._phase = current.phase("checkpoint")
            self._phase.__enter__()
        self._wall = time.time()
        self._start = perf_counter_ns()
        owner = self._owner
        try:
            owner._submit(
                checkpoint_begin_event(
                    owner._identity, self._load, self._wall, self._step, self._path
                )
            )
        except Exception as err:  # never into training
            owner._misuse("internal", "stepwatch: checkpoint begin not reported err=%r", err)
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        seconds = (perf_counter_ns() - self._start) / 1e9
        owner = self._owner
        try:
            self._phase.__exit__(exc_type, exc, tb)
            if exc is None:
                owner._submit(
                    checkpoint_event(
                        owner._identity, self._load, seconds, self._wall, self._step, self._path
                    )
                )
        except Exception as err:  # the user's own exception (if any) goes on as it was
            owner._misuse("internal", "stepwatch: checkpoint not reported err=%r", err)


_LIVE: weakref.WeakSet[StepWatch] = weakref.WeakSet()
_handles_lock = threading.RLock()  # init and its hand-over, one thread at a time
_exit_hook = False


def handles_locked() -> threading.RLock:
    """The lock an ``init`` holds from its new handle to its hand-over (a fresh one in a
    forked child: a thread that held it in the parent is not there to release it)."""
    return _handles_lock


def _track(sw: StepWatch) -> None:
    """Note ``sw`` for the at-exit close, registered once at the first handle: after
    whatever the program set up before it (an OpenTelemetry provider's own at-exit
    shutdown), so it runs before them and the last spans still go out."""
    global _exit_hook
    with _handles_lock:
        _LIVE.add(sw)
        if not _exit_hook:
            atexit.register(_close_all_at_exit)
            _exit_hook = True


def hand_over_live(timeout: float, job_id: str, new: StepWatch) -> bool:
    """At a new ``init``: close this process's open handles it replaces (one sender
    thread per rank, not one per call). True when one had announced ``job_id``: the job
    goes on, and ``new`` sends its ``job_end``. Handles of the other ranks of the same
    job (one process driving several GPUs: same job, same world size) are left alone;
    any other handle (an earlier init for another job, or before the rank was known) is
    replaced."""
    kept = False
    with _handles_lock:
        for sw in list(_LIVE):
            if sw is new or _sibling(sw.identity, new.identity):
                continue
            failed = sw._failed
            if sw.hand_over(timeout, job_id):
                kept = True
                new.take_over(failed)
    return kept


def _sibling(a: Identity, b: Identity) -> bool:
    """Another rank of the same job, as one process driving several GPUs has."""
    return a.rank != b.rank and a.job_id == b.job_id and a.world_size == b.world_size


def _off_in_child() -> None:
    """A forked child (a DataLoader worker, a subprocess) is not the rank: its records
    would carry the rank's identity and step numbers, and the parent's sender thread is
    not there to send them (they sat in its queue, counted as sent). The SDK is off in
    it (``enabled`` False); the parent goes on reporting the rank's steps."""
    global _handles_lock
    _handles_lock = threading.RLock()
    for sw in list(_LIVE):
        sw._sender = None


def _leaving(exc: BaseException | None) -> BaseException | None:
    """``exc``, the exception this thread is raising or handling now (a ``close`` in a
    ``finally`` that an exception goes through: it used to say ``finished``) or the one
    that ended the script, unless it is a clean ``SystemExit``."""
    if exc is None or isinstance(exc, GeneratorExit):
        return None
    if isinstance(exc, SystemExit) and exc.code in (0, None):
        return None
    return exc


def _close_all_at_exit() -> None:
    for sw in list(_LIVE):
        _close_at_exit(weakref.ref(sw))


def _close_at_exit(ref: weakref.ref[StepWatch]) -> None:
    sw = ref()
    if sw is not None:
        # the interpreter sets sys.last_value when an uncaught exception ends the script
        uncaught = getattr(sys, "last_value", None)
        sw.close(timeout=1.0, raised=uncaught if isinstance(uncaught, BaseException) else None)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_off_in_child)

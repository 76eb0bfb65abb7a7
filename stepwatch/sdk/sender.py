"""The SDK's sender: between the training thread and the agent socket.

:class:`BackgroundSender` (the default): the training thread appends the raw
step to a bounded deque (~0.1 µs; when full the item is dropped and counted)
and a daemon thread, waking every ``interval`` seconds, waits for the step's
CUDA events to complete (non-blocking ``query``), resolves it, sends the
datagram and, when enabled, builds the OTel spans.

:class:`InlineSender`: resolves and sends on the calling thread (wall timing
only, no spans). ``bench/bench_sdk.py`` measures both.
"""

from __future__ import annotations

import collections
import logging
import os
import threading
import time
from collections import Counter
from typing import Protocol

from stepwatch.contract.wire import RankEvent, RankStep
from stepwatch.logs import LogOnce
from stepwatch.sdk.cuda import EventPool, all_done
from stepwatch.sdk.otel import SpanBuilder
from stepwatch.sdk.resolve import Resolved, Resolver
from stepwatch.sdk.step import RawStep
from stepwatch.sdk.transport import DatagramSender

logger = logging.getLogger(__name__)

Item = RawStep | RankEvent
MAX_PENDING = 1024  # steps whose CUDA events have not completed yet
RETRY_BUDGET_S = 0.02  # per wake-up, the sender thread may wait this long for a full queue


class Sender(Protocol):
    def submit(self, item: Item) -> bool: ...

    def flush(self, timeout: float) -> bool: ...

    def close(self, timeout: float) -> None: ...

    def counts(self) -> tuple[int, Counter[str]]:
        """(datagrams sent, drops by reason)."""
        ...


class _Processor:
    """Resolve, send and trace one item; never raises."""

    def __init__(
        self,
        sender: DatagramSender,
        resolver: Resolver,
        spans: SpanBuilder | None,
        pool: EventPool | None,
    ) -> None:
        self.sender = sender
        self.resolver = resolver
        self.spans = spans
        self.pool = pool
        self.dropped: Counter[str] = Counter()
        self.log = LogOnce(logger)

    def process(self, item: Item) -> None:
        try:
            if isinstance(item, RankEvent):
                self.sender.send(item)
                return
            resolved = self.resolver.resolve(item)
            self.sender.send(RankStep(step=self.resolver.to_record(resolved)))
            if self.spans is not None:
                self._trace(resolved)
        except Exception as err:
            self.dropped["error"] += 1
            self.log("process", "stepwatch sdk: could not export an item err=%r", err)
        finally:
            if self.pool is not None and isinstance(item, RawStep):
                self.pool.give(item.events())

    def _trace(self, resolved: Resolved) -> None:
        try:
            assert self.spans is not None
            self.spans.emit(resolved)
        except Exception as err:
            self.dropped["otel_error"] += 1
            self.log("otel", "stepwatch sdk: could not build OTel spans err=%r", err)

    def counts(self) -> tuple[int, Counter[str]]:
        return self.sender.sent, self.sender.dropped + self.dropped


class InlineSender:
    """Resolve and send on the caller's thread (wall timing, no spans)."""

    def __init__(self, processor: _Processor) -> None:
        self._processor = processor

    def submit(self, item: Item) -> bool:
        self._processor.process(item)
        return True

    def flush(self, timeout: float) -> bool:
        return True

    def close(self, timeout: float) -> None:
        self._processor.sender.close()

    def counts(self) -> tuple[int, Counter[str]]:
        return self._processor.counts()


class BackgroundSender:
    """A bounded queue drained by a daemon sender thread."""

    def __init__(self, processor: _Processor, capacity: int = 4096, interval: float = 0.05) -> None:
        self._processor = processor
        self._queue: collections.deque[Item] = collections.deque()
        self._pending: collections.deque[RawStep] = collections.deque()
        self._capacity = max(1, capacity)
        self._interval = interval
        self._queue_full = 0
        self._submitted = 0
        self._handled = 0
        self._wake = threading.Event()
        self._stop = False
        self._pid = os.getpid()
        self._lock = threading.Lock()  # one drainer at a time (thread, or flush without it)
        self._thread = threading.Thread(target=self._run, name="stepwatch-sender", daemon=True)
        self._thread.start()

    def submit(self, item: Item) -> bool:
        """Training thread: enqueue or drop; never blocks."""
        if len(self._queue) >= self._capacity:
            self._queue_full += 1
            return False
        self._queue.append(item)
        self._submitted += 1
        return True

    def _run(self) -> None:
        while not self._stop:
            self._wake.wait(self._interval)
            self._wake.clear()
            self._drain()
        self._drain()

    def _drain(self, final: bool = False, wait: float = -1.0) -> None:
        """Send what is queued; ``wait``: how long to wait for the sender thread to let go
        (-1: as long as it takes). It may be stuck in a step's ``loss`` (a tensor on a
        hung GPU): then what is left is dropped and counted, and nobody waits on it."""
        if not self._lock.acquire(timeout=wait):
            left = len(self._queue) + len(self._pending)
            self._processor.dropped["close_timeout"] += left
            self._processor.log(
                "close_timeout",
                "stepwatch sdk: the sender thread did not finish in time; %s items dropped",
                left,
            )
            return
        try:
            self._drain_locked(final)
        except Exception as err:  # keep the thread alive whatever happens
            self._processor.log("drain", "stepwatch sdk: sender loop error err=%r", err)
        finally:
            self._lock.release()

    def _drain_locked(self, final: bool) -> None:
        process = self._processor.process
        self._processor.sender.allow_wait(RETRY_BUDGET_S)
        self._processor.sender.resend()  # what an absent agent did not take, first
        while self._queue:
            item = self._queue.popleft()
            if isinstance(item, RawStep) and (self._pending or not _ready(item)):
                self._pending.append(item)  # keep step order behind incomplete CUDA work
                continue
            process(item)
            self._handled += 1
        while self._pending and _ready(self._pending[0]):
            process(self._pending.popleft())
            self._handled += 1
        excess = len(self._pending) - (0 if final else MAX_PENDING)
        for _ in range(max(0, excess)):
            self._pending.popleft()
            self._processor.dropped["cuda_pending"] += 1
            self._handled += 1
        if excess > 0 and not final:
            self._processor.log(
                "pending",
                "stepwatch sdk: CUDA events of %s steps not complete; dropping the oldest",
                MAX_PENDING,
            )

    def flush(self, timeout: float) -> bool:
        """Wait (at most ``timeout`` s) until everything submitted so far is handled."""
        target = self._submitted
        deadline = time.monotonic() + max(0.0, timeout)
        while self._handled < target:
            if not self._thread.is_alive() or os.getpid() != self._pid:
                self._drain()  # no sender thread (stopped, or we are a forked child)
            else:
                self._wake.set()
            if time.monotonic() >= deadline:
                return self._handled >= target
            time.sleep(0.001)
        return True

    def close(self, timeout: float) -> None:
        """Send what is queued and stop, within ``timeout`` in all (never longer: the
        process must be able to exit whatever the sender thread is doing)."""
        deadline = time.monotonic() + max(0.0, timeout)
        self.flush(timeout)
        self._stop = True
        self._wake.set()
        if os.getpid() == self._pid and self._thread.is_alive():
            self._thread.join(timeout=max(0.0, deadline - time.monotonic()))
        # what is still pending (GPU never got there) is dropped
        self._drain(final=True, wait=max(0.0, deadline - time.monotonic()))
        self._processor.sender.close()

    def counts(self) -> tuple[int, Counter[str]]:
        sent, dropped = self._processor.counts()
        if self._queue_full:
            dropped["queue_full"] += self._queue_full
        return sent, dropped


def _ready(item: Item) -> bool:
    if not isinstance(item, RawStep) or item.end_event is None:
        return True
    try:
        return all_done(item.events())
    except Exception:  # a broken event: resolve now, the resolver falls back to wall time
        return True

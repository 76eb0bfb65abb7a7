"""Structured logs: ``key=value`` fields on one line, level and logger first."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable

FORMAT = 'ts=%(asctime)s level=%(levelname)s logger=%(name)s msg="%(message)s"'


class StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever ``sys.stderr`` is when a record comes, not the stream it was at
    set-up: a caller that swaps it (a test runner capturing output, then closing it) never
    leaves the handler writing to a closed file."""

    @property
    def stream(self) -> object:
        return sys.stderr

    @stream.setter
    def stream(self, _value: object) -> None:
        pass


def configure(level: str = "INFO") -> None:
    """Configure the root logger once for a CLI process."""
    root = logging.getLogger()
    if getattr(configure, "_done", False):
        root.setLevel(level.upper())
        return
    handler = StderrHandler()
    handler.setFormatter(logging.Formatter(FORMAT))
    root.addHandler(handler)
    root.setLevel(level.upper())
    for noisy in ("aiokafka", "faust", "mode", "kafka"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
    configure._done = True  # type: ignore[attr-defined]


class LogOnce:
    """Log a given (key) problem once, count every occurrence."""

    def __init__(self, logger: logging.Logger) -> None:
        self._logger = logger
        self._seen: set[str] = set()
        self.counts: dict[str, int] = {}

    def __call__(self, key: str, msg: str, *args: object, level: int = logging.WARNING) -> None:
        self.counts[key] = self.counts.get(key, 0) + 1
        if key not in self._seen:
            self._seen.add(key)
            self._logger.log(level, msg + " (further occurrences counted, not logged)", *args)


class RateLimit(logging.Filter):
    """Let through at most ``burst`` records per key and ``interval`` seconds.

    The key is the logger name and the record's first argument (for
    librdkafka's log callback: the facility, e.g. ``FAIL``, ``REQTMOUT``);
    the first record let through after a quiet spell says how many were
    suppressed (``suppressed=N``). An unreachable broker makes librdkafka log
    the same line every few hundred milliseconds per connection: this keeps
    one line per facility and interval.
    """

    def __init__(
        self, interval: float = 60.0, burst: int = 1, clock: Callable[[], float] = time.monotonic
    ) -> None:
        super().__init__()
        self.interval = interval
        self.burst = burst
        self.clock = clock
        self._windows: dict[tuple[str, str], tuple[float, int, int]] = {}  # start, let, dropped

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        key = (record.name, str(args[0]) if args else record.msg)
        now = self.clock()
        start, let, dropped = self._windows.get(key, (now, 0, 0))
        if now - start >= self.interval:
            start, let = now, 0
        if let >= self.burst:
            self._windows[key] = (start, let, dropped + 1)
            return False
        if dropped:
            record.msg = f"{record.msg} (suppressed={dropped} in the last {self.interval:.0f} s)"
            dropped = 0
        self._windows[key] = (start, let + 1, dropped)
        return True

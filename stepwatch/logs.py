"""Structured logs: ``key=value`` fields on one line, level and logger first."""

from __future__ import annotations

import logging
import sys

FORMAT = "ts=%(asctime)s level=%(levelname)s logger=%(name)s msg=\"%(message)s\""


def configure(level: str = "INFO") -> None:
    """Configure the root logger once for a CLI process."""
    root = logging.getLogger()
    if getattr(configure, "_done", False):
        root.setLevel(level.upper())
        return
    handler = logging.StreamHandler(sys.stderr)
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

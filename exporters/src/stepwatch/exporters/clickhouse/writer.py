"""Inserts that survive a flaky store and never stall on a poison row.

* A store error that may go away (store down, timeout, unknown table while an
  operator fixes the schema) is retried with capped exponential backoff, with
  the same ``insert_deduplication_token``, so an insert that did succeed
  before the error reached us is not written twice.
* An error caused by the data (ClickHouse could not parse or convert a value)
  bisects the block: each half is inserted with a derived token, down to the
  single rows the store refuses, which come back to the caller for the
  dead-letter table. The rest is written.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Sequence
from typing import Any

from stepwatch.errors import StepwatchError
from stepwatch.exporters.clickhouse.sink_metrics import SinkMetrics
from stepwatch.exporters.clickhouse.store import ClickHouseError, Store

log = logging.getLogger(__name__)


class StopRequested(StepwatchError):
    """The sink is shutting down while a write was being retried (nothing committed)."""


class Writer:
    def __init__(
        self,
        store: Store,
        metrics: SinkMetrics,
        *,
        retry_initial: float = 0.5,
        retry_max: float = 30.0,
        should_stop: Callable[[], bool] = lambda: False,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.store = store
        self.metrics = metrics
        self.retry_initial = retry_initial
        self.retry_max = retry_max
        self.should_stop = should_stop
        self.sleep = sleep

    def insert(
        self, table: str, columns: Sequence[str], rows: Sequence[Sequence[Any]], token: str
    ) -> None:
        """Insert, retrying errors that may pass; a data error is raised to the caller."""
        delay = self.retry_initial
        while True:
            started = time.perf_counter()
            try:
                self.store.insert(table, columns, rows, token=token)
            except ClickHouseError as err:
                if err.data_error:
                    raise
                self.metrics.retries.labels(table).inc()
                wait = delay * random.uniform(0.5, 1.5)  # jitter: sinks do not retry in lockstep
                log.warning(
                    "insert failed, retrying table=%s rows=%d delay_s=%.1f error=%s",
                    table,
                    len(rows),
                    wait,
                    err,
                )
                self._wait(wait)
                delay = min(delay * 2, self.retry_max)
                continue
            self.metrics.insert_seconds.labels(table).observe(time.perf_counter() - started)
            return

    def insert_isolating(
        self, table: str, columns: Sequence[str], rows: list[tuple[Any, ...]], token: str
    ) -> list[tuple[int, str]]:
        """Insert all rows the store accepts; return (index, error) of those it refuses."""
        refused: list[tuple[int, str]] = []
        self._bisect(table, columns, rows, 0, token, refused)
        if refused:
            log.warning(
                "rows refused by the store table=%s refused=%d of=%d",
                table,
                len(refused),
                len(rows),
            )
        return refused

    def _bisect(
        self,
        table: str,
        columns: Sequence[str],
        rows: list[tuple[Any, ...]],
        base: int,
        token: str,
        refused: list[tuple[int, str]],
    ) -> None:
        try:
            self.insert(table, columns, rows, token)
        except ClickHouseError as err:
            if len(rows) == 1:
                refused.append((base, str(err)))
                return
            mid = len(rows) // 2
            self._bisect(table, columns, rows[:mid], base, token + "/0", refused)
            self._bisect(table, columns, rows[mid:], base + mid, token + "/1", refused)

    def _wait(self, seconds: float) -> None:
        remaining = seconds
        while remaining > 0:
            if self.should_stop():
                raise StopRequested("stopping while an insert was being retried")
            step = min(0.2, remaining)
            self.sleep(step)
            remaining -= step

"""Where the sink's memory is: the embedded engine, its allocator, and Python.

The sink runs the ClickHouse engine in its own process (chdb), so the
process's RSS is the engine's caches, parts and allocator as much as Python's
objects, and Python's own tools (``tracemalloc``, ``gc``) see none of the
former. :func:`sample` reads, in-process:

* the engine's tracked memory and caches (``system.metrics``: ``MemoryTracking``,
  the mark, uncompressed, primary-index, query-condition and query caches);
* its parts (``system.parts``: active and outdated parts, primary keys in memory);
* its allocator (jemalloc, ``system.jemalloc_stats``: allocated, active,
  resident, mapped, retained);
* glibc's heap (``mallinfo2``: in use and free; Python's small-object arenas
  are ``mmap``-ed and not in it) and Python's allocated block count.

:func:`release` gives both allocators' freed pages back (the sink calls it
every ``SinkConfig.release_seconds``).

:class:`EngineMemoryCollector` serves the sample on the sink's ``/metrics``
(``stepwatch_sink_memory_bytes{part=...}``, ``stepwatch_sink_store_parts{state=...}``),
at most one sample per ``interval`` seconds whatever the scrape rate.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from stepwatch.errors import StoreError
from stepwatch.exporters.clickhouse.store import Store

log = logging.getLogger(__name__)

ENGINE_METRICS = {
    "MemoryTracking": "engine_tracked",
    "MarkCacheBytes": "mark_cache",
    "UncompressedCacheBytes": "uncompressed_cache",
    "PrimaryIndexCacheBytes": "primary_index_cache",
    "QueryConditionCacheBytes": "query_condition_cache",
    "QueryCacheBytes": "query_cache",
    "CompiledExpressionCacheBytes": "compiled_expression_cache",
}
_JEMALLOC = re.compile(
    r"Allocated: (\d+), active: (\d+), metadata: (\d+).*?resident: (\d+), mapped: (\d+), "
    r"retained: (\d+)"
)
_JEMALLOC_PARTS = ("allocated", "active", "metadata", "resident", "mapped", "retained")


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def _mallinfo2() -> Callable[[], _MallInfo2] | None:
    name = ctypes.util.find_library("c")
    try:
        fn = ctypes.CDLL(name).mallinfo2 if name else None
    except (OSError, AttributeError):  # not glibc, or glibc < 2.33
        return None
    if fn is not None:
        fn.restype = _MallInfo2
    return fn


_MALLINFO2 = _mallinfo2()


def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):  # not glibc
        return None


_MALLOC_TRIM = _malloc_trim()


def release(store: Store) -> None:
    """Give the allocators' freed pages back to the system: the engine's (jemalloc) and glibc's.

    Neither allocator returns all it frees on its own: jemalloc decays dirty
    pages lazily, glibc keeps free chunks in its per-thread arenas. Without this
    the sink's RSS creeps up by what they keep (measured in docs/streams.md).
    """
    before = jemalloc_bytes(store) if log.isEnabledFor(logging.DEBUG) else {}
    try:
        store.command("SYSTEM JEMALLOC PURGE")
    except StoreError as err:  # an engine built without jemalloc: nothing to give back
        log.debug("jemalloc purge failed error=%s", err)
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)
    if before:
        after = jemalloc_bytes(store)
        log.debug(
            "released jemalloc_resident_mib=%.1f->%.1f active_mib=%.1f",
            before.get("jemalloc_resident", 0) / 2**20,
            after.get("jemalloc_resident", 0) / 2**20,
            after.get("jemalloc_active", 0) / 2**20,
        )


def engine_bytes(store: Store) -> dict[str, float]:
    """The engine's tracked memory and cache sizes, in bytes."""
    names = ", ".join(f"'{n}'" for n in ENGINE_METRICS)
    rows = store.query(f"SELECT metric, value FROM system.metrics WHERE metric IN ({names})").rows
    return {ENGINE_METRICS[str(m)]: float(v) for m, v in rows}


def parts(store: Store) -> dict[str, float]:
    """Active and outdated parts of the store's database, and their primary keys' memory."""
    rows = store.query(
        "SELECT active, count(), sum(primary_key_bytes_in_memory_allocated) FROM system.parts "
        "WHERE database = currentDatabase() GROUP BY active"
    ).rows
    out = {"active": 0.0, "outdated": 0.0, "primary_key_bytes": 0.0}
    for active, count, pk in rows:
        out["active" if int(active) else "outdated"] = float(count)
        out["primary_key_bytes"] += float(pk)
    return out


def jemalloc_bytes(store: Store) -> dict[str, float]:
    """The engine allocator's totals (empty when the engine has no jemalloc)."""
    try:
        text = "\n".join(str(r[0]) for r in store.query("SELECT * FROM system.jemalloc_stats").rows)
    except StoreError:
        return {}
    match = _JEMALLOC.search(text)
    if match is None:
        return {}
    return {f"jemalloc_{k}": float(v) for k, v in zip(_JEMALLOC_PARTS, match.groups(), strict=True)}


def process_bytes() -> dict[str, float]:
    """glibc's heap (in use, free) and Python's allocated block count."""
    out = {"python_blocks": float(sys.getallocatedblocks())}
    if _MALLINFO2 is not None:
        info = _MALLINFO2()
        out["glibc_in_use"] = float(info.uordblks + info.hblkhd)
        out["glibc_free"] = float(info.fordblks)
    return out


def sample(store: Store) -> dict[str, float]:
    """Everything above in one dict (see the module docstring)."""
    out = engine_bytes(store)
    out.update(jemalloc_bytes(store))
    out.update(process_bytes())
    out.update({f"parts_{k}": v for k, v in parts(store).items()})
    return out


class EngineMemoryCollector(Collector):
    """The sample on ``/metrics``, taken at most every ``interval`` seconds."""

    def __init__(
        self,
        store: Store,
        interval: float = 10.0,
        extra: Callable[[], dict[str, float]] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.interval = interval
        self.extra = extra
        self.clock = clock
        self._lock = threading.Lock()
        self._at = -float("inf")
        self._last: dict[str, float] = {}

    def current(self) -> dict[str, float]:
        with self._lock:
            if self.clock() - self._at >= self.interval:
                self._at = self.clock()
                try:
                    self._last = sample(self.store)
                    if self.extra is not None:
                        self._last.update(self.extra())
                except StoreError as err:  # telemetry about telemetry: never fail a scrape
                    log.debug("engine memory sample failed error=%s", err)
            return dict(self._last)

    def collect(self) -> Iterator[Any]:
        values = self.current()
        mem = GaugeMetricFamily(
            "stepwatch_sink_memory_bytes",
            "The sink process's memory by where it is (engine, allocator, Python)",
            labels=["part"],
        )
        parts_g = GaugeMetricFamily(
            "stepwatch_sink_store_parts", "Parts of the embedded store", labels=["state"]
        )
        counts = GaugeMetricFamily(
            "stepwatch_sink_memory_objects",
            "Counts behind the sink's memory (Python blocks, dedup senders)",
            labels=["what"],
        )
        for key, value in sorted(values.items()):
            if key in ("parts_active", "parts_outdated"):
                parts_g.add_metric([key.removeprefix("parts_")], value)
            elif key in ("python_blocks", "dedup_senders"):
                counts.add_metric([key], value)
            else:
                mem.add_metric([key.removeprefix("parts_")], value)
        yield mem
        yield parts_g
        yield counts

    def describe(self) -> Iterator[Any]:
        return iter(())

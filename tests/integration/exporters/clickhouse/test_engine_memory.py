"""Where the sink's memory is: the embedded engine's own figures, read in-process
and served on /metrics at most once per interval."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from stepwatch.exporters.clickhouse.chdb_backend import ChdbStore
from stepwatch.exporters.clickhouse.engine_memory import EngineMemoryCollector, sample
from stepwatch.exporters.clickhouse.migrations import Migrator

pytestmark = pytest.mark.integration


@pytest.fixture()
def store(tmp_path):
    s = ChdbStore(str(tmp_path / "chdb"))
    Migrator(s).migrate()
    yield s
    s.close()


def test_sample_reads_the_engine_the_allocator_and_the_parts(store):
    store.command(
        "INSERT INTO sink_batches (consumer_group, topic, partition, first_offset, "
        "last_offset, messages, planned_at) VALUES ('g', 't', 0, 0, 9, 10, now())"
    )
    got = sample(store)
    assert got["engine_tracked"] > 0
    assert got["jemalloc_resident"] >= got["jemalloc_active"] >= got["jemalloc_allocated"] > 0
    assert got["parts_active"] >= 1
    assert got["mark_cache"] >= 0 and got["python_blocks"] > 0


def test_collector_samples_at_most_once_per_interval(store):
    now = [0.0]
    calls = []
    collector = EngineMemoryCollector(
        store,
        interval=10.0,
        clock=lambda: now[0],
        extra=lambda: calls.append(1) or {"dedup_senders": 3.0},
    )
    registry = CollectorRegistry()
    registry.register(collector)
    page = generate_latest(registry).decode()
    assert 'stepwatch_sink_memory_bytes{part="engine_tracked"}' in page
    assert 'stepwatch_sink_store_parts{state="active"}' in page
    assert 'stepwatch_sink_memory_objects{what="dedup_senders"} 3.0' in page
    generate_latest(registry)
    assert len(calls) == 1
    now[0] = 10.0
    generate_latest(registry)
    assert len(calls) == 2


def test_a_closed_store_does_not_fail_the_scrape(tmp_path):
    s = ChdbStore(str(tmp_path / "chdb"))
    s.close()
    registry = CollectorRegistry()
    registry.register(EngineMemoryCollector(s))
    assert "stepwatch_sink_memory_bytes" in generate_latest(registry).decode()


def test_the_engines_caches_are_bounded(store):
    from stepwatch.exporters.clickhouse.chdb_backend import CACHE_LIMITS

    rows = store.query(
        "SELECT name, value FROM system.server_settings WHERE name IN "
        "('mark_cache_size', 'index_mark_cache_size', 'primary_index_cache_size', "
        "'query_condition_cache_size')"
    ).rows
    assert {name: int(value) for name, value in rows} == CACHE_LIMITS

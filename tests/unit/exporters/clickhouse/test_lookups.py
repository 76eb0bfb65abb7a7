"""Store lookups in bounded chunks: one absurd key costs only its own answer."""

from __future__ import annotations

import logging
from typing import Any

import msgspec
import pytest

from stepwatch.contract import PortMessage, PortReading, encode
from stepwatch.errors import StoreError
from stepwatch.exporters.clickhouse.lookups import Key, Limits, lookup, tuple_literal
from stepwatch.exporters.clickhouse.prepare import Preparer, Record
from stepwatch.exporters.clickhouse.store import ClickHouseError, Result

pytestmark = pytest.mark.unit

NOW = 1767225600.0
MAX_QUERY = 262144  # ClickHouse's default max_query_size


def too_big() -> ClickHouseError:
    return ClickHouseError("Code: 62. DB::Exception: Max query size exceeded", 62)


class Asker:
    """A store's answer to a lookup: refuses a query over the size limit, like ClickHouse."""

    def __init__(self, fail: Exception | None = None) -> None:
        self.asked: list[list[Key]] = []
        self.fail = fail

    def __call__(self, chunk: list[Key]) -> dict[Key, str]:
        self.asked.append(chunk)
        if self.fail is not None:
            raise self.fail
        if sum(len(tuple_literal(k)) for k in chunk) > MAX_QUERY:
            raise too_big()
        return {k: f"v{k[1]}" for k in chunk if k[1] % 2 == 0}


def test_keys_go_in_chunks_bounded_by_count_and_bytes() -> None:
    ask = Asker()
    keys = [("h", i) for i in range(10)] + [("x" * 100, 10 + i) for i in range(5)]
    found = lookup(keys, ask, Limits(max_keys=4, max_bytes=250))
    assert [len(c) for c in ask.asked] == [4, 4, 4, 2, 1]
    assert all(sum(len(tuple_literal(k)) for k in c) <= 250 for c in ask.asked)
    assert found.found == {k: f"v{k[1]}" for k in keys if k[1] % 2 == 0}
    assert found.skipped == [] and found.unasked == [] and found.answered(keys) == keys


def test_a_key_too_long_to_ask_about_is_skipped_and_the_others_answered() -> None:
    ask = Asker()
    huge = ("x" * 200_000, 0)
    keys = [("a", 0), huge, ("b", 2), ("c", 3)]
    found = lookup(keys, ask)
    assert found.skipped == [huge] and found.unasked == []
    assert found.found == {("a", 0): "v0", ("b", 2): "v2"}
    assert all(huge not in c for c in ask.asked)


def test_a_chunk_the_store_refuses_is_halved_down_to_the_key_it_refuses() -> None:
    def ask(chunk: list[Key]) -> dict[Key, str]:
        if ("evil", 5) in chunk:
            raise too_big()
        return {k: "ok" for k in chunk}

    keys = [("h", i) for i in range(5)] + [("evil", 5)] + [("h", i) for i in range(6, 40)]
    found = lookup(keys, ask)
    assert found.skipped == [("evil", 5)] and found.unasked == []
    assert set(found.found) == set(keys) - {("evil", 5)}
    assert found.error is not None and "Max query size" in str(found.error)


def test_a_store_that_does_not_answer_ends_the_lookup_for_a_later_try() -> None:
    ask = Asker(StoreError("cannot reach the store"))
    keys = [("h", i) for i in range(10)]
    found = lookup(keys, ask, Limits(max_keys=3))
    assert len(ask.asked) == 1  # no halving, no hammering
    assert found.unasked == keys and found.skipped == [] and found.answered(keys) == []


def test_halving_stops_after_its_failure_budget() -> None:
    ask = Asker(too_big())
    keys = [("h", i) for i in range(64)]
    found = lookup(keys, ask, Limits(max_failures=5))
    assert len(ask.asked) == 6
    assert sorted(found.skipped + found.unasked) == keys and not found.found


class SizeLimitedStore:
    """A store that refuses queries over ClickHouse's default size and holds no readings."""

    backend = "fake"
    database = "t"

    def __init__(self) -> None:
        self.queries: list[str] = []

    def command(self, sql: str, params: Any = None) -> None:
        pass

    def query(self, sql: str, params: Any = None) -> Result:
        self.queries.append(sql)
        if len(sql.encode()) > MAX_QUERY:
            raise too_big()
        return Result((), (), [])

    def insert(self, table: str, columns: Any, rows: Any, token: str | None = None) -> int:
        return len(rows)

    def close(self) -> None:
        pass


def test_many_long_device_names_do_not_cost_the_ports_their_seed(caplog) -> None:
    store = SizeLimitedStore()
    prep = Preparer(store, now=lambda: NOW)
    devices = [f"mlx5_{i}" for i in range(50)] + [f"{'n' * 240}_{i:05d}" for i in range(1200)]
    msgs = [  # one batch of messages of at most MAX_DEVICES (256) ports each
        PortMessage(
            host="h1",
            ts=NOW - 5,
            inst="i",
            seq=k,
            ports=[
                PortReading(device=d, port=1, xmit_bytes_total=100) for d in devices[at : at + 250]
            ],
        )
        for k, at in enumerate(range(0, len(devices), 250))
    ]
    with caplog.at_level(logging.WARNING):
        out = prep.prepare([Record("t.ports", 0, k, encode(m), b"h1") for k, m in enumerate(msgs)])
    assert len(out.tables["port_samples"].rows) == len(devices)
    assert all(not prep.ports.needs_seed(("h1", "i", d, 1)) for d in devices)  # all looked up
    seed_queries = [q for q in store.queries if "FROM port_samples" in q]
    assert len(seed_queries) > 1 and all(len(q.encode()) <= MAX_QUERY for q in seed_queries)
    assert "store lookup" not in caplog.text  # nothing skipped, nothing failed


def test_a_key_the_store_refuses_costs_only_its_own_seed(caplog) -> None:
    class Refusing(SizeLimitedStore):
        def query(self, sql: str, params: Any = None) -> Result:
            if "'evil'" in sql:
                raise ClickHouseError("Code: 62. DB::Exception: Syntax error", 62)
            return super().query(sql, params)

    store = Refusing()
    prep = Preparer(store, now=lambda: NOW)
    devices = [f"mlx5_{i}" for i in range(30)] + ["evil"]
    msg = PortMessage(
        host="h1",
        ts=NOW - 5,
        inst="i",
        seq=0,
        ports=[PortReading(device=d, port=1, xmit_bytes_total=100) for d in devices],
    )
    with caplog.at_level(logging.WARNING):
        prep.prepare([Record("t.ports", 0, 0, encode(msg), b"h1")])
        later = msgspec.structs.replace(msg, seq=1, ts=NOW - 4)
        prep.prepare([Record("t.ports", 0, 1, encode(later), b"h1")])  # evil is not asked again
    assert all(not prep.ports.needs_seed(("h1", "i", d, 1)) for d in devices)  # evil: no seed
    assert caplog.text.count("store lookup skipped keys") == 1  # logged once

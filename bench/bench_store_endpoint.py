"""What the store endpoint's checks cost a query: latency three ways, same run, same store.

* engine: the statement on the owner's own chdb session (no HTTP, no checks);
* checks only: the endpoint's guard on that statement (``formatQuerySingleLine``,
  ``EXPLAIN AST`` and the tree and word checks: two extra engine round trips);
* endpoint: clickhouse-connect through the read-only endpoint over loopback HTTP
  (session, read-only, database and setting checks, the guard, the query).

Run: ``python bench/bench_store_endpoint.py [--repeat 200]``. Prints medians in ms
and the endpoint's share spent in the checks.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

from stepwatch.exporters.clickhouse import queries
from stepwatch.exporters.clickhouse.chdb_backend import ChdbStore, _open_session
from stepwatch.exporters.clickhouse.connect_backend import ClickHouseConnectStore
from stepwatch.exporters.clickhouse.migrations import Migrator
from stepwatch.exporters.clickhouse.service import USER, QueryService


def median_ms(fn: Callable[[], object], repeat: int) -> float:
    fn()
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeat", type=int, default=200)
    args = parser.parse_args()
    saved = queries.get("lemon_nodes")
    statements = {
        "SELECT 1": ("SELECT 1", {}),
        "saved query lemon_nodes": (saved.sql, saved.bind({"since": "0"}, now=1767229200.0)),
    }
    with tempfile.TemporaryDirectory(prefix="bench-endpoint-") as tmp:
        store = ChdbStore(str(Path(tmp) / "chdb"))
        Migrator(store, raw_ttl_days=20000).migrate()
        with QueryService(store.path) as ro:
            client = ClickHouseConnectStore(
                ro.url, USER, ro.password, "stepwatch", create_database=False
            )
            guard = ro._guard()
            session = _open_session(store.path)
            session.query("USE stepwatch")
            print(f"store endpoint, median of {args.repeat} requests (ms)")
            print(
                f"{'statement':26} {'engine':>8} {'checks':>8} "
                f"{'endpoint':>9} {'checks/endpoint':>16}"
            )
            for name, (sql, params) in statements.items():
                engine = median_ms(partial(store.query, sql, params), args.repeat)
                checks = median_ms(partial(guard.statement, session, sql, params), args.repeat)
                endpoint = median_ms(partial(client.query, sql, params), args.repeat)
                print(
                    f"{name:26} {engine:8.2f} {checks:8.2f} "
                    f"{endpoint:9.2f} {checks / endpoint:16.2f}"
                )
            session.close()
            client.close()
        store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

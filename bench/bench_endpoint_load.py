"""What concurrent heavy queries through the store endpoint cost the owner's process.

Starts the real endpoint (:class:`QueryService`) over a fresh embedded store
in a child process, fires ``--clients`` memory-hungry queries at once (a
GROUP BY over ``--keys`` distinct keys, which runs into its memory cap), and
prints the owner's RSS before, its peak, and its RSS after; and how many
queries ran, were stopped by their memory cap, or were refused (503).

Run: ``python bench/bench_endpoint_load.py`` (under a minute on 2 cores);
``--concurrent 0`` leaves the concurrency unbounded (the endpoint as it was
before issue 15), ``--total-gib 0`` leaves the total unbounded.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import http.client
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def call(url: str, password: str, sql: str) -> int:
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=300)
    try:
        conn.request(
            "GET",
            "/?" + urllib.parse.urlencode({"query": sql}),
            headers={"X-ClickHouse-User": "stepwatch", "X-ClickHouse-Key": password},
        )
        reply = conn.getresponse()
        body = reply.read()
        return reply.status if reply.status != 500 or b"MEMORY_LIMIT" not in body else 507
    finally:
        conn.close()


def child(args: argparse.Namespace) -> None:
    from stepwatch.exporters.clickhouse.chdb_backend import ChdbStore
    from stepwatch.exporters.clickhouse.service import QueryService

    path = os.path.join(tempfile.mkdtemp(prefix="stepwatch-load-"), "chdb")
    ChdbStore(path).close()
    kw = {
        "max_concurrent_queries": args.concurrent or 1000,
        "queue_seconds": args.queue,
        "max_memory_usage": int(args.per_query_gib * 2**30),
        "max_total_memory": int(args.total_gib * 2**30),
    }
    peak = [0.0]
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], rss_mib())
            time.sleep(0.05)

    with QueryService(path, **kw) as service:
        call(service.url, service.password, "SELECT 1")
        before = rss_mib()
        threading.Thread(target=watch, daemon=True).start()
        sql = (
            f"SELECT count() FROM (SELECT number % {args.keys} AS k, count() FROM "
            f"numbers({2 * args.keys}) GROUP BY k)"
        )
        with concurrent.futures.ThreadPoolExecutor(args.clients) as pool:
            codes = list(
                pool.map(lambda _: call(service.url, service.password, sql), range(args.clients))
            )
        time.sleep(2)
        done.set()
        print(
            json.dumps(
                {
                    "rss_before_mib": round(before),
                    "rss_peak_mib": round(peak[0]),
                    "rss_after_mib": round(rss_mib()),
                    "ok": codes.count(200),
                    "memory_capped": codes.count(507),
                    "refused_503": codes.count(503),
                    "per_query_cap_mib": service.limits["max_memory_usage"] // 2**20,
                }
            )
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=3)
    ap.add_argument("--concurrent", type=int, default=2)
    ap.add_argument("--queue", type=float, default=5.0)
    ap.add_argument("--per-query-gib", type=float, default=1.5)
    ap.add_argument("--total-gib", type=float, default=1.5)
    ap.add_argument("--keys", type=int, default=40_000_000)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
        return
    out = subprocess.run(
        [sys.executable, __file__, "--child", *sys.argv[1:]],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    print(" ".join(f"{k}={v}" for k, v in json.loads(out.strip().splitlines()[-1]).items()))


if __name__ == "__main__":
    main()

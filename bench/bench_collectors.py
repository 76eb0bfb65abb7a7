"""Per-tick cost of the host collectors, each next to a baseline from the same run.

* ``rdma``: one collect over the 9-port fixture tree (8 IB NDR + 1 RoCE, ~30
  files a port) with the cached file list and os.open/os.read, against a naive
  reader that walks the tree with pathlib and ``read_text`` every tick.
* ``nvml-replay``: one collect over the shipped 8-GPU H100 recording, against
  the bare fake reads of the same fields (the collector's own overhead).
* ``dcgm``: one collect of an 8-GPU dcgm-exporter page served over loopback
  HTTP, against the HTTP fetch alone (parse + fold overhead); and the page
  parse alone (label sets parsed once and cached) against
  ``prometheus_client``'s whole-page ``text_string_to_metric_families``.

Figures are per tick in µs (median, p99) and the share of a 1 s tick on one core.
The fixture tree is on an ordinary filesystem, not sysfs; a real sysfs read
costs a little more (the kernel formats the value on each read).

    python bench/bench_collectors.py [--ticks 2000]
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from stepwatch.agents.collectors.base import HostContext
from stepwatch.agents.collectors.dcgm import DcgmCollector, fetch
from stepwatch.agents.collectors.nvml import DYNAMIC_FIELDS, NvmlCollector
from stepwatch.agents.collectors.nvml_replay import ReplayNvml
from stepwatch.agents.collectors.promtext import Parser
from stepwatch.agents.collectors.rdma import RdmaCollector

ROOT = Path(__file__).resolve().parent.parent

SYSFS = ROOT / "tests" / "fixtures" / "sysfs"
PAGE = (ROOT / "tests" / "fixtures" / "dcgm" / "h100_8gpu_Hostname.prom").read_bytes()
CTX = HostContext(host="bench", now=time.time(), job_of_gpu={i: "job" for i in range(8)})


def timeit(fn: Callable[[], Any], ticks: int) -> tuple[float, float]:
    """Median and p99 in µs of ``ticks`` calls (after a short warm-up)."""
    for _ in range(min(50, ticks)):
        fn()
    samples = []
    for _ in range(ticks):
        t0 = time.perf_counter_ns()
        fn()
        samples.append((time.perf_counter_ns() - t0) / 1000)
    samples.sort()
    return statistics.median(samples), samples[int(len(samples) * 0.99) - 1]


def naive_rdma() -> list[dict[str, Any]]:
    """The obvious reader: rediscover with pathlib and read_text every file, every tick."""
    out = []
    for port in sorted((SYSFS / "class" / "infiniband").glob("*/ports/*")):
        values: dict[str, Any] = {"state": (port / "state").read_text().split(":")[1].strip()}
        for sub in ("counters", "hw_counters"):
            for f in (port / sub).iterdir():
                values[f.name] = int(f.read_text())
        out.append(values)
    return out


def serve() -> tuple[ThreadingHTTPServer, str]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"

        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", str(len(PAGE)))
            self.end_headers()
            self.wfile.write(PAGE)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    ).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/metrics"


def row(name: str, figures: tuple[float, float], baseline: tuple[float, float], what: str) -> None:
    med, p99 = figures
    print(
        f"{name:<22} median {med:9.1f} µs  p99 {p99:9.1f} µs  "
        f"({med / 1e4:.3f} % of a 1 s tick)   baseline [{what}] median {baseline[0]:9.1f} µs"
        f"  ratio {med / baseline[0]:.2f}x"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ticks", type=int, default=2000)
    args = parser.parse_args()
    n = args.ticks

    rdma = RdmaCollector(str(SYSFS), rediscover_ticks=60)
    assert len(naive_rdma()) == 9 and len(rdma.collect(CTX)[0].ports) == 9  # type: ignore[union-attr]
    row(
        "rdma collect (9 ports)",
        timeit(lambda: rdma.collect(CTX), n),
        timeit(naive_rdma, n),
        "pathlib walk + read_text",
    )

    api = ReplayNvml.from_file()
    nvml = NvmlCollector(api)
    nvml.collect(CTX)
    handles = list(range(8))

    def bare_reads() -> None:
        for h in handles:
            for f in DYNAMIC_FIELDS:
                api.read(h, f)

    row(
        "nvml-replay (8 GPUs)",
        timeit(lambda: nvml.collect(CTX), n),
        timeit(bare_reads, n),
        "bare fake reads",
    )

    server, url = serve()
    try:
        dcgm = DcgmCollector(url, timeout=1.0)
        ticks = max(50, n // 10)
        fetched = timeit(lambda: fetch(url, 1.0), ticks)
        row(
            "dcgm collect (8 GPUs)",
            timeit(lambda: dcgm.collect(CTX), ticks),
            fetched,
            "HTTP fetch only",
        )
        text = PAGE.decode()
        page_parser = Parser()
        whole = timeit(lambda: list(text_string_to_metric_families(text)), ticks)
        row(
            "dcgm page parse",
            timeit(lambda: page_parser.parse(text), ticks),
            whole,
            "prometheus_client whole page",
        )
    finally:
        server.shutdown()
        server.server_close()


if __name__ == "__main__":
    main()

"""Per-step cost of the step SDK inside the training process.

Each scenario runs a loop of N steps with 5 phases and no work in them, timing
every iteration with perf_counter_ns; the figures are per step in µs (median,
p99, mean), next to an empty loop of the same shape measured in the same run.
``cpu/step`` is the process CPU time (all threads, so it includes the sender
thread's encoding and sending) divided by N, flush included.

Scenarios: agent socket absent vs a listening agent (a child process draining
the socket), the default background sender vs sending inline on the training
thread (``init(background=False)``), the listening case without the CPU
run-queue reads (``init(cpu_wait=False)``), OTel spans built on the sender thread,
and for comparison OTel spans made on the hot path.

Between steps every loop sleeps ``--pace-us`` (outside the timed region): a
real training step releases the GIL for most of its time (CUDA launches, I/O,
collectives), which is when the sender thread runs. ``--pace-us 0`` gives the
worst case, where the sender thread competes with a busy Python loop.

    python bench/bench_sdk.py [--steps 10000] [--pace-us 100]
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

import stepwatch

PHASES = ("data", "forward", "backward", "comm_wait", "optimizer")
GOAL_US = 20.0
_DRAIN = r"""
import signal, socket, sys
sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
sock.bind(sys.argv[1])
count = 0
def stop(*_):
    print(count, flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
print("ready", flush=True)
while True:
    sock.recv(65536)
    count += 1
"""


class _Null:
    def __enter__(self) -> _Null:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


PACE_S = 0.0  # set from --pace-us


def empty_loop(n: int) -> list[int]:
    times = []
    null = _Null()
    pc = time.perf_counter_ns
    for _ in range(n):
        t0 = pc()
        with null:
            for _name in PHASES:
                with null:
                    pass
        times.append(pc() - t0)
        if PACE_S:
            time.sleep(PACE_S)
    return times


def sdk_loop(sw: stepwatch.StepWatch, n: int) -> list[int]:
    times = []
    pc = time.perf_counter_ns
    for i in range(n):
        t0 = pc()
        with sw.step(samples=32, tokens=32 * 4096) as s:
            for name in PHASES:
                with s.phase(name):
                    pass
            s.loss = 2.5 - i * 1e-6
        times.append(pc() - t0)
        if PACE_S:
            time.sleep(PACE_S)
    return times


def mark_loop(sw: stepwatch.StepWatch, n: int) -> list[int]:
    times = []
    pc = time.perf_counter_ns
    for _ in range(n):
        t0 = pc()
        for name in PHASES:
            sw.mark(name)
        sw.end_step(samples=32, tokens=32 * 4096, loss=2.5)
        times.append(pc() - t0)
        if PACE_S:
            time.sleep(PACE_S)
    return times


def otel_hot_loop(tracer: Any, n: int) -> list[int]:
    times = []
    pc = time.perf_counter_ns
    for _ in range(n):
        t0 = pc()
        with tracer.start_as_current_span("step"):
            for name in PHASES:
                with tracer.start_as_current_span(name):
                    pass
        times.append(pc() - t0)
        if PACE_S:
            time.sleep(PACE_S)
    return times


def provider() -> Any:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

    class Discard(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    tp = TracerProvider()
    tp.add_span_processor(SimpleSpanProcessor(Discard()))
    return tp


@contextlib.contextmanager
def agent(path: str) -> Iterator[list[int]]:
    """A child process draining the agent socket; yields [datagrams received]."""
    proc = subprocess.Popen([sys.executable, "-c", _DRAIN, path], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    proc.stdout.readline()
    received: list[int] = []
    try:
        yield received
    finally:
        time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=10)
        received.append(int(out.strip() or 0))


def run(
    label: str, loop: Callable[[int], list[int]], n: int, sw: stepwatch.StepWatch | None = None
) -> dict[str, Any]:
    loop(min(1000, n))  # warm-up
    if sw is not None:
        sw.flush(5.0)
    cpu0 = time.process_time()
    times = loop(n)
    if sw is not None:
        sw.flush(10.0)
    cpu = (time.process_time() - cpu0) / n * 1e6
    times.sort()
    row = {
        "scenario": label,
        "median": times[len(times) // 2] / 1e3,
        "p99": times[int(len(times) * 0.99)] / 1e3,
        "mean": statistics.fmean(times) / 1e3,
        "cpu": cpu,
        "sent": sw.sent if sw is not None else None,
        "dropped": sw.dropped if sw is not None else None,
    }
    if sw is not None:
        sw.close()
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=10000, help="steps per scenario")
    parser.add_argument(
        "--pace-us",
        type=float,
        default=100.0,
        help="sleep between steps, outside the timed region (0: busy loop)",
    )
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    global PACE_S
    PACE_S = args.pace_us / 1e6
    n = args.steps
    tmp = tempfile.mkdtemp(prefix="swbench")
    absent = os.path.join(tmp, "absent.sock")
    paths = iter(os.path.join(tmp, f"agent{i}.sock") for i in range(100))

    def sw(path: str, **kw: Any) -> stepwatch.StepWatch:
        return stepwatch.init(
            job_id="bench", agent_socket=path, timing="wall", env={}, job_events=False, **kw
        )

    rows = [run("empty loop (baseline)", empty_loop, n)]
    a = sw(absent)
    rows.append(run("sdk, no agent, background sender", lambda k: sdk_loop(a, k), n, a))
    a = sw(absent, background=False)
    rows.append(run("sdk, no agent, inline sendto", lambda k: sdk_loop(a, k), n, a))
    received = []
    with agent(live := next(paths)) as got:
        a = sw(live)
        rows.append(run("sdk, agent listening, background", lambda k: sdk_loop(a, k), n, a))
    received.append(got[0])
    with agent(live := next(paths)) as got:
        a = sw(live, cpu_wait=False)
        rows.append(run("  same, without cpu_wait reads", lambda k: sdk_loop(a, k), n, a))
    received.append(got[0])
    with agent(live := next(paths)) as got:
        a = sw(live, background=False)
        rows.append(run("sdk, agent listening, inline sendto", lambda k: sdk_loop(a, k), n, a))
    received.append(got[0])
    with agent(live := next(paths)) as got:
        a = sw(live)
        rows.append(run("marks API, agent listening", lambda k: mark_loop(a, k), n, a))
    received.append(got[0])
    with agent(live := next(paths)) as got:
        a = sw(live, tracer_provider=provider())
        rows.append(run("sdk + OTel spans off the hot path", lambda k: sdk_loop(a, k), n, a))
    received.append(got[0])
    tracer = provider().get_tracer("bench")
    rows.append(run("OTel spans on the hot path (no SDK)", lambda k: otel_hot_loop(tracer, k), n))
    shutil.rmtree(tmp, ignore_errors=True)
    report(rows, n, received, args.pace_us)


def report(rows: list[dict[str, Any]], n: int, received: list[int], pace: float) -> None:
    base = rows[0]["median"]
    print(
        f"stepwatch SDK per-step cost, {n} steps of 5 phases per scenario, {pace:g} µs "
        f"sleep between steps (python {sys.version.split()[0]}, {os.cpu_count()} cpus)"
    )
    head = (
        f"{'scenario':40} {'median':>8} {'p99':>8} {'mean':>8} {'+median':>8} "
        f"{'cpu/step':>9} {'sent':>7} {'dropped':>8}"
    )
    print(head)
    print("-" * len(head))
    for r in rows:
        sent = "" if r["sent"] is None else r["sent"]
        dropped = "" if r["dropped"] is None else r["dropped"]
        print(
            f"{r['scenario']:40} {r['median']:8.2f} {r['p99']:8.2f} {r['mean']:8.2f} "
            f"{r['median'] - base:8.2f} {r['cpu']:9.2f} {sent:>7} {dropped:>8}"
        )
    print(
        "(µs per step; +median = median minus the empty loop's median; the warm-up "
        "steps are sent too)"
    )
    print(f"datagrams received by the listening agents: {received}")
    by = {r["scenario"]: r for r in rows}
    sdk = by["sdk, agent listening, background"]
    hot = by["OTel spans on the hot path (no SDK)"]
    verdict = "met" if sdk["median"] - base < GOAL_US else "NOT met"
    print(
        f"goal < {GOAL_US:.0f} µs per step over the empty loop: {verdict} "
        f"(+{sdk['median'] - base:.2f} µs median, +{sdk['mean'] - rows[0]['mean']:.2f} µs mean)"
    )
    print(
        f"OTel spans on the hot path cost {hot['median'] / max(sdk['median'], 1e-9):.1f}x "
        f"the SDK step (median)"
    )


if __name__ == "__main__":
    main()

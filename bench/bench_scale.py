"""Benchmark one worker's detection core on one very large job (issue 18: Llama-3 scale).

The design point: one 16,384-GPU job (2,048 nodes x 8 GPUs x 8 NIC ports) with
1 s steps, GPU and port samples at 1 Hz, every record of the job on one worker.
For each job size (2,048, 8,192 and 16,384 ranks by default) a fresh process:

1. generates each second of event time in-process as contract messages (one
   step message of 8 records, one GPU message of 8 readings and one port
   message of 8 readings per host and second; a slow rank from a third of the
   run on), untimed, and encodes them, untimed;
2. **baseline**: decodes those bytes (``decode_unchecked``, the worker's
   floor), timed;
3. **engine**: decodes them again one by one and feeds each to
   :meth:`Engine.process` at once, in time order, and ticks the engine once per
   second of event time, as the replay and the worker drive it (the worker's
   GC settings, ``tune_gc``); the engine's CPU is that time less the
   baseline's, per second: that is the per-step latency, against the 1 s step.
   (Decoding a whole second before feeding any of it would leave every message
   out of the CPU caches by the time the engine reads it.)

Printed per size: RSS at its peak and at the end (MiB, whole process) and the
engine's share of it (RSS at the end minus RSS before the engine existed, per
rank), CPU seconds per second of event time over the whole run and its inverse
(x faster than real time; the first second alone, where the job, 2,048 host
windows and the sample stores are built, costs ~1 s of CPU at 16,384 ranks),
the same inverse once running ("steady": without the first quarter, like the
percentiles), p50/p99 of the per-second processing time, and the engine's CPU
over the decode's. Figures only: no pass/fail.

Run: ``python bench/bench_scale.py`` (``--ranks 2048 --seconds 60`` for a quick
look). The goal at 16,384 ranks: <= 1 GiB RSS, >= 10x faster than event time.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from stepwatch.contract import (
    EventMessage,
    EventType,
    GpuMessage,
    GpuReading,
    Message,
    Phases,
    PortMessage,
    PortReading,
    StepMessage,
    StepRecord,
    decode_unchecked,
    encode,
)

GPUS = 8
NICS = 8
GC_GEN0 = 50_000  # stepwatch.streams.worker.app.GC_GEN0_THRESHOLD (that module imports Faust)
PAGE = os.sysconf("SC_PAGE_SIZE")
GPU_NAME = "NVIDIA H100 80GB HBM3"


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


@dataclass
class Synth:
    """A healthy data-parallel job of ``ranks`` ranks, one slow rank from ``slow_from`` on."""

    ranks: int
    stages: int = 16  # pipeline stages: the peer groups
    step_s: float = 1.0
    start_ts: float = 1_767_225_600.0
    slow_rank: int = 9000
    slow_from: int = 60
    seed: int = 1

    def __post_init__(self) -> None:
        self.nodes = self.ranks // GPUS
        self.rng = np.random.default_rng(self.seed)
        self.hosts = [f"n{h:05d}" for h in range(self.nodes)]
        self.group = [f"stage{r * self.stages // self.ranks:02d}" for r in range(self.ranks)]
        self.job_id = f"llama-{self.ranks}"
        self.slow_rank %= self.ranks
        m = self.nodes * NICS
        self.counters = {
            name: np.zeros(m, np.int64)
            for name in (
                "xmit_bytes",
                "rcv_bytes",
                "xmit_packets",
                "rcv_packets",
                "xmit_wait",
                "np_cnp_sent",
                "rp_cnp_handled",
                "np_ecn_marked",
            )
        }
        self.energy = np.zeros(self.ranks, np.int64)

    def start(self) -> list[Message]:
        return [
            EventMessage(
                host=self.hosts[0],
                ts=self.start_ts,
                type=EventType.JOB_START,
                job_id=self.job_id,
                attrs={"world_size": self.ranks},
            )
        ]

    def second(self, k: int) -> list[Message]:
        """Every message of event second ``k``: step ``k``'s records, GPU and port samples."""
        out: list[Message] = [*self._steps(k), *self._gpus(k), *self._ports(k)]
        out.sort(key=lambda m: m.ts)
        return out

    def _steps(self, k: int) -> Iterator[StepMessage]:
        n, rng = self.ranks, self.rng
        t0 = self.start_ts + k * self.step_s
        fwd = 0.30 * (1 + 0.01 * rng.standard_normal(n))
        if k >= self.slow_from:
            fwd[self.slow_rank] *= 1.3
        bwd = 0.45 * (1 + 0.01 * rng.standard_normal(n))
        data = 0.02 * (1 + 0.05 * rng.standard_normal(n))
        opt = np.full(n, 0.05)
        busy = fwd + bwd + data + opt
        dur = np.full(n, max(float(busy.max()), 0.9 * self.step_s) + 0.05)
        comm = dur - busy
        start = t0 + 0.001 * rng.random(n)
        end = start + dur
        cols = [np.round(a, 6).tolist() for a in (start, end, data, fwd, bwd, opt, comm)]
        sends = np.round(end[::GPUS] + 0.01, 6).tolist()
        for h, host in enumerate(self.hosts):
            recs = []
            for r in range(h * GPUS, (h + 1) * GPUS):
                recs.append(
                    StepRecord(
                        job_id=self.job_id,
                        rank=r,
                        world_size=n,
                        step=k,
                        start=cols[0][r],
                        end=cols[1][r],
                        host=host,
                        local_rank=r % GPUS,
                        group=self.group[r],
                        phases=Phases(
                            data=cols[2][r],
                            forward=cols[3][r],
                            backward=cols[4][r],
                            optimizer=cols[5][r],
                            comm_wait=cols[6][r],
                        ),
                        samples=4,
                        tokens=32768,
                        flops=1.2e15,
                        cpu_time=0.9,
                        cpu_wait=0.01,
                    )
                )
            yield StepMessage(host=host, ts=sends[h], job_id=self.job_id, steps=recs)

    def _gpus(self, k: int) -> Iterator[GpuMessage]:
        n, rng = self.ranks, self.rng
        util = np.round(95 + 3 * rng.standard_normal(n), 1).tolist()
        temp = np.round(65 + 2 * rng.standard_normal(n), 0).tolist()
        power = np.round(650 + 20 * rng.standard_normal(n), 1).tolist()
        self.energy += 650_000
        energy = self.energy.tolist()
        ts = self.start_ts + k + 0.5
        for h, host in enumerate(self.hosts):
            gpus = [
                GpuReading(
                    index=g,
                    uuid=f"GPU-{h:05d}-{g}",
                    name=GPU_NAME,
                    pci_bus_id=f"0000:{g:02x}:00.0",
                    util_gpu_pct=util[r],
                    util_mem_pct=40.0,
                    fb_used_mib=70000.0,
                    fb_free_mib=11000.0,
                    temp_gpu_c=temp[r],
                    temp_mem_c=temp[r] + 6,
                    power_w=power[r],
                    power_limit_w=700.0,
                    energy_mj_total=energy[r],
                    sm_clock_mhz=1980.0,
                    sm_clock_max_mhz=1980.0,
                    mem_clock_mhz=2619.0,
                    throttle_reasons=0,
                    ecc_sbe_total=0,
                    ecc_dbe_total=0,
                    remapped_rows_correctable=0,
                    remapped_rows_uncorrectable=0,
                    remapped_rows_pending=False,
                    pcie_replay_total=0,
                    nvlink_tx_bytes_total=energy[r],
                    nvlink_rx_bytes_total=energy[r],
                    gr_engine_active=0.9,
                    tensor_active=0.6,
                    dram_active=0.4,
                )
                for g, r in enumerate(range(h * GPUS, (h + 1) * GPUS))
            ]
            yield GpuMessage(host=host, ts=round(ts + 1e-5 * h, 6), job_id=self.job_id, gpus=gpus)

    def _ports(self, k: int) -> Iterator[PortMessage]:
        c, rng = self.counters, self.rng
        m = len(c["xmit_bytes"])
        c["xmit_bytes"] += 40_000_000_000 // 8
        c["rcv_bytes"] += 40_000_000_000 // 8
        c["xmit_packets"] += 1_200_000
        c["rcv_packets"] += 1_200_000
        c["xmit_wait"] += rng.poisson(2000, m)
        c["np_cnp_sent"] += rng.poisson(2, m)
        c["rp_cnp_handled"] += rng.poisson(2, m)
        c["np_ecn_marked"] += rng.poisson(3, m)
        v = {name: a.tolist() for name, a in c.items()}
        ts = self.start_ts + k + 0.7
        for h, host in enumerate(self.hosts):
            ports = [
                PortReading(
                    device=f"mlx5_{i}",
                    port=1,
                    netdev=f"ens{i}np0",
                    link_layer="Ethernet",
                    state="ACTIVE",
                    phys_state="LinkUp",
                    rate_gbps=400.0,
                    xmit_bytes_total=v["xmit_bytes"][p],
                    rcv_bytes_total=v["rcv_bytes"][p],
                    xmit_packets_total=v["xmit_packets"][p],
                    rcv_packets_total=v["rcv_packets"][p],
                    xmit_wait_total=v["xmit_wait"][p],
                    symbol_error_total=0,
                    link_downed_total=0,
                    link_error_recovery_total=0,
                    rcv_errors_total=0,
                    local_link_integrity_errors_total=0,
                    np_cnp_sent_total=v["np_cnp_sent"][p],
                    np_ecn_marked_roce_packets_total=v["np_ecn_marked"][p],
                    rp_cnp_handled_total=v["rp_cnp_handled"][p],
                )
                for i, p in enumerate(range(h * NICS, (h + 1) * NICS))
            ]
            yield PortMessage(
                host=host, ts=round(ts + 1e-5 * h, 6), job_id=self.job_id, ports=ports
            )


def events_in(m: Message) -> int:
    for name in ("steps", "gpus", "ports"):
        items = getattr(m, name, None)
        if items is not None:
            return len(items)
    return 1


def run_one(ranks: int, seconds: int) -> dict[str, float]:
    """One job size in this process: the figures as a dict."""
    from stepwatch.streams.core import Engine

    synth = Synth(ranks)
    first = synth.second(0)
    gc.collect()
    base_rss = rss_bytes()
    engine = Engine()
    gc.collect()
    gc.freeze()  # as the worker's tune_gc: what lives from start-up on is out of the GC's sight
    gc.set_threshold(GC_GEN0, *gc.get_threshold()[1:])
    for m in synth.start():
        engine.process(m)
    decode_cpu = engine_cpu = 0.0
    events = 0
    lat: list[float] = []
    detections = 0
    batch: list[Message] | None = first
    for k in range(seconds):
        wire = [encode(m) for m in (batch if batch is not None else synth.second(k))]
        batch = None
        t = time.process_time()
        for b in wire:
            decode_unchecked(b)
        decoded = time.process_time() - t
        t = time.process_time()
        now = 0.0
        for b in wire:  # as the replay: decode a message, feed it
            m = decode_unchecked(b)
            events += events_in(m)
            now = max(now, m.ts)
            detections += len(engine.process(m))
        detections += len(engine.tick(now))
        dt = time.process_time() - t - decoded
        decode_cpu += decoded
        engine_cpu += dt
        lat.append(dt)
        del wire
    gc.collect()
    steady = rss_bytes()
    warm = lat[len(lat) // 4 :]  # without the first quarter (rings filling, first allocations)
    return {
        "ranks": ranks,
        "seconds": seconds,
        "events": events,
        "detections": detections,
        "peak_mib": peak_rss_bytes() / 2**20,
        "steady_mib": steady / 2**20,
        "engine_mib": (steady - base_rss) / 2**20,
        "bytes_per_rank": (steady - base_rss) / ranks,
        "cpu_per_s": engine_cpu / seconds,
        "steady_cpu_per_s": float(np.mean(warm)),
        "decode_per_s": decode_cpu / seconds,
        "p50_ms": 1e3 * float(np.percentile(warm, 50)),
        "p99_ms": 1e3 * float(np.percentile(warm, 99)),
        "max_ms": 1e3 * max(warm),
    }


HEADER = (
    f"{'ranks':>6} {'peak MiB':>9} {'steady MiB':>10} {'engine MiB':>10} "
    f"{'B/rank':>7} {'CPU s/s':>8} {'x real':>7} {'steady':>7} {'p50 ms':>7} {'p99 ms':>7} "
    f"{'max ms':>7} {'events/s':>10} {'vs decode':>9}"
)


def line(r: dict[str, float]) -> str:
    return (
        f"{r['ranks']:>6} {r['peak_mib']:>9.0f} {r['steady_mib']:>10.0f} "
        f"{r['engine_mib']:>10.0f} {r['bytes_per_rank']:>7.0f} {r['cpu_per_s']:>8.3f} "
        f"{1 / r['cpu_per_s']:>6.1f}x {1 / r['steady_cpu_per_s']:>6.1f}x "
        f"{r['p50_ms']:>7.1f} {r['p99_ms']:>7.1f} "
        f"{r['max_ms']:>7.1f} {r['events'] / r['seconds'] / r['cpu_per_s']:>10,.0f} "
        f"{r['cpu_per_s'] / r['decode_per_s']:>8.2f}x"
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, nargs="+", default=[2048, 8192, 16384])
    p.add_argument(
        "--seconds",
        type=int,
        default=180,
        help="event seconds per size (default 180: past the 128-step history)",
    )
    p.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        print(json.dumps(run_one(args.ranks[0], args.seconds)))
        return 0
    print(
        f"{args.seconds} s of event time, 1 s steps, {GPUS} GPUs and {NICS} NIC ports per "
        "host sampled at 1 Hz; CPU of one core; step time 1000 ms"
    )
    print(HEADER)
    for ranks in args.ranks:
        proc = subprocess.run(
            [
                sys.executable,
                __file__,
                "--one",
                "--ranks",
                str(ranks),
                "--seconds",
                str(args.seconds),
            ],
            check=True,
            capture_output=True,
            text=True,
        )
        print(line(json.loads(proc.stdout.strip().splitlines()[-1])), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

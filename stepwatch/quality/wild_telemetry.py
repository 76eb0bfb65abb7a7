"""GPU and RDMA port samples of the "wild" family (see :mod:`stepwatch.quality.wild`).

Healthy GPUs boost between 1,850 and 1,980 MHz, sit near (and sometimes at)
their power cap, at 50-72 degC. Ports carry a per-port background of
``xmit_wait`` and CNP/ECN rates (log-normal per port, noisy per sample); a
congestion burst raises random hosts' rates for its steps. Faults: a throttled
GPU (HwThermal, clock down, hot), and a congested NIC port (``xmit_wait`` and
CNP/ECN rates up 20-200x) on the fault's host.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from stepwatch.contract import GpuReading, PortReading

if TYPE_CHECKING:
    from stepwatch.quality.wild import Job

NICS = 8
MAX_CLOCK = 1980.0
POWER_LIMIT = 700.0


class Telemetry:
    def __init__(self, job: Job, rng: np.random.Generator) -> None:
        self.job = job
        self.rng = rng
        n = job.nodes
        self.temp = rng.uniform(50, 68, (n, 8))
        self.wait_rate = np.exp(rng.normal(np.log(8e3), 0.6, (n, NICS)))
        self.cnp_rate = np.exp(rng.normal(np.log(3.0), 0.8, (n, NICS)))
        self.wait_total = rng.integers(0, 2**40, (n, NICS)).astype(np.float64)
        self.cnp_total = rng.integers(0, 2**30, (n, NICS)).astype(np.float64)
        self.ecn_total = rng.integers(0, 2**30, (n, NICS)).astype(np.float64)
        self.xmit_bytes = np.zeros((n, NICS))
        self.burst_hosts: set[int] = set()
        self.jam = float(rng.uniform(20, 200))  # congestion factor of a faulty port

    def _active(self, s: int) -> bool:
        f = self.job.fault
        return f is not None and s >= f.start

    def gpus(self, h: int, s: int) -> list[GpuReading]:
        from stepwatch.quality.wild import Kind

        rng, f = self.rng, self.job.fault
        out = []
        for g in range(8):
            clock = float(rng.uniform(1850, MAX_CLOCK))
            temp = float(self.temp[h, g] + rng.normal(0, 1.5))
            power = float(min(POWER_LIMIT, rng.uniform(560, 720)))
            reasons = 0x4 if power >= POWER_LIMIT * 0.995 else 0
            rank = h * 8 + g
            if self._active(s) and f is not None and f.kind is Kind.GPU_THROTTLE and f.rank == rank:
                clock, temp, reasons = clock * (1 - 1.5 * f.severity), 89.0 + rng.normal(0, 1), 0x40
            out.append(
                GpuReading(
                    index=g,
                    name="NVIDIA H100 80GB HBM3",
                    util_gpu_pct=float(rng.uniform(94, 100)),
                    temp_gpu_c=max(temp, 0.0),
                    power_w=power,
                    power_limit_w=POWER_LIMIT,
                    sm_clock_mhz=clock,
                    sm_clock_max_mhz=MAX_CLOCK,
                    throttle_reasons=reasons,
                    ecc_dbe_total=0,
                    remapped_rows_uncorrectable=0,
                )
            )
        return out

    def ports(self, h: int, s: int, wall: float, burst: bool) -> list[PortReading]:
        from stepwatch.quality.wild import Kind

        rng, f = self.rng, self.job.fault
        if h == 0:
            self.burst_hosts = (
                {int(x) for x in rng.integers(0, self.job.nodes, 2)} if burst else set()
            )
        out = []
        for p in range(NICS):
            factor = float(rng.lognormal(0, 0.3))
            if h in self.burst_hosts:
                factor *= float(rng.uniform(2, 5))
            if (
                self._active(s)
                and f is not None
                and f.host == h
                and f.port == p
                and f.kind in (Kind.NIC_CONGESTION, Kind.PP_LINK)
            ):
                factor *= self.jam * float(rng.uniform(0.7, 1.3))
            self.wait_total[h, p] += self.wait_rate[h, p] * factor * wall
            self.cnp_total[h, p] += self.cnp_rate[h, p] * factor * wall
            self.ecn_total[h, p] += self.cnp_rate[h, p] * 1.5 * factor * wall
            self.xmit_bytes[h, p] += 2e10 * wall
            out.append(
                PortReading(
                    device=f"mlx5_{p}",
                    port=1,
                    link_layer="InfiniBand",
                    state="ACTIVE",
                    phys_state="LinkUp",
                    rate_gbps=400.0,
                    xmit_bytes_total=int(self.xmit_bytes[h, p]),
                    xmit_wait_total=int(self.wait_total[h, p]),
                    np_cnp_sent_total=int(self.cnp_total[h, p]),
                    np_ecn_marked_roce_packets_total=int(self.ecn_total[h, p]),
                    symbol_error_total=0,
                    link_downed_total=0,
                )
            )
        return out

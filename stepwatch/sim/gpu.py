"""GPU samples: one GpuMessage per host per tick, eight H100 readings each.

Values follow what NVML/DCGM report on a busy HGX H100: SM clock at 1980 MHz
(345 MHz and the Idle bit when idle), 400-700 W under load with a 700 W limit
(healthy GPUs brush the cap now and then: a transient SwPowerCap bit), 40-80 °C
with a thermal lag, utilisation near 100 % while kernels run (NCCL kernels
included), cumulative energy, ECC and NVLink counters. Faults change the
readings of their GPUs while they are active (see docs/simulator.md).
"""

from __future__ import annotations

import numpy as np

from stepwatch.contract import GpuMessage, GpuReading
from stepwatch.sim import hardware as hw
from stepwatch.sim.activity import Activity
from stepwatch.sim.rows import build_rows
from stepwatch.sim.scenario import FaultKind, Scenario, Target

FB_RESERVED_MIB = 536.0


class GpuModel:
    """Per-GPU state (index = rank) carried from tick to tick."""

    def __init__(self, sc: Scenario, rng: np.random.Generator) -> None:
        self.sc, self.rng = sc, rng
        n = sc.world_size
        gpn = sc.gpus_per_node
        self.hosts = sc.host_names
        self.uuid = [hw.gpu_uuid(sc.host_of(r), r % gpn) for r in range(n)]
        self.bus = [hw.pci_bus_id(r % gpn) for r in range(n)]
        self.busy_power = rng.normal(610.0, 18.0, n)
        self.temp_offset = rng.normal(0.0, 2.5, n)
        self.temp = hw.TEMP_AMBIENT_C + 4.0 + self.temp_offset
        stage = np.arange(n) // (n // sc.pipeline_stages)
        self.fb_job = 64000.0 + 2500.0 * (stage == 0) + 4000.0 * (stage == sc.pipeline_stages - 1)
        self.fb_job = self.fb_job + rng.normal(0.0, 300.0, n)
        self.energy = rng.integers(10**9, 10**11, n).astype(np.float64)  # mJ since driver load
        self.sbe = rng.poisson(0.3, n)
        self.dbe = np.zeros(n, dtype=np.int64)
        self.remap_corr = rng.poisson(0.2, n)
        self.remap_unc = np.zeros(n, dtype=np.int64)
        self.pending = np.zeros(n, dtype=bool)
        self.pcie_replay = rng.poisson(0.5, n)
        self.nvlink = rng.integers(10**12, 10**14, n).astype(np.float64)
        self.xid_last = np.zeros(n, dtype=np.int64)
        self._dbe_done: set[int] = set()

    def sample(self, ts: np.ndarray, act: Activity, active: list[Target]) -> list[GpuMessage]:
        """Readings at per-rank time ``ts`` after the window ``act``."""
        n, rng = self.sc.world_size, self.rng
        dt = act.dt
        f_compute = np.clip((act.compute + 0.8 * act.evaluation) / dt, 0.0, 1.0)
        f_comm = np.clip(act.comm / dt, 0.0, 1.0 - f_compute)
        f_ckpt = np.clip(act.checkpoint / dt, 0.0, 1.0 - f_compute - f_comm)
        util = np.clip(100.0 * (f_compute + f_comm) + 15.0 * f_ckpt, 0.0, 100.0)
        util = np.where(util > 90.0, np.minimum(100.0, util + rng.normal(0, 0.6, n)), util)
        clock_ratio = np.ones(n)
        limit = np.full(n, hw.POWER_LIMIT_W)
        temp_target = hw.TEMP_AMBIENT_C + 3.0 + self.temp_offset
        throttle = np.zeros(n, dtype=np.int64)
        self._faults(active, clock_ratio, limit, temp_target, throttle, act)
        busy = self.busy_power * clock_ratio**1.5
        power = (
            hw.POWER_IDLE_W
            + (busy - hw.POWER_IDLE_W) * f_compute
            + (hw.POWER_SPIN_W - hw.POWER_IDLE_W) * f_comm
            + (hw.POWER_CKPT_W - hw.POWER_IDLE_W) * f_ckpt
            + rng.normal(0.0, 6.0, n) * (f_compute > 0.5)
            + rng.normal(0.0, 3.0, n) * (f_comm > 0.5)
        )
        spike = (rng.random(n) < 0.01) & (f_compute > 0.8)
        power = power + rng.uniform(100.0, 200.0, n) * spike  # a momentary surge
        power = np.where(
            limit < hw.POWER_LIMIT_W, np.maximum(power, limit * (f_compute > 0.5)), power
        )
        capped = power >= 0.985 * limit
        power = np.where(capped, limit - rng.random(n) * 0.01 * limit, np.maximum(power, 55.0))
        throttle |= np.where(capped & (util > 5), hw.SW_POWER_CAP, 0)
        clock = np.where(
            capped & (clock_ratio == 1.0), 1965.0 - 15.0 * rng.integers(0, 4, n), 1980.0
        )
        clock = np.minimum(clock, np.round(hw.SM_CLOCK_MAX_MHZ * clock_ratio / 15.0) * 15.0)
        idle = util < 5.0
        clock = np.where(idle, hw.SM_CLOCK_IDLE_MHZ, clock)
        throttle = np.where(idle, hw.IDLE, throttle)
        temp_target = temp_target + 0.055 * power
        self._thermal(active, temp_target)
        tau = np.where(temp_target > hw.TEMP_THROTTLE_C, 8.0, 25.0)
        self.temp += (temp_target - self.temp) * (1.0 - np.exp(-dt / tau))
        self.energy += power * dt * 1000.0
        self.nvlink += hw.NVLINK_BYTES_PER_STEP * act.traffic
        self.sbe += rng.random(n) < 2e-4
        fb = np.where(act.loaded, self.fb_job + rng.normal(0.0, 20.0, n), 1.0)
        values = {
            "util": util,
            "mem_util": 42.0 * f_compute + 8.0 * f_comm,
            "fb": fb,
            "power": power,
            "limit": limit,
            "clock": clock,
            "throttle": throttle,
            "gr": np.clip(0.93 * f_compute + 0.97 * f_comm, 0, 1),
            "tensor": 0.52 * f_compute,
            "dram": 0.38 * f_compute + 0.12 * f_comm,
        }
        return self._messages(ts, act, values)

    def _faults(
        self,
        active: list[Target],
        clock_ratio: np.ndarray,
        limit: np.ndarray,
        temp_target: np.ndarray,
        throttle: np.ndarray,
        act: Activity,
    ) -> None:
        for target in active:
            kind, sev = target.fault.kind, target.fault.severity
            idx = list(target.ranks)
            if kind is FaultKind.SLOW_GPU:
                clock_ratio[idx] = 1.0 / (1.0 + sev)
            elif kind is FaultKind.THERMAL_THROTTLE:
                clock_ratio[idx] = 1.0 / (1.0 + sev)
                throttle[idx] |= hw.HW_THERMAL | hw.SW_THERMAL
            elif kind is FaultKind.POWER_THROTTLE:
                clock_ratio[idx] = 1.0 / (1.0 + sev)
                limit[idx] = round(hw.POWER_LIMIT_W / (1.0 + sev) ** 2.5)
                throttle[idx] |= hw.SW_POWER_CAP
            elif kind is FaultKind.XID48 and target.index not in self._dbe_done:
                self._dbe_done.add(target.index)
                self.dbe[idx] += 1
                self.remap_unc[idx] += 1
                self.pending[idx] = True
                self.xid_last[idx] = 48
            elif kind is FaultKind.XID79:
                self.xid_last[idx] = 79

    def _thermal(self, active: list[Target], temp_target: np.ndarray) -> None:
        for target in active:
            if target.fault.kind is FaultKind.THERMAL_THROTTLE:
                idx = list(target.ranks)
                temp_target[idx] = hw.TEMP_THROTTLE_C + 2.5 + 0.3 * self.temp_offset[idx]

    def _messages(
        self, ts: np.ndarray, act: Activity, v: dict[str, np.ndarray]
    ) -> list[GpuMessage]:
        sc, n = self.sc, self.sc.world_size
        gpn = sc.gpus_per_node
        fb = np.round(v["fb"], 1)
        nvlink = self.nvlink.astype(np.int64).tolist()
        columns = {
            "index": (np.arange(n) % gpn).tolist(),
            "uuid": self.uuid,
            "name": hw.GPU_NAME,
            "pci_bus_id": self.bus,
            "util_gpu_pct": np.round(v["util"], 1).tolist(),
            "util_mem_pct": np.round(v["mem_util"], 1).tolist(),
            "fb_used_mib": fb.tolist(),
            "fb_free_mib": np.round(hw.FB_TOTAL_MIB - FB_RESERVED_MIB - fb, 1).tolist(),
            "temp_gpu_c": np.round(self.temp, 0).tolist(),
            "temp_mem_c": np.round(self.temp + 6.0 + 0.004 * v["power"], 0).tolist(),
            "power_w": np.round(v["power"], 1).tolist(),
            "power_limit_w": v["limit"].tolist(),
            "energy_mj_total": self.energy.astype(np.int64).tolist(),
            "sm_clock_mhz": v["clock"].tolist(),
            "sm_clock_max_mhz": hw.SM_CLOCK_MAX_MHZ,
            "mem_clock_mhz": hw.MEM_CLOCK_MHZ,
            "throttle_reasons": v["throttle"].tolist(),
            "ecc_sbe_total": self.sbe.tolist(),
            "ecc_dbe_total": self.dbe.tolist(),
            "remapped_rows_correctable": self.remap_corr.tolist(),
            "remapped_rows_uncorrectable": self.remap_unc.tolist(),
            "remapped_rows_pending": self.pending.tolist(),
            "pcie_replay_total": self.pcie_replay.tolist(),
            "nvlink_tx_bytes_total": nvlink,
            "nvlink_rx_bytes_total": nvlink,
            "gr_engine_active": np.round(v["gr"], 3).tolist(),
            "tensor_active": np.round(v["tensor"], 3).tolist(),
            "dram_active": np.round(v["dram"], 3).tolist(),
            "xid_last": self.xid_last.tolist(),
        }
        readings = build_rows(GpuReading, columns, n)
        present = act.present.tolist()
        stamps = np.round(ts[::gpn], 6).tolist()
        out: list[GpuMessage] = []
        for h, host in enumerate(self.hosts):
            lo, hi = h * gpn, (h + 1) * gpn
            gpus = (
                readings[lo:hi]
                if all(present[lo:hi])
                else [g for g, ok in zip(readings[lo:hi], present[lo:hi], strict=True) if ok]
            )
            out.append(GpuMessage(host=host, ts=stamps[h], job_id=sc.job_id, gpus=gpus))
        return out

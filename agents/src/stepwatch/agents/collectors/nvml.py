"""GPU collector over NVML: one GpuMessage per tick, plus XID events.

Reads every GPU through an injectable :class:`~stepwatch.agents.collectors.nvml_api.NvmlApi`
and converts NVML's units into the contract's (mW -> W, bytes -> MiB,
KiB -> bytes). A reading NVML does not support on a GPU (``NotSupported``) is
None and is not asked for again; any other failed call is None for that field,
counted, logged once, and makes the tick DEGRADED. When NVML itself is missing
(no library, no driver) the collector is DOWN, logs that once, returns nothing
and retries every ``retry_ticks`` polls. ECC totals are NVML's *volatile*
counters (since the last driver load), like dcgm-exporter's ``*_VOL_TOTAL``.

XID events come from an NVML event set registered for
``nvmlEventTypeXidCriticalError``, polled without blocking once per tick.

The job of each GPU is the one the agent learned from step events
(``HostContext.job_of_gpu``); for a GPU it has not seen in a step, the hpc-job
mapping directory the Slurm prolog writes (:mod:`~stepwatch.agents.collectors.jobmap`),
when one is given.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from typing import Any

from stepwatch.agents.collectors.base import HostContext
from stepwatch.agents.collectors.common import HealthTracker, TrackedCollector, job_for
from stepwatch.agents.collectors.jobmap import JobMap
from stepwatch.agents.collectors.nvml_api import (
    STATIC_FIELDS,
    UNAVAILABLE,
    UNSUPPORTED,
    Field,
    NvmlApi,
    NvmlError,
)
from stepwatch.contract import EventMessage, EventType, GpuMessage, GpuReading, Message

log = logging.getLogger(__name__)

MIB = 1024 * 1024
XID_EVENT_TYPE = 8  # nvmlEventTypeXidCriticalError
DYNAMIC_FIELDS = tuple(f for f in Field if f not in STATIC_FIELDS)


@dataclass
class _Gpu:
    index: int
    handle: Any
    uuid: str = ""
    name: str = ""
    pci_bus_id: str = ""
    unsupported: set[Field] = field(default_factory=set)
    xid_last: int | None = None


class NvmlCollector(TrackedCollector):
    """The ``nvml`` collector (also ``nvml-replay`` over a recording)."""

    def __init__(
        self,
        api: NvmlApi,
        *,
        name: str = "nvml",
        retry_ticks: int = 60,
        max_events_per_tick: int = 64,
        job_map: JobMap | None = None,
    ) -> None:
        self.name = name
        self._api = api
        self._retry_ticks = max(1, retry_ticks)
        self._max_events = max_events_per_tick
        self._health = HealthTracker(log)
        self._gpus: list[_Gpu] = []
        self._event_set: Any = None
        self._started = False
        self._ticks_down = 0
        self._job_map = job_map

    # ------------------------------------------------------------ Collector
    def collect(self, ctx: HostContext) -> list[Message]:
        self._health.begin_tick()
        try:
            if not self._started and not self._start():
                return []
            ctx = self._with_mapped_jobs(ctx)
            events = self._poll_events(ctx)  # first, so xid_last is current in the readings
            readings = [self._read(gpu) for gpu in self._gpus]
            indices = [r.index for r in readings]
            message = GpuMessage(
                host=ctx.host, ts=ctx.now, job_id=job_for(ctx, indices), gpus=readings
            )
            return [message, *events]
        except Exception as err:  # the loop edge: never raise into the agent
            self._health.error("collect", "unexpected", "nvml collect failed: %r", err)
            return []

    def _with_mapped_jobs(self, ctx: HostContext) -> HostContext:
        """The context with the mapping directory's jobs for GPUs no step event claimed."""
        if self._job_map is None:
            return ctx
        mapped = self._job_map.read()
        if not mapped:
            return ctx
        return replace(ctx, job_of_gpu={**mapped, **ctx.job_of_gpu})

    def close(self) -> None:
        if not self._started:
            return
        self._started = False
        try:
            if self._event_set is not None:
                self._api.free_event_set(self._event_set)
            self._api.shutdown()
        except NvmlError as err:
            log.debug("nvml shutdown failed reason=%s", err.reason)
        self._event_set = None

    # ------------------------------------------------------------ start-up
    def _start(self) -> bool:
        """Initialise NVML and learn the GPUs; False (and DOWN) when unavailable."""
        if self._ticks_down % self._retry_ticks:
            self._ticks_down += 1
            self._health.still_down()
            return False
        self._ticks_down += 1
        try:
            self._api.init()
            self._gpus = [self._discover(i) for i in range(self._api.device_count())]
        except NvmlError as err:
            reason = err.reason if err.reason in UNAVAILABLE else "init_failed"
            self._health.down(
                "init", reason, "NVML unavailable, GPU metrics off reason=%s error=%s", reason, err
            )
            return False
        self._started = True
        self._ticks_down = 0
        self._event_set = self._open_event_set()
        log.info("nvml collector started gpus=%s name=%s", len(self._gpus), self.name)
        return True

    def _discover(self, index: int) -> _Gpu:
        gpu = _Gpu(index=index, handle=self._api.handle(index))
        for f in STATIC_FIELDS:
            value = self._get(gpu, f)
            if value is not None:
                setattr(gpu, f.value, str(value))
        return gpu

    def _open_event_set(self) -> Any:
        try:
            return self._api.xid_event_set([gpu.handle for gpu in self._gpus])
        except NvmlError as err:
            self._health.note(
                "xid_events", "XID events unavailable reason=%s", err.reason, level=logging.WARNING
            )
            return None

    # ------------------------------------------------------------ readings
    def _get(self, gpu: _Gpu, f: Field) -> Any:
        """One NVML reading, or None (unsupported: remembered; failed: counted)."""
        if f in gpu.unsupported:
            return None
        try:
            return self._api.read(gpu.handle, f)
        except NvmlError as err:
            if err.reason in UNSUPPORTED:
                gpu.unsupported.add(f)
                self._health.note(f"unsupported|{f}", "NVML reading not supported field=%s", f)
            else:
                self._health.error(
                    f"gpu{gpu.index}:{f}",
                    err.reason,
                    "NVML reading failed gpu=%s field=%s reason=%s",
                    gpu.index,
                    f,
                    err.reason,
                )
            return None

    def _read(self, gpu: _Gpu) -> GpuReading:
        v = {f: self._get(gpu, f) for f in DYNAMIC_FIELDS}
        util = _pair(v[Field.UTILIZATION])
        mem = _pair(v[Field.MEMORY])
        rows = v[Field.REMAPPED_ROWS] if isinstance(v[Field.REMAPPED_ROWS], list) else None
        nvlink = _pair(v[Field.NVLINK])
        return GpuReading(
            index=gpu.index,
            uuid=gpu.uuid,
            name=gpu.name,
            pci_bus_id=gpu.pci_bus_id,
            util_gpu_pct=_num(util[0]),
            util_mem_pct=_num(util[1]),
            fb_used_mib=_scaled(mem[0], 1 / MIB),
            fb_free_mib=_scaled(mem[1], 1 / MIB),
            temp_gpu_c=_num(v[Field.TEMP_GPU]),
            temp_mem_c=_num(v[Field.TEMP_MEM]),
            power_w=_scaled(v[Field.POWER], 1e-3),
            power_limit_w=_scaled(v[Field.POWER_LIMIT], 1e-3),
            energy_mj_total=_int(v[Field.ENERGY]),
            sm_clock_mhz=_num(v[Field.SM_CLOCK]),
            sm_clock_max_mhz=_num(v[Field.SM_CLOCK_MAX]),
            mem_clock_mhz=_num(v[Field.MEM_CLOCK]),
            throttle_reasons=_int(v[Field.CLOCK_REASONS]),
            ecc_sbe_total=_int(v[Field.ECC_CORRECTED]),
            ecc_dbe_total=_int(v[Field.ECC_UNCORRECTED]),
            remapped_rows_correctable=_int(rows[0]) if rows else None,
            remapped_rows_uncorrectable=_int(rows[1]) if rows else None,
            remapped_rows_pending=bool(rows[2]) if rows else None,
            remapped_rows_failure=bool(rows[3]) if rows and len(rows) > 3 else None,
            pcie_replay_total=_int(v[Field.PCIE_REPLAY]),
            nvlink_tx_bytes_total=_kib(nvlink[0]),
            nvlink_rx_bytes_total=_kib(nvlink[1]),
            xid_last=gpu.xid_last,
        )

    # ------------------------------------------------------------ XID events
    def _poll_events(self, ctx: HostContext) -> list[Message]:
        if self._event_set is None:
            return []
        out: list[Message] = []
        by_index = {gpu.index: gpu for gpu in self._gpus}
        for _ in range(self._max_events):
            try:
                event = self._api.wait_event(self._event_set, 0)
            except NvmlError as err:
                self._health.error(
                    "events", err.reason, "NVML event wait failed reason=%s", err.reason
                )
                break
            if event is None:
                break
            if event.event_type != XID_EVENT_TYPE:
                continue
            gpu = by_index.get(event.gpu)
            if gpu is not None:
                gpu.xid_last = event.data
            out.append(
                EventMessage(
                    host=ctx.host,
                    ts=ctx.now,
                    type=EventType.XID,
                    job_id=ctx.job_of_gpu.get(event.gpu),
                    gpu=event.gpu if event.gpu >= 0 else None,
                    code=event.data,
                    detail=f"XID {event.data}",
                    attrs={"source": "nvml", "uuid": gpu.uuid if gpu else ""},
                )
            )
            log.warning("XID event gpu=%s xid=%s", event.gpu, event.data)
        return out


def _pair(value: Any) -> list[Any]:
    """A list reading (utilisation, memory, NVLink), or Nones when missing."""
    return list(value) if isinstance(value, list | tuple) and len(value) >= 2 else [None, None]


def _num(value: Any) -> float | None:
    return None if value is None else float(value)


def _int(value: Any) -> int | None:
    return None if value is None else int(value)


def _kib(value: Any) -> int | None:
    """KiB -> bytes in integer arithmetic (floats lose precision past 2**53)."""
    return None if value is None else int(value) * 1024


def _scaled(value: Any, factor: float) -> float | None:
    return None if value is None else float(value) * factor

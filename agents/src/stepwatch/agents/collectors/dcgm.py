"""GPU collector scraping an existing dcgm-exporter (Prometheus text, usually :9400).

One HTTP GET per tick with a short timeout; the page is parsed with
:mod:`stepwatch.agents.collectors.promtext` and folded into one GpuMessage (one
GpuReading per ``gpu`` label). Host labels come in both spellings
(``Hostname``, and ``hostname`` in newer exporters); attribution labels
(``pod``, ``namespace``, ``container``, ``hpc_job``) are kept per GPU in
:meth:`DcgmCollector.attribution`, and a single ``hpc_job`` shared by every GPU
becomes the message's ``job_id`` when the agent does not know the job.

``DCGM_FI_DEV_XID_ERRORS`` is a gauge holding the *last* XID and never resets:
the first value seen is a baseline, and an XID EventMessage is emitted only
when the value changes to a non-zero value (so a repeat of the same XID is
invisible through this gauge; the NVML collector sees every one).
``DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL`` (tx+rx together) has no contract field
and is not mapped. MIG instance samples (``GPU_I_ID`` label) are skipped.
"""

from __future__ import annotations

import http.client
import logging
import math
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

from stepwatch.agents.collectors.base import HostContext
from stepwatch.agents.collectors.common import HealthTracker, TrackedCollector, job_for
from stepwatch.agents.collectors.promtext import Parser, Sample
from stepwatch.contract import EventMessage, EventType, GpuMessage, GpuReading, Message

log = logging.getLogger(__name__)

MAX_BYTES = 16 * 1024 * 1024
ATTRIBUTION_LABELS = ("pod", "namespace", "container", "hpc_job")
HOST_LABELS = ("Hostname", "hostname")
XID_FAMILY = "DCGM_FI_DEV_XID_ERRORS"

# family -> (GpuReading field, conversion)
FAMILIES: dict[str, tuple[str, Callable[[float], Any]]] = {
    "DCGM_FI_DEV_SM_CLOCK": ("sm_clock_mhz", float),
    "DCGM_FI_DEV_MAX_SM_CLOCK": ("sm_clock_max_mhz", float),
    "DCGM_FI_DEV_MEM_CLOCK": ("mem_clock_mhz", float),
    "DCGM_FI_DEV_GPU_TEMP": ("temp_gpu_c", float),
    "DCGM_FI_DEV_MEMORY_TEMP": ("temp_mem_c", float),
    "DCGM_FI_DEV_POWER_USAGE": ("power_w", float),
    "DCGM_FI_DEV_ENFORCED_POWER_LIMIT": ("power_limit_w", float),
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": ("energy_mj_total", int),
    "DCGM_FI_DEV_GPU_UTIL": ("util_gpu_pct", float),
    "DCGM_FI_DEV_MEM_COPY_UTIL": ("util_mem_pct", float),
    "DCGM_FI_DEV_FB_FREE": ("fb_free_mib", float),
    "DCGM_FI_DEV_FB_USED": ("fb_used_mib", float),
    XID_FAMILY: ("xid_last", int),
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": ("pcie_replay_total", int),
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": ("ecc_sbe_total", int),
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": ("ecc_dbe_total", int),
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": ("remapped_rows_correctable", int),
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": ("remapped_rows_uncorrectable", int),
    "DCGM_FI_DEV_ROW_REMAP_PENDING": ("remapped_rows_pending", bool),
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": ("remapped_rows_failure", bool),
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": ("throttle_reasons", int),
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": ("throttle_reasons", int),
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": ("gr_engine_active", float),
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": ("tensor_active", float),
    "DCGM_FI_PROF_DRAM_ACTIVE": ("dram_active", float),
}

# DCGM's "blank" sentinels (no data): int32, int64 and fp64 ranges (dcgm_structs.h).
_BLANKS = (
    (0x7FFFFFF0, 0x7FFFFFFF),
    (0x7FFFFFFFFFFFFFF0, 0x7FFFFFFFFFFFFFFF),
    (2.0**47, 2.0**47 + 16),
)


def fetch(url: str, timeout: float) -> str:
    """GET ``url`` (no proxies) and return the body as text; raise OSError on failure."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=timeout) as response:
        body: bytes = response.read(MAX_BYTES)
    return body.decode("utf-8", errors="replace")


class DcgmCollector(TrackedCollector):
    """The ``dcgm`` collector."""

    name = "dcgm"

    def __init__(
        self, url: str, *, timeout: float = 1.0, fetcher: Callable[[str, float], str] = fetch
    ) -> None:
        self.url = url
        self._timeout = timeout
        self._fetch = fetcher
        self._parser = Parser()
        self._health = HealthTracker(log)
        self._xid_seen: dict[str, int] = {}
        self._attribution: dict[int, dict[str, str]] = {}

    # ------------------------------------------------------------ Collector
    def collect(self, ctx: HostContext) -> list[Message]:
        self._health.begin_tick()
        try:
            text = self._get()
            if text is None:
                return []
            return self._fold(ctx, text)
        except Exception as err:  # the loop edge: never raise into the agent
            self._health.error("collect", "unexpected", "dcgm collect failed: %r", err)
            return []

    def attribution(self) -> dict[int, dict[str, str]]:
        """Per GPU index: the pod/namespace/container/hpc_job/hostname labels seen last."""
        return {gpu: dict(labels) for gpu, labels in self._attribution.items()}

    def close(self) -> None:
        return None

    # ------------------------------------------------------------ steps
    def _get(self) -> str | None:
        try:
            return self._fetch(self.url, self._timeout)
        except (OSError, urllib.error.URLError, http.client.HTTPException, ValueError) as err:
            self._health.down(
                "endpoint",
                "endpoint_down",
                "dcgm-exporter unreachable url=%s error=%s",
                self.url,
                err,
            )
            return None

    def _fold(self, ctx: HostContext, text: str) -> list[Message]:
        page = self._parser.parse(text)
        if page.bad_lines:
            self._health.error(
                "page",
                "garbled",
                "dcgm-exporter page has unparsable lines url=%s first=%r",
                self.url,
                page.first_bad,
            )
        gpus: dict[int, dict[str, Any]] = {}
        labels_of: dict[int, dict[str, str]] = {}
        for sample in page.samples:
            self._take(sample, gpus, labels_of)
        if not gpus:
            self._health.down(
                "page", "no_metrics", "no DCGM GPU metrics in the page url=%s", self.url
            )
            return []
        readings = [GpuReading(index=i, **gpus[i]) for i in sorted(gpus)]
        self._attribution = {i: _attribution(labels_of[i]) for i in sorted(gpus)}
        events = self._xid_events(ctx, readings)
        job = job_for(ctx, gpus) or self._hpc_job()
        return [GpuMessage(host=ctx.host, ts=ctx.now, job_id=job, gpus=readings), *events]

    def _take(
        self, sample: Sample, gpus: dict[int, dict[str, Any]], labels_of: dict[int, dict[str, str]]
    ) -> None:
        spec = FAMILIES.get(sample.family)
        if spec is None or sample.labels.get("GPU_I_ID"):
            return
        index = _gpu_index(sample.labels.get("gpu", ""))
        if index is None:
            self._health.error(
                f"label:{sample.family}",
                "bad_label",
                "dcgm sample without a usable gpu label %s",
                sample.family,
            )
            return
        fields = gpus.setdefault(index, _identity(sample.labels))
        labels_of.setdefault(index, sample.labels)
        value = sample.value
        if not math.isfinite(value) or value < 0:
            self._health.error(
                f"value:{sample.family}",
                "bad_value",
                "dcgm value unusable family=%s value=%r",
                sample.family,
                value,
            )
            return
        if _is_blank(value):
            return
        name, convert = spec
        fields[name] = convert(value)

    def _xid_events(self, ctx: HostContext, readings: list[GpuReading]) -> list[Message]:
        out: list[Message] = []
        for r in readings:
            if r.xid_last is None:
                continue
            key = r.uuid or str(r.index)
            previous = self._xid_seen.get(key)
            self._xid_seen[key] = r.xid_last
            if previous is None or r.xid_last == previous or r.xid_last == 0:
                continue
            log.warning(
                "XID seen on dcgm gauge gpu=%s xid=%s previous=%s", r.index, r.xid_last, previous
            )
            out.append(
                EventMessage(
                    host=ctx.host,
                    ts=ctx.now,
                    type=EventType.XID,
                    job_id=ctx.job_of_gpu.get(r.index),
                    gpu=r.index,
                    code=r.xid_last,
                    detail=f"XID {r.xid_last}",
                    attrs={"source": "dcgm", "uuid": r.uuid, "previous": previous},
                )
            )
        return out

    def _hpc_job(self) -> str | None:
        jobs = {labels.get("hpc_job", "") for labels in self._attribution.values()}
        if len(jobs) == 1:
            return jobs.pop() or None
        return None


def _gpu_index(raw: str) -> int | None:
    try:
        index = int(raw)
    except ValueError:
        return None
    return index if index >= 0 else None


def _identity(labels: dict[str, str]) -> dict[str, Any]:
    return {
        "uuid": labels.get("UUID") or labels.get("uuid", ""),
        "name": labels.get("modelName", ""),
        "pci_bus_id": labels.get("pci_bus_id", ""),
    }


def _attribution(labels: dict[str, str]) -> dict[str, str]:
    out = {k: labels[k] for k in ATTRIBUTION_LABELS if labels.get(k)}
    host = next((labels[k] for k in HOST_LABELS if labels.get(k)), "")
    if host:
        out["hostname"] = host
    if labels.get("device"):
        out["device"] = labels["device"]
    return out


def _is_blank(value: float) -> bool:
    return any(low <= value <= high for low, high in _BLANKS)

"""Host collectors the node agent polls every tick, built by name.

``build_host_collectors(settings, ["nvml", "rdma"])`` returns ready collectors:

* ``nvml``: GPUs through NVML (:mod:`stepwatch.agents.collectors.nvml`);
* ``nvml-replay``: the same collector over a recorded NVML session
  (``STEPWATCH_NVML_REPLAY`` = path of a recording; default: the shipped
  8-GPU H100 recording), for benchmarks, demos and GPU-less hosts;
* ``dcgm``: scrape an existing dcgm-exporter (``Settings.dcgm_url``);
* ``rdma``: InfiniBand/RoCE port counters from ``<Settings.sysfs_root>/class/infiniband``;
* ``steps`` is the agent's own (it owns the SDK socket) and is skipped here.

Collector modules are imported only when their name is asked for.
"""

from __future__ import annotations

from collections.abc import Callable

from stepwatch.agents.collectors.base import (
    Collector,
    CollectorHealth,
    HealthState,
    HostContext,
)
from stepwatch.errors import ConfigError
from stepwatch.settings import Settings

DEFAULT_DCGM_URL = "http://localhost:9400/metrics"
AGENT_OWNED = frozenset({"steps"})


def _nvml(settings: Settings) -> Collector:
    from stepwatch.agents.collectors.jobmap import JobMap
    from stepwatch.agents.collectors.nvml import NvmlCollector
    from stepwatch.agents.collectors.nvml_api import RealNvml

    job_map = JobMap(settings.job_map_dir) if settings.job_map_dir else None
    return NvmlCollector(RealNvml(), name="nvml", job_map=job_map)


def _nvml_replay(settings: Settings) -> Collector:
    from stepwatch.agents.collectors.jobmap import JobMap
    from stepwatch.agents.collectors.nvml import NvmlCollector
    from stepwatch.agents.collectors.nvml_replay import DEFAULT_RECORDING, ReplayNvml

    path = settings.nvml_replay or DEFAULT_RECORDING
    job_map = JobMap(settings.job_map_dir) if settings.job_map_dir else None
    return NvmlCollector(ReplayNvml.from_file(path), name="nvml-replay", job_map=job_map)


def _dcgm(settings: Settings) -> Collector:
    from stepwatch.agents.collectors.dcgm import DcgmCollector

    timeout = min(2.0, max(0.2, settings.tick_seconds / 2))
    return DcgmCollector(settings.dcgm_url or DEFAULT_DCGM_URL, timeout=timeout)


def _rdma(settings: Settings) -> Collector:
    from stepwatch.agents.collectors.rdma import RdmaCollector

    return RdmaCollector(settings.sysfs_root)


BUILDERS: dict[str, Callable[[Settings], Collector]] = {
    "nvml": _nvml,
    "nvml-replay": _nvml_replay,
    "dcgm": _dcgm,
    "rdma": _rdma,
}
NAMES = (*BUILDERS, *sorted(AGENT_OWNED))


def parse_names(spec: str) -> list[str]:
    """``"nvml, rdma,steps"`` -> ``["nvml", "rdma", "steps"]`` (order kept, no duplicates)."""
    out: list[str] = []
    for raw in spec.split(","):
        name = raw.strip().lower()
        if name and name not in out:
            out.append(name)
    return out


def build_host_collectors(settings: Settings, names: list[str]) -> list[Collector]:
    """Build the named collectors; unknown names raise ConfigError (before any is built)."""
    unknown = [n for n in names if n not in BUILDERS and n not in AGENT_OWNED]
    if unknown:
        raise ConfigError(f"unknown collector(s): {', '.join(unknown)}; known: {', '.join(NAMES)}")
    return [BUILDERS[n](settings) for n in names if n in BUILDERS]


__all__ = [
    "AGENT_OWNED",
    "NAMES",
    "Collector",
    "CollectorHealth",
    "HealthState",
    "HostContext",
    "build_host_collectors",
    "parse_names",
]

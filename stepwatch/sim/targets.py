"""Resolve each fault's target (ranks, host, GPU, NICs) against a scenario.

Unspecified targets are drawn from the scenario's seed and the fault's
position, so the same scenario always hits the same rank.
"""

from __future__ import annotations

import numpy as np

from stepwatch.errors import ConfigError
from stepwatch.sim.scenario import (
    JOB_FAULTS,
    NIC_FAULTS,
    SINGLE_RANK,
    Fault,
    FaultKind,
    Scenario,
    Target,
)

_TARGET_SALT = 0x5EED


def resolve_targets(scenario: Scenario) -> tuple[Target, ...]:
    return tuple(_resolve(scenario, i, f) for i, f in enumerate(scenario.faults))


def _rng(scenario: Scenario, index: int) -> np.random.Generator:
    return np.random.default_rng([scenario.seed & 0xFFFFFFFF, _TARGET_SALT, index])


def _resolve(scenario: Scenario, index: int, fault: Fault) -> Target:
    if fault.kind in JOB_FAULTS:
        return Target(index, fault, (), None, None)
    if fault.kind in NIC_FAULTS:
        return _resolve_nic(scenario, index, fault)
    gpn = scenario.gpus_per_node
    rng = _rng(scenario, index)
    host_index = _host_index(scenario, fault)
    if fault.rank is not None:
        rank = fault.rank
        if fault.gpu is not None and fault.gpu != rank % gpn:
            raise ConfigError(f"fault {fault.kind}: rank {rank} is not on gpu {fault.gpu}")
    elif host_index is not None and fault.gpu is not None:
        rank = host_index * gpn + fault.gpu
    elif host_index is not None:
        if fault.kind in SINGLE_RANK:
            rank = host_index * gpn + int(rng.integers(gpn))
        else:  # the whole host (a lemon node, a host's input pipeline)
            ranks = tuple(range(host_index * gpn, (host_index + 1) * gpn))
            return Target(index, fault, ranks, scenario.host_names[host_index], None)
    elif fault.kind is FaultKind.DATALOADER_STALL:
        h = int(rng.integers(scenario.nodes))
        ranks = tuple(range(h * gpn, (h + 1) * gpn))
        return Target(index, fault, ranks, scenario.host_names[h], None)
    else:
        rank = int(rng.integers(scenario.world_size))
    if host_index is not None and rank // gpn != host_index:
        raise ConfigError(f"fault {fault.kind}: rank {rank} is not on host {fault.host}")
    return Target(index, fault, (rank,), scenario.host_of(rank), rank % gpn)


def _resolve_nic(scenario: Scenario, index: int, fault: Fault) -> Target:
    gpn, npn = scenario.gpus_per_node, scenario.nics_per_node
    rng = _rng(scenario, index)
    host_index = _host_index(scenario, fault)
    gpu = fault.gpu
    if fault.rank is not None:
        if host_index is not None and fault.rank // gpn != host_index:
            raise ConfigError(f"fault {fault.kind}: rank {fault.rank} is not on host {fault.host}")
        host_index, gpu = fault.rank // gpn, fault.rank % gpn
    if host_index is None:
        host_index = int(rng.integers(scenario.nodes))
    if fault.nic is not None:
        nics: tuple[int, ...] = (fault.nic,)
    elif gpu is not None:
        nics = (scenario.nic_of_gpu(gpu),)
    elif fault.kind is FaultKind.NIC_CONGESTION and fault.host is not None:
        nics = tuple(range(npn))  # the whole host's uplinks
    else:
        nics = (int(rng.integers(npn)),)
    ranks = tuple(host_index * gpn + g for g in range(gpn) if scenario.nic_of_gpu(g) in nics)
    one_gpu = ranks[0] % gpn if len(ranks) == 1 else None
    return Target(index, fault, ranks, scenario.host_names[host_index], one_gpu, nics)


def _host_index(scenario: Scenario, fault: Fault) -> int | None:
    if fault.host is None:
        return None
    return scenario.host_names.index(fault.host)

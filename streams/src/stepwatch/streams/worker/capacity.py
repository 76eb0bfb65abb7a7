"""What the detection cores of one worker may hold: shared by its partitions' gates.

The core's memory per job grows with the world size a record claims, and per
host with the samples it keeps, so the worker bounds both: the jobs' world
sizes summed (``max_ranks``) and the hosts (``max_hosts``), over all the
partitions it owns. A gate (:mod:`stepwatch.streams.worker.admission`) takes a
place before it admits a new job or host and gives it back when it lets one go.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from stepwatch.streams.worker.admission import AdmissionConfig


class Capacity:
    """What the detection cores of one worker may hold, shared by its partitions' gates:
    ranks (the jobs' world sizes summed) and hosts. A gate takes before it admits a new
    job or host and gives back when it lets one go."""

    def __init__(self, max_ranks: int, max_hosts: int) -> None:
        self.max_ranks = max_ranks if max_ranks > 0 else None
        self.max_hosts = max_hosts if max_hosts > 0 else None
        self.ranks = 0
        self.hosts = 0

    @classmethod
    def of(cls, cfg: AdmissionConfig) -> Capacity:
        return cls(cfg.max_ranks, cfg.max_hosts)

    def room_for_ranks(self, n: int) -> bool:
        return self.max_ranks is None or self.ranks + n <= self.max_ranks

    def room_for_host(self) -> bool:
        return self.max_hosts is None or self.hosts < self.max_hosts

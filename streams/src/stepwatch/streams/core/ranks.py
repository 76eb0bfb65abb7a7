"""What the core knows about each rank of a job: host, GPU, peer group."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from stepwatch.contract import StepRecord


@dataclass(frozen=True, slots=True)
class GroupIndex:
    """Peer groups as index arrays; ``version`` changes when membership changes."""

    names: tuple[str, ...]
    members: tuple[np.ndarray, ...]  # rank indices of each group
    of_rank: np.ndarray  # group number of each rank
    version: int


class RankTable:
    """Per-rank placement, updated from step records (cheap when unchanged)."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self.host: list[str] = [""] * world_size
        self.gpu: list[int | None] = [None] * world_size
        self.group: list[str] = ["all"] * world_size
        self.last_step = np.full(world_size, -1, dtype=np.int64)
        self.last_end = np.zeros(world_size)
        self._version = 0
        self._groups: GroupIndex | None = None
        self._by_host: GroupIndex | None = None
        self._on_host: dict[str, list[int]] | None = None  # host -> its ranks, ascending
        self._hosts: set[str] = set()
        self.moved: list[tuple[int, str]] = []  # (rank, its former host) since last taken

    def observe(self, records: list[StepRecord]) -> list[str]:
        """Record where each rank ran; return hosts this table had not seen before.
        A rank that reported from another host before is noted in :attr:`moved`.

        The group index goes stale when a rank's group changes.
        """
        host, gpu, group = self.host, self.gpu, self.group
        new: list[str] = []
        for r in records:
            i = r.rank
            if host[i] != r.host:
                if host[i] and r.host:
                    self.moved.append((i, host[i]))
                host[i] = r.host
                self._by_host = self._on_host = None
                if r.host not in self._hosts:
                    self._hosts.add(r.host)
                    new.append(r.host)
            g = r.local_rank if r.gpu is None else r.gpu
            if gpu[i] != g:
                gpu[i] = g
            if group[i] != r.group:
                group[i] = r.group
                self._groups = None
        return new

    def note_progress(self, ranks: np.ndarray, step: int, ends: np.ndarray) -> None:
        self.last_step[ranks] = np.maximum(self.last_step[ranks], step)
        self.last_end[ranks] = np.fmax(self.last_end[ranks], ends)

    def groups(self) -> GroupIndex:
        if self._groups is None:
            self._groups = self._index(self.group)
        return self._groups

    def host_index(self) -> GroupIndex:
        """The ranks of each host, as a :class:`GroupIndex` (names are host names)."""
        if self._by_host is None:
            self._by_host = self._index(self.host)
        return self._by_host

    def _index(self, key_of_rank: list[str]) -> GroupIndex:
        """Ranks grouped by a per-rank key, with a fresh version number."""
        self._version += 1
        names = tuple(sorted(set(key_of_rank)))
        number = {n: i for i, n in enumerate(names)}
        of_rank = np.array([number[k] for k in key_of_rank], dtype=np.intp)
        members = tuple(np.flatnonzero(of_rank == i) for i in range(len(names)))
        return GroupIndex(names, members, of_rank, self._version)

    def hosts(self) -> set[str]:
        return set(self._hosts)

    def ranks_on(self, host: str) -> list[int]:
        """The ranks placed on ``host``, ascending (a new list: the caller's to change)."""
        if self._on_host is None:
            on_host: dict[str, list[int]] = {}
            for i, h in enumerate(self.host):
                on_host.setdefault(h, []).append(i)
            self._on_host = on_host
        return list(self._on_host.get(host, ()))

"""Step records gathered into (step x rank) arrays: for tests, demos and benchmarks."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from stepwatch.contract import Message, StepMessage, StepRecord


@dataclass(frozen=True)
class StepTable:
    """Per-step, per-rank arrays of one job; NaN where a rank did not report a step.

    ``compute`` is forward + backward + optimizer; ``duration`` is end - start.
    """

    job_id: str
    steps: np.ndarray  # step numbers, ascending (rows)
    world_size: int
    duration: np.ndarray
    compute: np.ndarray
    comm_wait: np.ndarray
    data: np.ndarray
    checkpoint: np.ndarray  # 0 where the step had no checkpoint
    start: np.ndarray
    end: np.ndarray
    groups: tuple[str, ...]  # peer group of each rank

    @classmethod
    def from_messages(cls, messages: Iterable[Message], job_id: str | None = None) -> StepTable:
        records: list[StepRecord] = [
            r
            for m in messages
            if isinstance(m, StepMessage)
            for r in m.steps
            if job_id is None or r.job_id == job_id
        ]
        if not records:
            raise ValueError("no step records")
        job = records[0].job_id if job_id is None else job_id
        world = records[0].world_size
        steps = np.array(sorted({r.step for r in records}))
        row = {s: i for i, s in enumerate(steps.tolist())}
        shape = (len(steps), world)
        cols = {k: np.full(shape, np.nan) for k in ("dur", "cmp", "cw", "data", "ckpt", "s", "e")}
        groups = ["all"] * world
        for r in records:
            i, j = row[r.step], r.rank
            ph = r.phases
            cols["s"][i, j], cols["e"][i, j] = r.start, r.end
            cols["dur"][i, j] = r.end - r.start
            groups[j] = r.group
            if ph is not None:
                cols["cmp"][i, j] = (
                    (ph.forward or 0.0) + (ph.backward or 0.0) + (ph.optimizer or 0.0)
                )
                cols["cw"][i, j] = ph.comm_wait if ph.comm_wait is not None else np.nan
                cols["data"][i, j] = ph.data if ph.data is not None else np.nan
                cols["ckpt"][i, j] = ph.checkpoint or 0.0
        return cls(
            job,
            steps,
            world,
            cols["dur"],
            cols["cmp"],
            cols["cw"],
            cols["data"],
            cols["ckpt"],
            cols["s"],
            cols["e"],
            tuple(groups),
        )

    def rows(self, first: int, last: int | None = None) -> np.ndarray:
        """Boolean row mask for steps ``first <= step < last``."""
        mask = self.steps >= first
        if last is not None:
            mask &= self.steps < last
        return mask

    def members(self, group: str) -> np.ndarray:
        return np.flatnonzero(np.array(self.groups) == group)

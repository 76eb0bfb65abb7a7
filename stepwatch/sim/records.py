"""Step records from a :class:`~stepwatch.sim.timing.StepBlock` (the hot loop)."""

from __future__ import annotations

import numpy as np

from stepwatch.contract import Phases, StepRecord
from stepwatch.sim.rows import build_rows
from stepwatch.sim.scenario import Scenario
from stepwatch.sim.timing import StepBlock


class RecordBuilder:
    """Builds the contract records of one step for the ranks that report it."""

    def __init__(self, sc: Scenario, has_loss: np.ndarray) -> None:
        self.sc = sc
        n, gpn = sc.world_size, sc.gpus_per_node
        self.host = [sc.host_of(r) for r in range(n)]
        self.local = [r % gpn for r in range(n)]
        self.group = [sc.group_of(r) for r in range(n)]
        first_stage = np.arange(n) < n // sc.pipeline_stages
        self.samples = np.where(first_stage, sc.samples_per_step, 0).tolist()
        self.tokens = np.where(first_stage, sc.tokens_per_step, 0).tolist()
        self.has_loss = has_loss
        self.flops = (
            None
            if sc.flops_per_token is None
            else sc.flops_per_token * sc.tokens_per_step / sc.pipeline_stages
        )

    def build(self, b: StepBlock) -> tuple[np.ndarray, list[StepRecord]]:
        """The ranks that reported step ``b.step`` (ascending) and their records."""
        sc = self.sc
        idx = np.flatnonzero(b.emit)
        n = len(idx)

        def col(x: np.ndarray, digits: int = 6) -> list[float]:
            values: list[float] = np.round(x[idx], digits).tolist()
            return values

        extras = self._extras(b, idx)
        ckpt = col(b.checkpoint) if b.checkpoint.any() else None
        phases = build_rows(
            Phases,
            {
                "data": col(b.data),
                "forward": col(b.forward),
                "backward": col(b.backward),
                "optimizer": col(b.optimizer),
                "comm_wait": col(b.comm_wait),
                "checkpoint": ckpt,
                "extra": extras,
            },
            n,
        )
        loss = np.round(b.loss[idx], 4)
        nonfinite = (self.has_loss[idx] & ~np.isfinite(loss)).tolist()
        losses = [
            None if (bad or not has) else value
            for value, has, bad in zip(
                loss.tolist(), self.has_loss[idx].tolist(), nonfinite, strict=True
            )
        ]
        ranks = idx.tolist()
        records = build_rows(
            StepRecord,
            {
                "job_id": sc.job_id,
                "rank": ranks,
                "world_size": sc.world_size,
                "step": b.step,
                "start": col(b.start),
                "end": col(b.end),
                "host": [self.host[r] for r in ranks],
                "local_rank": [self.local[r] for r in ranks],
                "gpu": [self.local[r] for r in ranks],
                "group": [self.group[r] for r in ranks],
                "phases": phases,
                "samples": [self.samples[r] for r in ranks],
                "tokens": [self.tokens[r] for r in ranks],
                "loss": losses,
                "loss_nonfinite": nonfinite,
                "flops": self.flops,
                "timing": "cuda",
            },
            n,
        )
        return idx, records

    @staticmethod
    def _extras(b: StepBlock, idx: np.ndarray) -> list[dict[str, float]]:
        evaluation = round(b.evaluation, 6)
        base: dict[str, float] = {"eval": evaluation} if evaluation else {}
        transfer = np.round(b.transfer[idx], 6)
        if not transfer.any():
            return [base] * len(idx)  # shared: records are frozen and never mutated
        return [{**base, "comm_transfer": t} if t else base for t in transfer.tolist()]

"""What each rank's GPU was doing during a sampling window, from the step timeline.

A step on one rank is laid out as consecutive segments:
``data | compute (fwd+bwd+opt) | collective (transfer + comm_wait) | eval | checkpoint``.
The GPU and NIC models turn the seconds spent in each segment within a window
into utilisation, power and traffic. Outside steps a rank is loading (before
the first step), hung (idle, memory held), spinning in a collective (the peers
of a crashed rank), dead (process gone) or done (memory released).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from stepwatch.sim.scenario import Scenario
from stepwatch.sim.timing import Outcome, StepBlock, Stop


@dataclass(frozen=True, slots=True)
class Activity:
    """Seconds per rank within the window (``dt`` long), and the rank's state at its end."""

    dt: np.ndarray  # window length per rank
    compute: np.ndarray
    comm: np.ndarray  # in a collective (NCCL kernels: the GPU counts as busy)
    evaluation: np.ndarray
    checkpoint: np.ndarray
    traffic: np.ndarray  # steps' worth of gradient traffic moved (fraction of a step)
    loaded: np.ndarray  # bool: the job's memory is allocated on the GPU
    present: np.ndarray  # bool: the GPU is visible (not fallen off the bus)
    dead: np.ndarray  # bool: the rank's process is gone


def _overlap(
    a: np.ndarray, b: np.ndarray, x: np.ndarray | float, y: np.ndarray | float
) -> np.ndarray:
    out: np.ndarray = np.clip(np.minimum(b, y) - np.maximum(a, x), 0.0, None)
    return out


def activity(
    sc: Scenario, blocks: Iterable[StepBlock], stop: Stop | None, a: np.ndarray, b: np.ndarray
) -> Activity:
    """Activity of every rank over its window ``(a_r, b_r]``."""
    n = sc.world_size
    compute, comm, evaluation, ckpt, traffic = (np.zeros(n) for _ in range(5))
    for blk in blocks:
        if blk.t0 >= float(b.max()) or float(blk.end.max()) <= float(a.min()):
            continue
        s1 = blk.start + blk.data
        s2 = s1 + blk.forward + blk.backward + blk.optimizer
        s3 = s2 + blk.transfer + blk.comm_wait
        s4 = s3 + blk.evaluation
        compute += _overlap(a, b, s1, s2)
        comm += _overlap(a, b, s2, s3)
        evaluation += _overlap(a, b, s3, s4)
        ckpt += _overlap(a, b, s4, blk.end)
        traffic += _overlap(a, b, s1, s3) / np.maximum(s3 - s1, 1e-9)
    loaded = b >= sc.start_ts + 0.5 * sc.init_pause
    present = np.ones(n, dtype=bool)
    dead = np.zeros(n, dtype=bool)
    if stop is not None:
        after = _overlap(a, b, stop.ts, np.inf)
        if stop.outcome is Outcome.CRASH:
            peers = np.ones(n, dtype=bool)
            peers[list(stop.victims)] = False
            comm += np.where(peers, after, 0.0)  # blocked in the next collective, spinning
            dead[list(stop.victims)] = b[list(stop.victims)] > stop.ts
            present[list(stop.gone)] = b[list(stop.gone)] <= stop.ts
        elif stop.outcome in (Outcome.COMPLETED, Outcome.USER_ERROR):
            dead |= b > stop.ts
        loaded &= ~dead
    return Activity(b - a, compute, comm, evaluation, ckpt, traffic, loaded, present, dead)

"""Hangs: no step progress for the job against its own cadence; who stopped first.

The limit is ``max(hang_min_seconds, hang_step_multiple x median step time)``
plus the longest pause the job has shown so far (a step's excess over the
median: evaluation, checkpoint saves; or a ``checkpoint_save`` event's
``duration_s``), measured in event time from the latest step end any rank
reported: a job that once paused for a minute to save a checkpoint may do so
again without being called hung. While a checkpoint the job began
(``checkpoint_begin``) has not been followed by a step, the pause allowed is the
most there is (:func:`allowed_pause`). The pause counts up to ``hang_max_pause_seconds``
(half an hour): a ``checkpoint_save``'s length is its sender's word. A crashed
rank leaves its peers blocked in the next collective: its last reported step
is behind theirs, or (when it died after reporting) its GPU went idle or left
the bus while the peers' GPUs keep spinning, or the node agent saw its process
end without a ``job_end`` (``rank_exit``, :mod:`stepwatch.streams.core.exits`).
Those ranks are *named* (``rank_missing``); when every rank stopped together it
is a plain ``hang``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from stepwatch.streams.core.config import DetectConfig
from stepwatch.streams.core.hostclock import SampleWindow
from stepwatch.streams.core.hostwindow import median_of
from stepwatch.streams.core.ranks import RankTable

IDLE_UTIL_PCT = 10.0
SPIN_UTIL_PCT = 30.0


@dataclass(frozen=True)
class HangVerdict:
    silent_s: float
    limit_s: float
    last_step: int  # the furthest step any rank reported
    behind: tuple[int, ...]  # ranks whose last step is behind the others
    idle: tuple[int, ...]  # ranks whose GPU went idle or vanished while peers spin
    how: str  # "exited", "behind", "idle_gpu" or "" (no rank stands out)
    exited: tuple[int, ...] = ()  # ranks whose process ended first, without a job_end

    @property
    def named(self) -> tuple[int, ...]:
        return self.exited or self.behind or self.idle


def checkpoint_seconds(attrs: Mapping[str, object]) -> float | None:
    """A ``checkpoint_save`` event's length: the SDK's ``duration_s`` (``sw.checkpoint``),
    else ``seconds`` (the simulator's, and older senders'); None without a number. The
    core read only ``seconds``, so a real job's checkpoint events never raised its hang
    limit: a job that saves a 70 s sharded checkpoint between steps (no step holds it)
    was called hung at every save, not only the first (the report reads both names)."""
    for key in ("duration_s", "seconds"):
        value = attrs.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
    return None


#: host clocks of a job's ranks may differ by this much (a checkpoint's begin vs steps' ends)
CLOCK_SLACK_S = 5.0


def allowed_pause(
    cfg: DetectConfig, longest: float, checkpoint_began: float, last_progress: float
) -> float:
    """The pause the hang limit allows for: the longest the job has shown, or while a
    checkpoint it began has not been followed by a step (its ``checkpoint_begin`` after
    the last progress), ``hang_max_pause_seconds``: a first save of several minutes is
    not a hang, and its end (``checkpoint_save``) says how long the next may take. Before,
    the first save longer than the limit was called hung, and JobHang requeues."""
    if checkpoint_began > 0 and checkpoint_began >= last_progress - CLOCK_SLACK_S:
        return max(longest, cfg.hang_max_pause_seconds)
    return longest


def hang_limit(cfg: DetectConfig, cadence: float | None, pause: float = 0.0) -> float:
    base = max(cfg.hang_min_seconds, cfg.hang_step_multiple * (cadence or 0.0))
    return base + min(pause, cfg.hang_max_pause_seconds)


def check_hang(
    cfg: DetectConfig,
    now: float,
    last_progress: float,
    cadence: float | None,
    pause: float,
    ranks: RankTable,
    windows: Mapping[str, SampleWindow],
    exited: tuple[int, ...] = (),
) -> HangVerdict | None:
    """A verdict when the job made no progress for longer than its limit. ``exited``: the
    ranks whose process ended first without a job_end (the node agent saw it): named
    before any rank that is only behind or idle."""
    limit = hang_limit(cfg, cadence, pause)
    silent = now - last_progress
    if last_progress <= 0 or silent <= limit:
        return None
    seen = ranks.last_step >= 0
    if not seen.any():
        return None
    last = int(ranks.last_step[seen].max())
    if 0 < len(exited) <= ranks.world_size // 2:
        return HangVerdict(silent, limit, last, (), (), "exited", exited)
    behind = np.flatnonzero(seen & (ranks.last_step < last))
    if 0 < len(behind) <= ranks.world_size // 2:
        return HangVerdict(silent, limit, last, tuple(behind.tolist()), (), "behind")
    idle = _idle_ranks(ranks, windows, last_progress, now)
    if 0 < len(idle) <= ranks.world_size // 2:
        return HangVerdict(silent, limit, last, (), tuple(idle), "idle_gpu")
    return HangVerdict(silent, limit, last, (), (), "")


def _idle_ranks(
    ranks: RankTable, windows: Mapping[str, SampleWindow], t0: float, t1: float
) -> list[int]:
    """Ranks whose GPU is idle (or reports nothing) while most of the job's GPUs spin."""
    util: dict[int, float | None] = {}
    for host in ranks.hosts():
        win = windows.get(host)
        if win is None:
            continue
        signals = win.gpu_signals(t0, t1)
        for rank in ranks.ranks_on(host):
            gpu = ranks.gpu[rank]
            s = signals.get(-1 if gpu is None else gpu)
            util[rank] = None if s is None or s.samples == 0 else s.util_pct
    known = [u for u in util.values() if u is not None]
    typical = median_of(known)
    if typical is None or typical < SPIN_UTIL_PCT:
        return []
    return sorted(r for r, u in util.items() if u is None or u < IDLE_UTIL_PCT)

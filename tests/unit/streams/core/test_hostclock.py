"""Each host's clock offset, from the starts and ends of a job's closed steps."""

from __future__ import annotations

import numpy as np
import pytest

from stepwatch.streams.core.hostclock import CLOCK_STEPS, HostClocks
from stepwatch.streams.core.ranks import GroupIndex
from stepwatch.streams.core.throughput import Throughput

pytestmark = pytest.mark.unit


def _index(hosts: int, per_host: int = 8, version: int = 1) -> GroupIndex:
    names = tuple(f"h{i}" for i in range(hosts))
    of = np.repeat(np.arange(hosts), per_host)
    return GroupIndex(names, tuple(np.flatnonzero(of == i) for i in range(hosts)), of, version)


def _feed(
    clocks: HostClocks, start_off: np.ndarray, end_off: np.ndarray, steps: int, version: int = 1
) -> None:
    """``steps`` closed 1 s steps of 4 hosts x 8 ranks, each rank's start and end moved by
    its own offsets, with 5 ms of jitter."""
    rng = np.random.default_rng(1)
    index = _index(4, version=version)
    for s in range(steps):
        t = 1.8e9 + s
        starts = t + start_off + rng.normal(0, 0.005, 32)
        clocks.update(starts, starts + 0.9 + (end_off - start_off), index)


def test_a_host_whose_clock_is_behind_gets_its_offset() -> None:
    clocks = HostClocks()
    off = np.repeat([0.0, -60.0, 0.0, 0.0], 8)
    _feed(clocks, off, off, CLOCK_STEPS)
    assert clocks.shift.keys() == {"h1"}
    assert clocks.shift["h1"] == pytest.approx(-60.0, abs=0.05)
    assert clocks.on_job_clock("h1", 100.0) == pytest.approx(160.0, abs=0.05)


def test_a_host_ahead_sets_the_clock_the_others_are_read_from() -> None:
    clocks = HostClocks()
    off = np.repeat([0.0, 0.0, 0.0, 30.0], 8)
    _feed(clocks, off, off, CLOCK_STEPS)
    assert set(clocks.shift) == {"h0", "h1", "h2"}
    assert all(v == pytest.approx(-30.0, abs=0.05) for v in clocks.shift.values())


def test_clocks_that_agree_within_five_seconds_change_nothing() -> None:
    clocks = HostClocks()
    off = np.repeat([0.0, -3.0, 1.0, 0.0], 8)  # at most 4 s from the one most ahead
    _feed(clocks, off, off, 3 * CLOCK_STEPS)
    assert clocks.shift == {}


def test_one_rank_off_moves_no_host() -> None:
    """A rank whose records are an hour early (forged, or its own clock) is one of three
    ranks read on its host: the host's offset is the others'."""
    clocks = HostClocks()
    off = np.zeros(32)
    off[8] = -3600.0  # h1's first rank
    _feed(clocks, off, off, CLOCK_STEPS)
    assert clocks.shift == {}


def test_pipeline_stages_that_end_apart_are_no_clock() -> None:
    """Stages start together and end 2.5 s apart: the ends alone would say 7.5 s."""
    clocks = HostClocks()
    ends = np.repeat([0.0, -2.5, -5.0, -7.5], 8)
    _feed(clocks, np.zeros(32), ends, CLOCK_STEPS)
    assert clocks.shift == {}


def test_ends_that_wander_are_no_clock() -> None:
    clocks = HostClocks()
    rng = np.random.default_rng(2)
    index = _index(4)
    for s in range(CLOCK_STEPS):
        ends = 1.8e9 + 30 * s + rng.uniform(-20, 20, 32)
        clocks.update(ends - 1.0, ends, index)
    assert clocks.shift == {}


def test_a_new_placement_starts_over() -> None:
    clocks = HostClocks()
    off = np.repeat([0.0, -60.0, 0.0, 0.0], 8)
    _feed(clocks, off, off, CLOCK_STEPS)
    assert clocks.shift
    _feed(clocks, np.zeros(32), np.zeros(32), 5, version=2)  # ranks moved: a new index
    assert clocks.shift == {}


def test_missing_ranks_and_hosts_raise_nothing() -> None:
    clocks = HostClocks()
    index = _index(4)
    with np.errstate(all="raise"):
        for s in range(CLOCK_STEPS):
            ends = np.full(32, 1.8e9 + s)
            ends[8:16] = np.nan  # h1 never reports
            ends[0] = np.nan  # h0's first rank neither
            clocks.update(ends - 1.0, ends, index)
    assert clocks.shift == {}


def test_a_job_start_read_on_the_median_clock_outlives_a_new_placement() -> None:
    """Rank 0's host h1 is a minute behind: its ``job_start``, 20 s before the first step
    on its own clock, is read on the median host's clock once the offsets are known, and
    stays so after a requeue's new placement has forgotten them (before it was settled,
    the event went back to its host's time: a minute more start-up)."""
    clocks, tp = HostClocks(), Throughput(8)
    tp.on_job_start("h1", 1.8e9 - 20.0 - 60.0)
    assert not clocks.knows("h1")
    off = np.repeat([0.0, -60.0, 0.0, 0.0], 8)
    _feed(clocks, off, off, CLOCK_STEPS)
    assert clocks.knows("h1") and not clocks.knows("elsewhere")
    assert clocks.on_median_clock("h1", 0.0) == pytest.approx(60.0, abs=0.05)
    tp.settle(clocks.on_median_clock, clocks.knows)
    assert tp.start_events == {}
    _feed(clocks, np.zeros(32), np.zeros(32), 2, version=2)  # the job placed anew
    assert clocks.offset == {} and not clocks.knows("h1")
    first = tp._first(clocks.on_median_clock)
    assert first == pytest.approx(1.8e9 - 20.0, abs=0.05)

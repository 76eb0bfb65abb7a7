"""The vectorised NaN-skipping median equals the scalar one, lane by lane."""

from __future__ import annotations

import numpy as np
import pytest

from stepwatch.streams.core.stats import (
    change_point,
    colmed,
    med,
    median_change_point,
    nanlowmed,
    nanmed,
)


@pytest.mark.parametrize("seed", range(5))
def test_nanmed_matches_med_on_every_lane(seed: int) -> None:
    rng = np.random.default_rng(seed)
    for _ in range(200):
        shape = tuple(int(n) for n in rng.integers(0, 7, size=int(rng.integers(1, 4))))
        a = rng.normal(size=shape)
        a[rng.random(shape) < 0.3] = np.nan
        for axis in range(a.ndim):
            lanes = np.moveaxis(a, axis, -1)
            want = np.array([med(lanes[i]) for i in np.ndindex(lanes.shape[:-1])])
            got = nanmed(a, axis)
            assert got.shape == lanes.shape[:-1]
            assert np.array_equal(got.reshape(-1), want, equal_nan=True)


def test_nanmed_edges() -> None:
    assert np.isnan(nanmed(np.full((2, 3), np.nan), 1)).all()
    assert nanmed(np.empty((2, 0)), 1).shape == (2,)
    assert np.isnan(nanmed(np.empty((2, 0)), 1)).all()
    assert nanmed(np.array([[1.0, 2.0, np.nan, 4.0]]), 1)[0] == 2.0
    assert nanmed(np.array([[1.0, 2.0, 3.0, 4.0]]), 1)[0] == 2.5
    rows = np.array([[1.0, np.nan], [3.0, np.nan], [2.0, 5.0]])
    assert np.array_equal(colmed(rows), [2.0, 5.0])


def test_nanlowmed_is_the_smaller_middle_value_of_what_is_measured() -> None:
    a = np.array(
        [
            [1.0, 9.0, np.nan, np.nan],  # two values: the smaller
            [4.0, 1.0, 3.0, 2.0],  # four: the second smallest
            [5.0, np.nan, 1.0, 3.0],  # three: the middle one
            [np.nan, np.nan, np.nan, np.nan],  # none: NaN
        ]
    )
    got = nanlowmed(a)
    assert got[:3].tolist() == [1.0, 2.0, 3.0] and np.isnan(got[3])
    cube = np.random.default_rng(1).normal(size=(3, 5, 7))
    want = np.sort(cube, axis=-1)[..., 3]
    assert np.array_equal(nanlowmed(cube), want)


# an excess series as the straggler's onset reads it (real shape from a generated DDP job:
# calm steps, one step 2.5x slow before the fault, then the fault from index 4 on)
SPIKE_BEFORE = [-0.027, 1.66, 0.0, -0.031, 0.462, 0.387, 0.437, 0.438]


def test_the_median_split_is_not_pulled_onto_one_slow_step_before_the_change() -> None:
    x = np.array(SPIKE_BEFORE)
    assert median_change_point(x) == 4
    assert change_point(x) == 1  # the least-squares split takes the spike for the change


@pytest.mark.parametrize(
    ("series", "k"),
    [
        ([-0.004, -0.024, 0.557, 0.533, 0.596, 0.574, 0.612, 0.572], 2),  # a clean jump
        ([0.026, 0.026, 1.424, -0.057, 0.126, 0.49, 0.28, 0.416], 5),  # spike, then a jump
        ([0.0, 0.0, 0.0, 0.5], 3),  # the last value alone
        ([0.5, 0.0, 0.0, 0.0], 0),  # no upward change
        ([0.2, 0.2, 0.2, 0.2], 0),  # none at all
        ([0.0, np.nan, 0.0, 0.6, np.nan, 0.6], 2),  # NaN skipped: index among the rest
        ([0.3], 0),
        ([], 0),
    ],
)
def test_the_median_split_finds_the_jump(series: list[float], k: int) -> None:
    assert median_change_point(np.array(series, dtype=float)) == k


# a fault from index 2 on, then one step 2.5x slow at the open (the window's last step)
SPIKE_AT_OPEN = [0.01, -0.02, 0.6, 0.58, 0.63, 0.61, 0.59, 3.0]


def test_a_split_keeps_the_part_after_it_at_least_min_after_long() -> None:
    x = np.array(SPIKE_AT_OPEN)
    # alone, the slow last step is a cheaper split than the two calm steps
    assert median_change_point(x) == 7
    assert change_point(x) == 7
    # a CUSUM that needs 3 changed steps to alarm cannot have seen a change that short
    assert median_change_point(x, min_after=3) == 2
    assert change_point(x, min_after=3) == len(x) - 3  # still pulled, as far as it may go
    assert median_change_point(np.array([0.0, 0.0, 0.0, 0.5]), min_after=3) == 0
    assert change_point(np.array([0.0, 0.0, 0.5]), min_after=3) == 0


def test_the_median_split_on_random_jumps_with_one_outlier_before() -> None:
    rng = np.random.default_rng(3)
    near = {"median": 0, "least squares": 0}  # within 2 steps of the jump
    for _ in range(400):
        n, at = 8, int(rng.integers(2, 6))
        x = rng.normal(0.0, 0.03, n)
        x[at:] += rng.uniform(0.2, 0.6)
        x[int(rng.integers(0, at))] += rng.uniform(1.0, 2.0)  # one slow step before
        near["median"] += abs(median_change_point(x) - at) <= 2
        near["least squares"] += abs(change_point(x) - at) <= 2
    # measured: 375 and 283 of 400 (a part of 2 with the outlier in it has it in its median)
    assert near["median"] >= 360 and near["least squares"] <= 320

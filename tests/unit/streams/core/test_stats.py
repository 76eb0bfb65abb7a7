"""The vectorised NaN-skipping median equals the scalar one, lane by lane."""

from __future__ import annotations

import numpy as np
import pytest

from stepwatch.streams.core.stats import colmed, med, nanlowmed, nanmed


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

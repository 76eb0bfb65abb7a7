"""Rows packed by ``struct`` read back as NumPy would have read the Python values."""

from __future__ import annotations

import math
import struct

import numpy as np
import pytest

from stepwatch.streams.core.packing import pack_rows

pytestmark = pytest.mark.unit


def test_packed_floats_read_back_as_numpys_conversion_reads_them() -> None:
    rng = np.random.default_rng(5)
    rows = [tuple(float(v) for v in r) for r in rng.normal(size=(40, 5)) * 1e3]
    rows[7] = (None, *rows[7][1:])  # unmeasured: NaN, as np.array reads None
    rows[9] = (*rows[9][:4], None)
    layout = struct.Struct("=5d")
    got = np.frombuffer(pack_rows(layout, rows, [math.nan] * 5)).reshape(-1, 5)
    assert np.array_equal(got, np.array(rows, dtype=float), equal_nan=True)


def test_ints_stay_exact_and_absent_takes_its_marker() -> None:
    big = 2**63 - 1  # a float64 would round it
    rows = [(1, big, 3), (None, 5, big - 1), (7, None, 0)]
    layout = struct.Struct("=3q")
    got = np.frombuffer(pack_rows(layout, rows, [-1, -2, -3]), np.int64).reshape(-1, 3)
    assert got.tolist() == [[1, big, 3], [-1, 5, big - 1], [7, -2, 0]]


@pytest.mark.parametrize("bad", [2**63, -(2**63) - 1, 1.5, "7"])
def test_a_value_the_layout_cannot_take_raises(bad: object) -> None:
    with pytest.raises(struct.error):
        pack_rows(struct.Struct("=2q"), [(1, 2), (bad, 3)], [-1, -1])

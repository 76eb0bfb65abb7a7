"""Rows packed by ``struct`` read back as NumPy would have read the Python values."""

from __future__ import annotations

import math
import struct

import numpy as np
import pytest

from stepwatch.streams.core.packing import layout, pack_absent

pytestmark = pytest.mark.unit

FMT = "dddqq"  # floats, then ints
ABSENT = (math.nan, math.nan, math.nan, -1, -2)


def _rows(n: int) -> list[tuple[float | int | None, ...]]:
    rng = np.random.default_rng(5)
    return [
        (*(float(v) for v in rng.normal(size=3) * 1e3), int(rng.integers(0, 2**62)), 2**63 - 1)
        for _ in range(n)
    ]


def _read(packed: bytes) -> tuple[list[list[float]], list[list[int]]]:
    words = np.frombuffer(packed, np.int64).reshape(-1, len(FMT))
    return words[:, :3].view(np.float64).tolist(), words[:, 3:].tolist()


def test_packed_rows_read_back_exactly() -> None:
    rows = _rows(12)
    floats, ints = _read(b"".join(layout(FMT).pack(*r) for r in rows))
    assert np.array_equal(floats, np.array([r[:3] for r in rows], dtype=float))
    assert ints == [list(r[3:]) for r in rows]  # exact: 2**63 - 1 would round as a float


def test_absent_values_take_their_columns_marker() -> None:
    rows = _rows(6)
    rows[1] = (None, *rows[1][1:])
    rows[4] = (*rows[4][:3], None, None)
    floats, ints = _read(b"".join(pack_absent(FMT, rows, ABSENT)))
    assert math.isnan(floats[1][0]) and floats[1][1:] == list(rows[1][1:3])
    assert ints[4] == [-1, -2] and ints[0] == list(rows[0][3:])
    assert np.array_equal(
        floats, np.array([r[:3] for r in rows], dtype=float), equal_nan=True
    )  # as NumPy reads None


@pytest.mark.parametrize("bad", [2**63, -(2**63) - 1, 1.5, "7"])
def test_a_value_the_layout_cannot_take_raises(bad: object) -> None:
    rows = _rows(4)
    rows[2] = (*rows[2][:3], bad, None)
    with pytest.raises(struct.error):
        pack_absent(FMT, rows, ABSENT)
    with pytest.raises(struct.error):
        layout(FMT).pack(*rows[2][:4], 0)

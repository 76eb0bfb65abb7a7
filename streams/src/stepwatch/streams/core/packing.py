"""Python values to NumPy rows without NumPy's per-value conversion.

``np.array(rows, dtype=float)`` and ``np.fromiter`` convert value by value
through NumPy's generic machinery (``PyArray_Pack``: ~300-450 instructions a
value). ``struct`` packs a row of Python floats and ints straight into C
doubles and longs; ``np.frombuffer`` then reads the joined bytes without a
copy. On the bench-stream jobs this halved what the sample stores and the
step assembly spent on conversion (``bench/bench_instr.py``).
"""

from __future__ import annotations

import struct
from itertools import starmap
from typing import Any


def pack_rows(layout: struct.Struct, rows: list[tuple[Any, ...]], absent: list[Any]) -> bytes:
    """``rows`` packed by ``layout``, one after the other; a None in column ``k`` is
    packed as ``absent[k]`` (NaN, or an int's "absent" marker). A value ``layout``
    cannot take (a float for an int, an int beyond int64) raises ``struct.error``, as
    NumPy's conversion raised."""
    try:  # the common case: every value given
        return b"".join(starmap(layout.pack, rows))
    except (struct.error, TypeError):
        return b"".join(
            [
                layout.pack(*[absent[k] if v is None else v for k, v in enumerate(row)])
                for row in rows
            ]
        )

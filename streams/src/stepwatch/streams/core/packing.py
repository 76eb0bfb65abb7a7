"""Python values to NumPy rows without NumPy's per-value conversion.

``np.array(rows, dtype=float)`` and ``np.fromiter`` convert value by value
through NumPy's generic machinery (``PyArray_Pack``: ~300-450 instructions a
value in a throwaway callgrind micro-benchmark). ``struct`` packs Python floats
and ints straight into C doubles and longs, and ``np.frombuffer`` reads the
joined bytes without a copy. Its cheapest use is a call with the fields as
arguments, ``pack(r.a, r.b, ...)`` (slot loads, no tuple), inside a
comprehension: ``bench/bench_instr.py`` counts the difference. A None cannot be
packed: that call raises, and the caller takes a slower path (here
:func:`pack_absent`), which costs about what NumPy's conversion did.
"""

from __future__ import annotations

import struct
from itertools import groupby
from typing import Any

_LAYOUTS: dict[str, struct.Struct] = {}


def layout(fmt: str) -> struct.Struct:
    """The native-order, unpadded ``struct`` of ``fmt`` (``d``/``q`` per column)."""
    found = _LAYOUTS.get(fmt)
    if found is None:  # runs counted ("6d4q"): ~7 % fewer instructions a pack than
        # "dddddd..." (a throwaway callgrind micro-benchmark)
        runs = "".join(f"{len(list(run))}{code}" for code, run in groupby(fmt))
        found = _LAYOUTS[fmt] = struct.Struct("=" + runs)
    return found


def pack_absent(fmt: str, rows: list[tuple[Any, ...]], absent: tuple[Any, ...]) -> list[bytes]:
    """Each of ``rows`` packed by ``fmt``, a None in column ``k`` as ``absent[k]``
    (NaN, or an int's "absent" marker). A value a column cannot take (a float for an
    int, an int beyond int64) raises ``struct.error``, as NumPy's conversion raised."""
    pack = layout(fmt).pack
    return [pack(*[absent[k] if v is None else v for k, v in enumerate(row)]) for row in rows]

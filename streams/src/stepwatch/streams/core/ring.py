"""Fixed-size ring buffers of per-rank rows (NumPy), the core's bounded memory."""

from __future__ import annotations

import numpy as np


class Ring:
    """The last ``n`` rows of shape ``width``; unfilled rows hold ``fill``."""

    def __init__(
        self, n: int, width: int | tuple[int, ...], fill: float = np.nan, dtype: type = float
    ) -> None:
        self.n = n
        shape = (width,) if isinstance(width, int) else width
        self.rows: np.ndarray = np.full((n, *shape), fill, dtype=dtype)
        self.fill = fill
        self.pos = 0  # next row to write
        self.count = 0  # rows written so far, capped at n

    def push(self, row: np.ndarray | float) -> None:
        """Write ``row`` over the oldest one."""
        self.rows[self.pos] = row
        self.pos = (self.pos + 1) % self.n
        if self.count < self.n:
            self.count += 1

    def swap(self, row: np.ndarray) -> np.ndarray:
        """Write ``row`` over the oldest one; return a copy of the row it replaced."""
        old: np.ndarray = self.rows[self.pos].copy()
        self.push(row)
        return old

    def filled(self) -> np.ndarray:
        """The written rows (oldest first when full; order is irrelevant to medians)."""
        return self.rows if self.count == self.n else self.rows[: self.count]

    def last(self, k: int) -> np.ndarray:
        """The ``k`` most recent rows, oldest first."""
        k = min(k, self.count)
        idx = (self.pos - k + np.arange(k)) % self.n
        return self.rows[idx]

    def clear(self) -> None:
        self.rows.fill(self.fill)
        self.pos = 0
        self.count = 0

"""Which sequence numbers of a sender were seen: a high-water mark and a bitmap window.

The contract's header numbers each sender's messages (``seq`` per ``host``,
``inst``, ``kind``), so "seen before?" needs no per-message memory: per key,
the highest number seen and a bitmask of the ``window`` numbers below it. The
stream worker uses it per (job, rank) for step numbers; the store's sink per
sender, with a content hash per slot (:class:`SenderWindow`). Memory is
``O(keys)``, never ``O(messages)``.
"""

from __future__ import annotations

import enum
from array import array


class DropReason(enum.StrEnum):
    DUPLICATE = "duplicate"
    OUT_OF_ORDER = "out_of_order"
    STALE = "stale"


class SeenWindow:
    """Which of the last ``window`` sequence numbers were seen, per key."""

    __slots__ = ("_mask_all", "_state", "window")

    def __init__(self, window: int) -> None:
        self.window = window
        self._mask_all = (1 << window) - 1
        self._state: dict[object, list[int]] = {}

    def admit(self, key: object, n: int) -> DropReason | None:
        """Record ``n`` for ``key``; None if new, else why it is dropped."""
        st = self._state.get(key)
        if st is None:
            self._state[key] = [n, 1]
            return None
        high, mask = st
        if n > high:
            st[0] = n
            # a jump of a window or more keeps only n: shifting by it (a step or seq of
            # 2^40 after 0) would build a 2^40-bit number, a MemoryError in the worker
            shift = n - high
            st[1] = ((mask << shift) | 1) & self._mask_all if shift < self.window else 1
            return None
        back = high - n
        if back >= self.window:
            return DropReason.STALE
        bit = 1 << back
        if mask & bit:
            return DropReason.DUPLICATE
        st[1] = mask | bit
        return None

    def forget(self, key: object) -> None:
        self._state.pop(key, None)

    def __len__(self) -> int:
        return len(self._state)


class Verdict(enum.StrEnum):
    NEW = "new"
    DUPLICATE = "duplicate"  # same number, same content: drop
    CONFLICT = "conflict"  # same number, other content: keep, and flag
    BEYOND = "beyond_window"  # too far behind the high-water mark to tell: keep


class SenderWindow:
    """One sender's high-water mark, seen-bitmap and a 64-bit content hash per slot."""

    __slots__ = ("hashes", "high", "mask", "window")

    def __init__(self, window: int) -> None:
        self.window = window
        self.high = -1
        self.mask = 0
        self.hashes = array("Q", bytes(8 * window))

    def admit(self, n: int, digest: int) -> Verdict:
        w = self.window
        if n > self.high:
            shift = n - self.high if self.high >= 0 else w
            self.mask = ((self.mask << shift) | 1) & ((1 << w) - 1) if shift < w else 1
            self.high = n
            self.hashes[n % w] = digest
            return Verdict.NEW
        back = self.high - n
        if back >= w:
            return Verdict.BEYOND
        bit = 1 << back
        if not self.mask & bit:
            self.mask |= bit
            self.hashes[n % w] = digest
            return Verdict.NEW
        if self.hashes[n % w] == digest:
            return Verdict.DUPLICATE
        self.hashes[n % w] = (
            digest  # the slot remembers the later content: its repeat is a duplicate
        )
        return Verdict.CONFLICT

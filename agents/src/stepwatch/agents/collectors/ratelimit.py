"""Token buckets per key (a sender's pid, a user's uid), in a bounded table.

Each key may send ``burst`` datagrams at once and ``rate`` per second after
that; what exceeds it is refused. The table holds at most ``max_keys``
buckets: the least recently used goes first (a forgotten sender starts again
with a full bucket, which only ever lets more through, never less).
``rate <= 0`` turns the limit off.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Hashable


class TokenBuckets:
    def __init__(
        self,
        rate: float,
        burst: float,
        *,
        max_keys: int = 4096,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.rate = rate
        self.burst = max(1.0, burst)
        self.max_keys = max_keys
        self._clock = clock
        self._buckets: OrderedDict[Hashable, list[float]] = OrderedDict()  # key -> [tokens, at]

    @property
    def enabled(self) -> bool:
        return self.rate > 0

    def allow(self, key: Hashable, cost: float = 1.0) -> bool:
        """Take ``cost`` tokens from ``key``'s bucket; False (nothing taken) when too few."""
        if self.rate <= 0:
            return True
        now = self._clock()
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = [self.burst, now]
            self._buckets[key] = bucket
            if len(self._buckets) > self.max_keys:
                self._buckets.popitem(last=False)
        else:
            self._buckets.move_to_end(key)
            bucket[0] = min(self.burst, bucket[0] + (now - bucket[1]) * self.rate)
            bucket[1] = now
        if bucket[0] < cost:
            return False
        bucket[0] -= cost
        return True

    def __len__(self) -> int:
        return len(self._buckets)

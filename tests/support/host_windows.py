"""Random host windows for the tests of the batched readers (portends, gpubatch): hosts
in two shared sample stores or their own, filled by the caller, each with a time range
on its own clock (some shifted)."""

from __future__ import annotations

import random
from collections.abc import Callable

from stepwatch.streams.core.hostsamples import HostStores
from stepwatch.streams.core.hostwindow import HostWindow, View


def random_views(
    rng: random.Random, t0: float, fill: Callable[[random.Random, HostWindow, int], None]
) -> list[View]:
    """1 to 11 hosts of one ring size, 90 % of them in one of two shared stores, each
    filled with up to three rings' worth of samples by ``fill(rng, window, samples)``
    and read over a range of 5 s to 5 min, shifted by 0, 1.25 or -7.5 s."""
    size = rng.choice((8, 32, 128))
    stores = [HostStores(size), HostStores(size)]
    views = []
    for h in range(rng.randrange(1, 12)):
        win = HostWindow(f"h{h:02d}", size, rng.choice(stores) if rng.random() < 0.9 else None)
        fill(rng, win, rng.randrange(0, 3 * size))
        shift = rng.choice((0.0, 0.0, 1.25, -7.5))
        t1 = t0 + rng.uniform(0, 3 * size)
        views.append(win.host_view(t1 - rng.choice((5.0, 30.0, 300.0)) + shift, t1 + shift))
    return views

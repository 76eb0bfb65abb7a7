"""Many hosts' GPU signals read at once equal each host's own ``gpu_signals``.

``gpubatch.gpu_signals_many`` stands in for ``HostWindow.gpu_signals`` when a
straggler's GPU is compared with its peers': where it answers, the answer must
be the same signals, value for value and in the same order; where the shape is
not its own (XID/ECC events, GPUs moved between column slots, a counter reset)
it must say so (None). Random windows: absent and NaN readings, equal values,
out-of-order samples, ring wrap-around, counters that rise, shifted ranges and
two stores.
"""

from __future__ import annotations

import random

import pytest

from stepwatch.contract import EventMessage, EventType, GpuMessage, GpuReading
from stepwatch.streams.core import gpubatch
from stepwatch.streams.core.gpubatch import gpu_signals_many
from stepwatch.streams.core.hostsamples import HostStores
from stepwatch.streams.core.hostwindow import HostWindow
from tests.support.host_windows import random_views

pytestmark = pytest.mark.unit

T0 = 1_767_225_600.0


def _reading(rng: random.Random, index: int, i: int, reset: bool) -> GpuReading:
    def maybe(x: float) -> float | None:
        return None if rng.random() < 0.05 else x

    return GpuReading(
        index=index,
        sm_clock_mhz=maybe(rng.choice((1980.0, 1410.0, rng.uniform(900, 1980)))),
        sm_clock_max_mhz=1980.0,
        power_w=maybe(rng.choice((700.0, rng.uniform(100, 700)))),
        power_limit_w=700.0,
        temp_gpu_c=maybe(float(rng.randrange(40, 95))),
        util_gpu_pct=maybe(float(rng.choice((100, 0, rng.randrange(101))))),
        throttle_reasons=rng.choice((None, 0, 0x4, 0x20, 0x24, 0x8)),
        ecc_dbe_total=None if rng.random() < 0.2 else (0 if reset else i // 30),
        remapped_rows_uncorrectable=rng.choice((None, 0, 0, 1)) if reset else i // 50,
    )


def _fill(rng: random.Random, win: HostWindow, samples: int) -> None:
    gpus = list(range(rng.choice((1, 4, 8))))
    if rng.random() < 0.3:  # indices whose hashes collide: a set's order is not sorted
        gpus = [g * 64 + 3 for g in gpus]
    if rng.random() < 0.3:
        gpus.reverse()  # every sample's GPUs in descending order
    reset = rng.random() < 0.1
    for i in range(samples):
        ts = T0 + i + rng.choice((0.0, 0.0, 0.0, -2.5, 0.5))
        order = list(gpus)
        if rng.random() < 0.02:
            rng.shuffle(order)  # GPUs in other column slots
        win.add(GpuMessage(host=win.host, ts=ts, gpus=[_reading(rng, g, i, reset) for g in order]))
        if rng.random() < 0.01:
            win.add(
                EventMessage(
                    host=win.host, ts=ts, type=EventType.XID, gpu=gpus[0], code=79, detail="xid"
                )
            )


@pytest.mark.parametrize("seed", range(40))
def test_batched_signals_equal_the_per_host_signals(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = random.Random(seed)
    if seed % 2:
        monkeypatch.setattr(gpubatch, "CHUNK_HOSTS", 3)  # hosts read a few at a time
    views = random_views(rng, T0, _fill)
    for (win, t0, t1), got in zip(views, gpu_signals_many(views), strict=True):
        if got is not None:
            assert list(got.items()) == list(win.gpu_signals(t0, t1).items())


def test_hosts_the_batch_cannot_read_are_left_to_their_own_path() -> None:
    """An XID in range, GPUs in other column slots, a counter that went down: None; the
    plain host beside them is read."""
    stores = HostStores(16)
    wins = [HostWindow(f"h{h}", 16, stores) for h in range(4)]
    for i in range(10):
        for h, win in enumerate(wins):
            order = [1, 0] if h == 1 and i == 5 else [0, 1]
            dbe = 5 - i if h == 2 else i  # host 2's counter goes down: a reset
            win.add(
                GpuMessage(
                    host=win.host,
                    ts=T0 + i,
                    gpus=[GpuReading(index=g, ecc_dbe_total=dbe, temp_gpu_c=50.0) for g in order],
                )
            )
    wins[0].add(EventMessage(host="h0", ts=T0 + 3, type=EventType.XID, gpu=0, code=79))
    got = gpu_signals_many([(w, T0, T0 + 20) for w in wins])
    assert got[:3] == [None, None, None]
    assert got[3] == wins[3].gpu_signals(T0, T0 + 20)
    assert got[3][0].ecc_dbe == 9 and got[3][1].temp_c == 50.0

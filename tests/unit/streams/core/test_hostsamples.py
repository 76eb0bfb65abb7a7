"""The compact host sample store: what goes in comes out, in arrival order, exactly."""

from __future__ import annotations

import msgspec

from stepwatch.contract import GpuMessage, GpuReading, PortMessage, PortReading
from stepwatch.streams.core.hostsamples import ABSENT, HostStores
from stepwatch.streams.core.hostwindow import HostWindow

T0 = 1_767_225_600.0


def _gpu(ts: float, n: int = 2, temp: float | None = 60.0) -> GpuMessage:
    return GpuMessage(
        host="h",
        ts=ts,
        gpus=[
            GpuReading(
                index=g,
                temp_gpu_c=temp,
                util_gpu_pct=90.0 + g,
                sm_clock_mhz=1500.0,
                sm_clock_max_mhz=2000.0,
                ecc_dbe_total=None if g else 3,
            )
            for g in range(n)
        ],
    )


def test_rows_come_back_in_arrival_order_after_the_ring_wraps() -> None:
    win = HostWindow("h", 4)
    for i in range(11):  # more than one staging batch would be fine too: the ring holds 4
        win.add(_gpu(T0 + i))
    rows = win.gpu.order()
    assert win.gpu.ts[rows].tolist() == [T0 + 7, T0 + 8, T0 + 9, T0 + 10]
    sig = win.gpu_signals(T0, T0 + 100)
    assert sig[0].samples == 4 and sig[1].util_pct == 91.0
    assert sig[0].sm_clock_ratio == 0.75 and sig[0].temp_c == 60.0


def test_a_wider_message_widens_the_store_and_absent_values_stay_absent() -> None:
    win = HostWindow("h", 8)
    win.add(_gpu(T0, n=1, temp=None))
    win.add(_gpu(T0 + 1, n=3))
    sig = win.gpu_signals(T0, T0 + 1)
    assert sig[0].samples == 2 and sig[0].temp_c == 60.0  # the None is not a reading
    assert sig[2].samples == 1
    rows = win.gpu.order()
    assert win.gpu.ints[rows[0], 1:, 0].tolist() == [ABSENT, ABSENT]  # no reading there


def test_hosts_share_one_store_and_a_forgotten_host_gives_its_slot_back() -> None:
    stores = HostStores(4)
    a, b = HostWindow("a", 4, stores), HostWindow("b", 4, stores)
    for i in range(6):
        a.add(_gpu(T0 + i))
        if i % 2:
            b.add(_gpu(T0 + i, temp=70.0))
    assert len(a.gpu) == 4 and len(b.gpu) == 3
    assert b.gpu_signals(T0, T0 + 10)[0].temp_c == 70.0
    slot = a.gpu.slot
    a.close()
    c = HostWindow("c", 4, stores)
    assert c.gpu.slot == slot and len(c.gpu) == 0


def test_counters_beyond_float_precision_are_kept_exactly() -> None:
    win = HostWindow("h", 8)
    big = 2**62
    for i, v in enumerate((big, big + 1, big + 3)):
        win.add(
            PortMessage(
                host="h",
                ts=T0 + i,
                ports=[
                    PortReading(device="mlx5_0", port=1, xmit_wait_total=v, symbol_error_total=i)
                ],
            )
        )
    sig = win.port_signals(T0, T0 + 2)[0]
    assert sig.xmit_wait_per_s == 1.5  # (big + 3 - big) / 2 s
    assert sig.errors == {"symbol_error": 2}


def test_end_sample_rises_match_the_reading_by_reading_rule() -> None:
    """The vectorised rise of a counter between two samples is :func:`_rises`'s: growth,
    a 32-bit wrap (a congestion counter), a reset (also of an IB counter near the top of 32
    bits: those saturate), an unknown value."""
    import numpy as np

    from stepwatch.streams.core.hostsamples import ABSENT
    from stepwatch.streams.core.hostwindow import _rises, rises_of

    w = 2**32
    # np_cnp_sent, rp_cnp_handled, np_ecn_marked, xmit_wait, then the five error counters
    x = [5, w - 10, 100, w - 10, ABSENT, 7, 2**40, 0, 0]
    y = [9, 20, 3, 20, 4, ABSENT, 5, 0, 0]
    expected = _rises(
        tuple(None if v == ABSENT else v for v in x), tuple(None if v == ABSENT else v for v in y)
    )
    assert expected == [4, 30, 3, 20, 0, 0, 5, 0, 0]
    assert rises_of(np.array([x]), np.array([y])).tolist() == [expected]


def test_packed_readings_read_back_exactly_with_absent_values_in_place() -> None:
    """The packed records give back the readings' values: floats as float64, ints
    exactly (up to 2**63 - 1, where a float64 would round), None as NaN or ABSENT;
    a message with a None packs like the others."""
    import numpy as np

    from stepwatch.streams.core.hostsamples import (
        PORT_COUNTERS,
        gpu_convert,
        gpu_rows,
        port_convert,
        port_rows,
    )

    rng = np.random.default_rng(3)
    big = 2**63 - 1
    ports = [
        PortReading(
            device="mlx5_0", port=1, **{c: int(v) for c, v in zip(PORT_COUNTERS, row, strict=True)}
        )
        for row in rng.integers(0, 2**62, (6, len(PORT_COUNTERS)))
    ]
    ports[2] = msgspec.structs.replace(ports[2], xmit_wait_total=None, rcv_errors_total=big)
    want = [
        [ABSENT if v is None else v for v in (getattr(p, c) for c in PORT_COUNTERS)] for p in ports
    ]
    for batch in (ports[:2], ports):  # without a None, then with one
        ids = [(k, k % 2) for k in range(len(batch))]
        _, got = port_convert(port_rows(batch, ids))
        assert got[:, :2].tolist() == [list(i) for i in ids]
        assert got[:, 2:].tolist() == want[: len(batch)]
    gpus = [
        GpuReading(
            index=i, sm_clock_mhz=1400.0 + i, sm_clock_max_mhz=2000.0, power_w=300.5,
            power_limit_w=700.0, temp_gpu_c=60.0 + i, util_gpu_pct=99.0, throttle_reasons=4,
            ecc_dbe_total=big - i, remapped_rows_uncorrectable=i,
        )
        for i in range(4)
    ]  # fmt: skip
    gpus[3] = msgspec.structs.replace(gpus[3], power_limit_w=None, throttle_reasons=None)
    floats, ints = gpu_convert(gpu_rows(gpus))
    assert floats[0].tolist() == [0.7, 300.5 / 700.0, 60.0, 99.0]
    assert np.isnan(floats[3, 1]) and floats[3, 0] == 1403.0 / 2000.0
    assert ints.tolist() == [[i, 0 if i == 3 else 4, big - i, i] for i in range(4)]
    assert gpu_convert(gpu_rows(gpus[:3]))[1].tolist() == ints[:3].tolist()


def test_gpu_series_grouped_at_once_match_the_reading_by_reading_ones() -> None:
    import numpy as np

    from stepwatch.streams.core.hostwindow import _GpuSeries, _series_by_gpu

    rng = np.random.default_rng(11)
    rows, width = 40, 6
    floats = rng.normal(size=(rows, width, 4))
    floats[rng.random(floats.shape) < 0.2] = np.nan
    ints = rng.integers(0, 1000, size=(rows, width, 4))
    ints[..., 0] = rng.permutation(np.tile(np.arange(width), (rows, 1)).T).T  # GPUs shuffled
    ints[rng.random((rows, width)) < 0.1, 0] = ABSENT  # empty column slots
    ints[..., 2:][rng.random((rows, width, 2)) < 0.2] = ABSENT
    want: dict[int, _GpuSeries] = {}
    for frow, irow in zip(floats.tolist(), ints.tolist(), strict=True):
        for f, i in zip(frow, irow, strict=True):
            if i[0] != ABSENT:
                want.setdefault(i[0], _GpuSeries()).add(f, i)
    got = _series_by_gpu(floats, ints)
    assert got.keys() == want.keys()
    for g, series in want.items():
        for name in _GpuSeries.__slots__:
            assert getattr(got[g], name) == getattr(series, name), (g, name)


def test_a_silent_host_window_goes_at_the_first_tick_past_its_silence() -> None:
    from stepwatch.streams.core import DetectConfig, Engine

    engine = Engine(DetectConfig(host_silence_seconds=10.0))
    silence = engine.cfg.host_silence_seconds
    for ts in range(0, 30):  # h1 reports every second, h2 stops at 5
        engine.process(GpuMessage(host="h1", ts=T0 + ts, gpus=[GpuReading(index=0)]))
        if ts <= 5:
            engine.process(GpuMessage(host="h2", ts=T0 + ts, gpus=[GpuReading(index=0)]))
        engine.tick(T0 + ts)
        assert ("h2" in engine.windows) == (ts - 5 <= silence), ts
    # a new host whose sample is stamped older than the silence (its clock is behind, or
    # it was late): silence counts on the engine's clock from its arrival, so it stays
    # until it has been silent that long (docs/detection.md, "Clocks")
    engine.process(GpuMessage(host="h3", ts=T0 + 29 - silence - 1, gpus=[GpuReading(index=0)]))
    engine.tick(T0 + 29)
    assert "h3" in engine.windows and "h1" in engine.windows
    engine.tick(T0 + 29 + silence + 1)
    assert "h3" not in engine.windows and "h1" not in engine.windows


def test_widening_after_the_ring_wrapped_leaves_every_old_row_without_the_new_readings() -> None:
    """The widened store fills the new column slots of the rows written so far only (the
    others are never read): every row of a wrapped ring, none of a fresh slot's."""
    stores = HostStores(4)
    a, b = HostWindow("a", 4, stores), HostWindow("b", 4, stores)
    for i in range(6):  # a's ring wraps with 1-reading samples
        a.add(_gpu(T0 + i, n=1))
    b.add(_gpu(T0, n=1))
    len(b.gpu)  # written (a reader flushes)
    a.add(_gpu(T0 + 6, n=3))  # wider: the store widens
    rows = a.gpu.order()
    assert a.gpu.ints[rows[:-1], 1:, 0].tolist() == [[ABSENT, ABSENT]] * 3
    assert set(a.gpu_signals(T0, T0 + 10)) == {0, 1, 2}
    assert a.gpu_signals(T0, T0 + 10)[1].samples == 1
    assert b.gpu_signals(T0, T0 + 10).keys() == {0}


def test_samples_staged_together_land_where_samples_flushed_one_by_one_land() -> None:
    """The batched scatter (several hosts, several samples a host, rings wrapping, a
    widening in the batch) writes every row the one-sample-at-a-time path writes."""
    import random

    import numpy as np

    rng = random.Random(5)
    together, alone = HostStores(5), HostStores(5)
    names = [f"h{i}" for i in range(7)]
    stores = {"together": together, "alone": alone}
    wins = {k: {h: HostWindow(h, 5, s) for h in names} for k, s in stores.items()}
    for i in range(200):
        host = rng.choice(names)
        n = rng.choice([2, 2, 2, 3]) if i > 40 else 2
        temp = None if rng.random() < 0.1 else rng.uniform(40, 90)
        for s in ("together", "alone"):
            wins[s][host].add(_gpu(T0 + i, n=n, temp=temp))
        alone.gpu.flush()
        if rng.random() < 0.05:
            together.gpu.flush()
    together.gpu.flush()
    a, b = together.gpu, alone.gpu
    assert a.pos.tolist() == b.pos.tolist() and a.count.tolist() == b.count.tolist()
    for slot in range(len(names)):
        rows = np.arange(int(b.count[slot]))
        assert np.array_equal(a.ts[slot, rows], b.ts[slot, rows])
        assert np.array_equal(a.floats[slot, rows], b.floats[slot, rows], equal_nan=True)
        assert np.array_equal(a.ints[slot, rows], b.ints[slot, rows])

"""The network check's batched first pass reads the rates the per-host path reads.

``portends.port_rates`` must give, for every host, exactly the CNP and
xmit_wait rates of ``HostWindow.port_signals(t0, t1, ends_only=True)``, and
flag every host whose ports that path would mark down or erroring; otherwise
``netloc.port_suspects`` would judge different ports than before. Checked on
random windows: out-of-order and duplicate times, ring wrap-around, counter
resets and 32-bit wraps, absent counters, ports that change between samples,
link states and link-down events, clock-shifted views and two stores.
"""

from __future__ import annotations

import random

import pytest

from stepwatch.contract import EventMessage, EventType, PortMessage, PortReading
from stepwatch.streams.core.config import DetectConfig
from stepwatch.streams.core.hostsamples import HostStores
from stepwatch.streams.core.hostwindow import HostWindow
from stepwatch.streams.core.netloc import port_suspects
from stepwatch.streams.core.portends import port_rates
from tests.support.host_windows import random_views

pytestmark = pytest.mark.unit

T0 = 1_767_225_600.0
WRAP = 2**32


def _port(rng: random.Random, device: str, port: int, i: int) -> PortReading:
    base = (i + 1) * rng.choice((10, 1000, 10**6))
    if rng.random() < 0.05:
        base = rng.randrange(WRAP - 10**6, WRAP)  # near a 32-bit wrap
    if rng.random() < 0.05:
        base = rng.randrange(0, 50)  # a reset
    counter = None if rng.random() < 0.03 else base
    errors = rng.choice((0, 0, 0, 0, 0, 0, 0, i))
    return PortReading(
        device=device,
        port=port,
        state="DOWN" if rng.random() < 0.02 else "ACTIVE",
        np_cnp_sent_total=counter,
        rp_cnp_handled_total=base // 2,
        np_ecn_marked_roce_packets_total=base * 3,
        xmit_wait_total=base * rng.choice((1, 7)),
        symbol_error_total=errors,
        link_downed_total=0,
    )


def _fill(rng: random.Random, win: HostWindow, samples: int) -> None:
    devices = [(f"mlx5_{d}", 1) for d in range(rng.choice((1, 4, 8)))]
    for i in range(samples):
        ts = T0 + i + rng.choice((0.0, 0.0, 0.0, 0.5, -3.0, -40.0))  # late, equal or far off
        ports = list(devices)
        if rng.random() < 0.05:
            rng.shuffle(ports)  # the same ports in another order
        if rng.random() < 0.03:
            ports = ports[:-1] or ports  # one port missing
        win.add(PortMessage(host=win.host, ts=ts, ports=[_port(rng, d, p, i) for d, p in ports]))
        if rng.random() < 0.02:
            detail = rng.choice(("ACTIVE->DOWN", "DOWN->ACTIVE"))
            win.add(
                EventMessage(
                    host=win.host,
                    ts=ts,
                    type=EventType.LINK_STATE,
                    device=devices[0][0],
                    port=1,
                    detail=detail,
                )
            )


@pytest.mark.parametrize("seed", range(40))
def test_batched_rates_equal_the_per_host_rates(seed: int) -> None:
    rng = random.Random(seed)
    views = random_views(rng, T0, _fill)
    rates = port_rates(views)
    for i, (win, t0, t1) in enumerate(views):
        signals = win.port_signals(t0, t1, ends_only=True)
        mine = rates.host == i
        if rates.irregular[i]:
            assert not mine.any()
            continue
        # the same values (what the medians and each host's test read), in any order
        assert sorted(rates.cnp_per_s[mine].tolist()) == sorted(p.cnp_per_s for p in signals)
        assert sorted(rates.xmit_wait_per_s[mine].tolist()) == sorted(
            p.xmit_wait_per_s for p in signals
        )
        if any(p.down or p.errors for p in signals):
            assert rates.flagged[i]  # (a link-down event flags its host even without samples)
        elif rates.flagged[i]:
            assert win.events_in(t0, t1, EventType.LINK_STATE)


@pytest.mark.parametrize("seed", range(20))
def test_suspects_are_those_of_judging_every_host_port_by_port(seed: int) -> None:
    """``port_suspects(ends_only=True)``, batched, against the same judgement made on
    every host's ``port_signals``: the suspects are equal, field for field."""
    rng = random.Random(100 + seed)
    stores = HostStores(64)
    windows = {}
    for h in range(rng.randrange(2, 10)):
        win = windows[f"h{h}"] = HostWindow(f"h{h}", 64, stores)
        _fill(rng, win, 100)
    cfg = DetectConfig()
    t1 = T0 + 95
    got = port_suspects(windows, list(windows), t1 - 30, t1, 60.0, cfg, ends_only=True)
    want = _every_host(windows, t1 - 30, t1, cfg)
    assert got == want


def _every_host(
    windows: dict[str, HostWindow], t0: float, t1: float, cfg: DetectConfig
) -> list[object]:
    """The per-host judgement: the path port_suspects took before the batched pass."""
    from stepwatch.streams.core import netloc

    now = {h: w.port_signals(t0, t1, True) for h, w in sorted(windows.items())}
    every = [p for ps in now.values() for p in ps]
    peer_cnp = netloc.median_of([p.cnp_per_s for p in every]) or 0.0
    peer_wait = netloc.median_of([p.xmit_wait_per_s for p in every]) or 0.0
    out = []
    for h, ports in now.items():
        before = {(q.device, q.port): q for q in windows[h].port_signals(t0 - 60.0, t0, True)}
        for p in ports:
            if netloc._judge(h, p, None, peer_cnp, peer_wait, cfg) is None:
                continue
            s = netloc._judge(h, p, before.get((p.device, p.port)), peer_cnp, peer_wait, cfg)
            if s is not None:
                out.append(s)
    return out

"""Localize a network fault from the RDMA counters of a job's hosts.

A congested or faulty NIC slows the whole collective (ring and tree
all-reduce wait for the slowest link), so no rank has more compute: the job's
communication time rises against its own baseline. The culprit is found in the
counters: for every port of the job's hosts, the rates over the recent window
(``xmit_wait``, ECN marks + CNPs, symbol/link errors, link state) are compared
with the *other hosts'* ports over the same window and with the *port's own
history* (the window before). A port is a suspect when a rate is at least
``congestion_ratio`` times both references (and above the absolute floor), or
when it shows link errors or a link down. The suspect with the largest rise
wins; its host, device, port and rates are the detection's fields and evidence.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from stepwatch.streams.core.config import DetectConfig
from stepwatch.streams.core.hostclock import SampleWindow
from stepwatch.streams.core.hostwindow import PortSignals, median_of
from stepwatch.streams.core.portends import port_rates

Evidence = dict[str, str | float | int | bool | None]
MIN_HISTORY_SAMPLES = 3
MAX_HOSTS = 512  # bound the work on huge jobs (the hosts are sorted: deterministic)


@dataclass(frozen=True, slots=True)
class Suspect:
    host: str
    device: str
    port: int
    rise: float  # the largest rate / reference ratio (inf for errors or link down)
    reasons: tuple[str, ...]
    evidence: Evidence
    congested: bool = False  # ECN/CNP or xmit_wait stand out (not only errors or link down)
    errors: tuple[str, ...] = ()  # error counters that rose


def localize(
    windows: Mapping[str, SampleWindow],
    hosts: Sequence[str],
    t0: float,
    t1: float,
    history_s: float,
    cfg: DetectConfig,
    only: str | None = None,
) -> Suspect | None:
    """The port most likely behind a job-wide communication slowdown in [t0, t1], or None
    (``only``: judge that host's ports alone, the others being the reference)."""
    best: Suspect | None = None
    for s in port_suspects(windows, hosts, t0, t1, history_s, cfg, only):
        if best is None or s.rise > best.rise:
            best = s
    return best


def port_suspects(
    windows: Mapping[str, SampleWindow],
    hosts: Sequence[str],
    t0: float,
    t1: float,
    history_s: float,
    cfg: DetectConfig,
    only: str | None = None,
    need_history: bool = False,
    ends_only: bool = False,
) -> list[Suspect]:
    """Every port in [t0, t1] that stands out (see :func:`localize`); ``history_s`` 0: the
    job's other ports are the only reference; ``need_history``: a port without
    ``MIN_HISTORY_SAMPLES`` samples of its own before ``t0`` is not judged; ``ends_only``:
    rates from each window's first and last samples (see HostWindow.port_signals)."""
    names = sorted(hosts)[:MAX_HOSTS]
    if only is not None and only not in names:
        names.append(only)
    wins = {h: win for h in names if (win := windows.get(h)) is not None}
    if ends_only:
        now, peers_cnp, peers_wait = _ends_pass(wins, t0, t1, cfg)
    else:
        now = {h: win.port_signals(t0, t1) for h, win in wins.items()}
        peers_cnp, peers_wait = _peers(wins, [p for ps in now.values() for p in ps], [], [])
    out: list[Suspect] = []
    for h, ports in now.items():
        if only is not None and h != only:
            continue
        before: dict[tuple[str, int], PortSignals] | None = None
        for p in ports:
            if _judge(h, p, None, peers_cnp, peers_wait, cfg) is None:
                continue  # not even above the job's other ports: its history cannot matter
            if before is None:  # the host's own history, read only for a host that stands out
                before = (
                    {
                        (q.device, q.port): q
                        for q in windows[h].port_signals(t0 - history_s, t0, ends_only)
                    }
                    if history_s > 0
                    else {}
                )
            old = before.get((p.device, p.port))
            if need_history and (old is None or old.samples < MIN_HISTORY_SAMPLES):
                continue  # no history of its own yet: a port that is always busy is not news
            s = _judge(h, p, old, peers_cnp, peers_wait, cfg)
            if s is not None:
                out.append(s)
    return out


def _peers(
    wins: Mapping[str, SampleWindow],
    ports: list[PortSignals],
    cnp: list[float],
    wait: list[float],
) -> tuple[float, float]:
    """The median CNP and xmit_wait rates of the job's ports (0 with fewer than 2 hosts):
    those of ``ports`` and the rates ``cnp`` and ``wait`` of others."""
    if len(wins) < 2:
        return 0.0, 0.0
    return (
        median_of([p.cnp_per_s for p in ports] + cnp) or 0.0,
        median_of([p.xmit_wait_per_s for p in ports] + wait) or 0.0,
    )


def _ends_pass(
    wins: Mapping[str, SampleWindow], t0: float, t1: float, cfg: DetectConfig
) -> tuple[dict[str, list[PortSignals]], float, float]:
    """``ends_only``: the job's medians from every port's rates at once
    (:func:`port_rates`), and the signals of the hosts with a port that could be a
    suspect (one :func:`_judge` would not drop against the job's other ports alone),
    read as :meth:`HostWindow.port_signals` reads them; the other hosts' ports cannot
    be suspects, whatever their own history."""
    names = list(wins)
    rates = port_rates([wins[h].host_view(t0, t1) for h in names])
    odd = {
        names[i]: wins[names[i]].port_signals(t0, t1, True) for i in np.flatnonzero(rates.irregular)
    }
    peer_cnp, peer_wait = _peers(
        wins,
        [p for ps in odd.values() for p in ps],
        rates.cnp_per_s.tolist(),
        rates.xmit_wait_per_s.tolist(),
    )
    stands = _above(rates.cnp_per_s, peer_cnp, cfg.min_cnp_per_second, cfg) | _above(
        rates.xmit_wait_per_s, peer_wait, cfg.min_xmit_wait_per_second, cfg
    )
    look = rates.flagged.copy()
    look[rates.host[stands]] = True
    now: dict[str, list[PortSignals]] = {}
    for i, h in enumerate(names):
        if h in odd:
            now[h] = odd[h]
        elif look[i]:
            now[h] = wins[h].port_signals(t0, t1, True)
    return now, peer_cnp, peer_wait


def _above(rate: np.ndarray, peer: float, floor: float, cfg: DetectConfig) -> np.ndarray:
    """Where a rate passes :func:`_judge`'s test against the job's ports alone."""
    ref = max(peer, 0.0, floor / cfg.congestion_ratio)
    return (rate >= floor) & (rate >= cfg.congestion_ratio * ref)


def _judge(
    host: str,
    p: PortSignals,
    old: PortSignals | None,
    peer_cnp: float,
    peer_wait: float,
    cfg: DetectConfig,
) -> Suspect | None:
    reasons: list[str] = []
    rise = 0.0
    congested = False
    if p.down:
        reasons.append(f"link down on {p.device}")
        rise = float("inf")
    if p.errors:
        reasons.append(f"link errors on {p.device}")
        rise = float("inf")
    for name, rate, peer, own, floor in (
        (
            "congestion (ECN/CNP)",
            p.cnp_per_s,
            peer_cnp,
            old.cnp_per_s if old else None,
            cfg.min_cnp_per_second,
        ),
        (
            "xmit_wait",
            p.xmit_wait_per_s,
            peer_wait,
            old.xmit_wait_per_s if old else None,
            cfg.min_xmit_wait_per_second,
        ),
    ):
        ref = max(peer, own if own is not None else 0.0, floor / cfg.congestion_ratio)
        if rate >= floor and rate >= cfg.congestion_ratio * ref:
            reasons.append(f"{name} on {p.device}")
            rise = max(rise, rate / ref)
            congested = True
    if not reasons:
        return None
    ev: Evidence = {
        "suspect_host": host,
        "device": p.device,
        "port": p.port,
        "cnp_per_s": round(p.cnp_per_s, 1),
        "peer_cnp_per_s": round(peer_cnp, 1),
        "own_before_cnp_per_s": None if old is None else round(old.cnp_per_s, 1),
        "xmit_wait_per_s": round(p.xmit_wait_per_s, 1),
        "peer_xmit_wait_per_s": round(peer_wait, 1),
        "own_before_xmit_wait_per_s": None if old is None else round(old.xmit_wait_per_s, 1),
        "link_down": p.down,
        **{f"{k}_delta": v for k, v in p.errors.items()},
        "network_reasons": ", ".join(reasons),
    }
    return Suspect(
        host, p.device, p.port, rise, tuple(reasons), ev, congested, tuple(sorted(p.errors))
    )

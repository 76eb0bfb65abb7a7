"""Network detections from the RDMA counters alone, whatever the job's step time did.

A congested or erroring NIC port slows the collective a little or a lot; a job
whose step time rises 2 % is below any slowdown verdict, yet two of one host's
NICs with ECN marks, CNPs and ``xmit_wait`` hundreds of times their peers' are
news. Every ``net_check_seconds`` of event time the job's ports are judged by
:func:`stepwatch.streams.core.netloc.localize` over the last
``net_window_seconds``: a port whose congestion rates stand at least
``congestion_ratio`` above both the job's other ports and its own history (the
``host_window_seconds`` before) and above the absolute floors, or whose error
counters rise (symbol errors, link recovery, receive errors), is a *suspect
port*. It becomes a detection once it has been one in every check for
``net_persist_seconds``:

* ``network_congestion`` (ECN/CNP, ``xmit_wait``) or ``link_errors`` (error
  counters), cause ``network``, fault ``system``, with ``host``, ``device`` and
  ``port``;
* its score is the job's communication-time change against its own baseline
  (the straggler-free step time's ratio, small or not), and the evidence holds
  the collective's added seconds per step (``delta_collective_s``).

A link going down is a ``link_flap`` (see incidents.py), not this. An open
network detection holds while the port stays ``congestion_ratio`` above the
job's other ports (its own history now holds the fault), and resolves after
``resolve_steps`` checks without it. A job slowdown that opens while one is
open belongs to it (``related``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

from stepwatch.contract import DetectionMessage
from stepwatch.streams.core.causes import Attribution, Evidence
from stepwatch.streams.core.config import DetectConfig
from stepwatch.streams.core.hostclock import SampleWindow
from stepwatch.streams.core.kinds import Cause, DetectionType, Fault
from stepwatch.streams.core.lifecycle import DetectionBook, Finding, Key
from stepwatch.streams.core.netloc import Suspect, port_suspects
from stepwatch.streams.core.slowdown import SlowdownTracker

T = DetectionType
NET_TYPES = (T.NETWORK_CONGESTION, T.LINK_ERRORS)
LINK_ONLY = frozenset({"link_downed"})  # reported as link_flap


class NetworkWatch:
    """Mixin of :class:`stepwatch.streams.core.job.Job` (uses its book, hosts, slowdown)."""

    cfg: DetectConfig
    book: DetectionBook
    hosts: set[str]
    slowdown: SlowdownTracker
    _net_next: float
    _net_since: dict[str, float]  # where -> event time it first was a suspect port
    step_at: Callable[[float], int | None]

    def _network(
        self, windows: Mapping[str, SampleWindow], now: float, step: int
    ) -> list[DetectionMessage]:
        if now < self._net_next or len(self.hosts) < 2:
            return []
        self._net_next = now + self.cfg.net_check_seconds
        t0 = now - self.cfg.net_window_seconds
        out: list[DetectionMessage] = []
        seen = self._suspects(windows, t0, now)
        for where, sus in seen.items():
            first = self._net_since.setdefault(where, now)
            key = self._net_key(sus, where)
            due = key in self.book.open or now - first >= self.cfg.net_persist_seconds
            if due and self.book.hold(key, now):
                f = self._net_finding(sus, where, step, now, first)
                if key not in self.book.open:
                    f.onset_step = self._net_onset(windows, sus, now)
                out.extend(self.book.observe(f))
        for where in list(self._net_since):
            if where not in seen:
                del self._net_since[where]
        for key in [k for t in NET_TYPES for k in self.book.keys(t)]:
            if key[2] not in seen:
                out.extend(self.book.clear(key, now, step))
        return out

    def _suspects(
        self, windows: Mapping[str, SampleWindow], t0: float, t1: float
    ) -> dict[str, Suspect]:
        """The suspect hosts, keyed ``net:<host>``, each with its worst port.

        Congestion echoes: the receivers of a congested port's traffic send CNPs, so
        several hosts' ports of one rail rise together; the host whose port rose most is
        the one reported (one fault, one incident). Error counters are each host's own.
        An open detection is judged against the job's other ports only (its own history
        holds the fault by now)."""
        hosts = sorted(self.hosts)
        found = port_suspects(
            windows,
            hosts,
            t0,
            t1,
            self.cfg.host_window_seconds,
            self.cfg,
            need_history=True,
            ends_only=True,
        )
        for t in NET_TYPES:
            for key in self.book.keys(t):
                host = key[2].removeprefix("net:")
                found += port_suspects(
                    windows, hosts, t0, t1, 0.0, self.cfg, only=host, ends_only=True
                )
        congested = [s for s in found if s.congested]
        top = max(congested, key=lambda s: s.rise).host if congested else ""
        out: dict[str, Suspect] = {}
        for sus in found:
            if not sus.congested and (set(sus.errors) <= LINK_ONLY or sus.evidence["link_down"]):
                continue  # the link went down in the window: a link_flap reports it
            if sus.congested and sus.host != top and not (set(sus.errors) - LINK_ONLY):
                continue
            where = f"net:{sus.host}"
            if where not in out or sus.rise > out[where].rise:
                out[where] = sus
        return out

    def _net_finding(
        self, sus: Suspect, where: str, step: int, now: float, first: float
    ) -> Finding:
        impact = self.slowdown.impact()
        key = self._net_key(sus, where)
        change = impact.get("ratio")
        collective = impact.get("collective")
        what = "congested" if key[0] == T.NETWORK_CONGESTION else "link errors"
        cost = f"{change:+.1%}" if change is not None else "unknown"
        summary = (
            f"{sus.host} {sus.device} port {sus.port}: {what} "
            f"({sus.evidence.get('network_reasons')}); the job's step time "
            f"{cost} against its baseline"
        )
        attr = Attribution(Cause.NETWORK, Fault.SYSTEM, f"{what} on {sus.device}", {})
        ev: Evidence = {
            **sus.evidence,
            "suspect_since": round(first, 3),
            "step_time_change": None if change is None else round(change, 4),
            "delta_collective_s": collective,
        }
        cur = self.book.open.get(key)
        related = cur.finding.related if cur is not None else self._same_fault(sus.host)
        return Finding(
            key[0],
            change if change is not None else 0.0,
            step,
            now,
            summary,
            attr,
            host=sus.host,
            evidence=ev,
            where=where,
            device=sus.device,
            port=sus.port,
            related=related,
        )

    def _net_onset(
        self, windows: Mapping[str, SampleWindow], sus: Suspect, now: float
    ) -> int | None:
        """The step at which the port's rise began: the start of its trailing run of
        sample intervals above the geometric mean of its reference and its rate now."""
        win = windows.get(sus.host)
        ev = sus.evidence
        rate = _num(ev, "xmit_wait_per_s") + _num(ev, "cnp_per_s")
        ref = max(
            _num(ev, "own_before_xmit_wait_per_s") + _num(ev, "own_before_cnp_per_s"),
            _num(ev, "peer_xmit_wait_per_s") + _num(ev, "peer_cnp_per_s"),
            1.0,
        )
        if win is None or not rate > ref:
            return None
        start = win.rise_start(
            sus.device, sus.port, now - self.cfg.host_window_seconds, now, math.sqrt(rate * ref)
        )
        return self.step_at(start)

    def _same_fault(self, host: str) -> str:
        """The id of an open incident that already blames this host's network (a job
        slowdown that named it, a straggler on it with cause network), "" when none."""
        for key, cur in self.book.open.items():
            f = cur.finding
            if key[0] in NET_TYPES or f.related or f.host != host:
                continue
            if key[0] == T.JOB_SLOWDOWN or f.attribution.cause == Cause.NETWORK:
                return cur.id
        return ""

    def _net_key(self, sus: Suspect, where: str) -> Key:
        """The open detection's key for this port, or the key a new one would get."""
        for t in NET_TYPES:
            if (t, None, where) in self.book.open:
                return (t, None, where)
        return (T.NETWORK_CONGESTION if sus.congested else T.LINK_ERRORS, None, where)

    def network_incident(self, host: str = "") -> str:
        """The id of an open network detection (on ``host`` when given), "" when none."""
        for t in NET_TYPES:
            for key in self.book.keys(t):
                if not host or key[2] == f"net:{host}":
                    return self.book.id_of(key)
        return ""


def _num(ev: Evidence, key: str) -> float:
    v = ev.get(key)
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else 0.0

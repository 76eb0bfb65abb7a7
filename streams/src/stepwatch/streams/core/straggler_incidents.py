"""Straggler incidents of a job: one per slow rank, or one per host when its ranks share it.

A fault shared by the ranks of one host (a data-loader stall, CPU contention,
a host NIC, a lemon node) makes several of that host's ranks stragglers at
about the same step. They become **one** host-level ``straggler`` detection
(``rank`` null, ``host`` the host, ``ranks`` the affected ranks, key
``host:<name>``), never one per rank. When one rank of a host qualifies while
another rank of the same host is *rising* (flagged in a few steps, score over
half its threshold), the rank-level detection waits up to ``HOST_DEFER_STEPS``
steps for the host to declare itself.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable

import numpy as np

from stepwatch.contract import DetectionMessage
from stepwatch.streams.core.assembly import ClosedStep
from stepwatch.streams.core.causes import (
    Attribution,
    CauseFinder,
    Evidence,
    Shares,
    extra_wait,
    waiting_share,
)
from stepwatch.streams.core.config import DetectConfig
from stepwatch.streams.core.hostclock import HostClocks
from stepwatch.streams.core.hosthistory import HostHistory, SlowHost
from stepwatch.streams.core.kinds import DetectionType
from stepwatch.streams.core.lifecycle import DetectionBook, Finding, Key
from stepwatch.streams.core.ranks import RankTable
from stepwatch.streams.core.straggler_scores import Candidate, StragglerTracker

T = DetectionType
HOST_DEFER_STEPS = 3
MIN_CAUSE_SPAN_S = 5.0  # read a new incident's signals over at least this many seconds
COMPUTE_PHASES = ("forward", "backward", "optimizer", "other")


class Stragglers:
    """Mixin of :class:`stepwatch.streams.core.job.Job` (uses its tracker, book and ranks)."""

    straggler: StragglerTracker
    host_history: HostHistory
    book: DetectionBook
    ranks: RankTable
    causes: CauseFinder
    clocks: HostClocks
    hosts: set[str]
    _host_defer: dict[str, int]
    _host_way: dict[str, str | None]
    _held_hosts: dict[str, float]  # host held back by _unproven_host -> since (job clock)
    cfg: DetectConfig
    suspects: dict[int, float]  # rank -> score of the current suspects
    suspects_total: int  # suspects seen (a rank entering the set counts once)
    _unproven_now: dict[int, float]  # rank -> score held back this step (_unproven)

    _attribution: Callable[[Key, float, Callable[[], Attribution]], Attribution]
    _onset_span: Callable[[], float | None]
    slowdown_step_s: Callable[[], float | None]

    def _stragglers(self, cs: ClosedStep) -> list[DetectionMessage]:
        out: list[DetectionMessage] = []
        self._unproven_now = {}
        found = self.straggler.candidates()
        candidates = {
            c.rank: c.score
            for c in found
            if self.straggler.material(c) or self.book.is_open(T.STRAGGLER, c.rank)
        }
        candidates.update(self._material_hosts([c for c in found if c.rank not in candidates]))
        suspects = {c.rank: c.score for c in found if c.rank not in candidates}
        by_host: dict[str, list[int]] = defaultdict(list)
        for rank in candidates:
            by_host[self.ranks.host[rank]].append(rank)
        for key in self.book.keys(T.STRAGGLER):
            if key[1] is None:
                out.extend(self._host_holds(key, candidates, cs))
        for host, ranks in by_host.items():
            if not self._lasted(host, ranks):
                short = [r for r in ranks if not self.book.is_open(T.STRAGGLER, r)]
                suspects.update({r: candidates[r] for r in short})
                ranks = [r for r in ranks if r not in short]
                if not ranks:
                    continue  # not for long enough yet (see StragglerTracker.lasted)
            out.extend(self._new_on_host(host, ranks, candidates, cs))
        for key in self.book.keys(T.STRAGGLER):
            r = key[1]
            if r is None or r in candidates:
                continue
            holds, score = self.straggler.still_slow(r)
            if holds:
                if self.book.hold(key, cs.end_max, score):
                    out.extend(self._observe(self._straggler_finding(r, score, cs)))
            else:
                out.extend(self.book.clear(key, cs.end_max, cs.step))
        self._note_suspects({**suspects, **self._unproven_now})
        return out

    def _material_hosts(self, rest: list[Candidate]) -> dict[int, float]:
        """Candidates that are not material alone but are several ranks of one host whose
        excess, against the peers off that host, is: one host-level fault (a host that is
        half of its group moves the group median half way to itself)."""
        by_host: dict[str, list[Candidate]] = defaultdict(list)
        for c in rest:
            by_host[self.ranks.host[c.rank]].append(c)
        out: dict[int, float] = {}
        groups = self.ranks.groups()
        for host, cands in by_host.items():
            if not host or len(cands) < 2:
                continue
            ranks = [c.rank for c in cands]
            members = groups.members[int(groups.of_rank[ranks[0]])]
            if self.straggler.host_cost(ranks, members) >= self.cfg.straggler_material_share:
                out.update((c.rank, c.score) for c in cands)
        return out

    def _note_suspects(self, now: dict[int, float]) -> None:
        """Suspects: statistically slower than their peers but not (yet) material or
        lasting. Shown in the job's stats and counted, never an incident."""
        self.suspects_total += len(now.keys() - self.suspects.keys())
        self.suspects = now

    def _unproven(self, f: Finding, ranks: list[int]) -> bool:
        """Whether a new incident on ``ranks`` stays a suspect for now: its cause is only
        what is left (compute longer than the peers', with no GPU telemetry of the rank to
        look at), the rank waits for a CPU at least ``straggler_unproven_wait_share`` of
        its runnable time (the CPU is oversubscribed), its excess is below
        ``straggler_unproven_excess`` and its slowness has not lasted
        ``straggler_unproven_seconds``. An oversubscribed CPU inflates a rank's CPU time
        just as a compute fault would, for the few seconds of a neighbour's burst; a drain,
        which this cause leads to, costs too much for that."""
        if (
            not self._unproven_cause(f)
            or self.straggler.lasted_for(ranks) >= self.cfg.straggler_unproven_seconds
        ):
            return False
        self._unproven_now.update((r, self.straggler.score(r)) for r in ranks)
        return True

    def _unproven_cause(self, f: Finding) -> bool:
        """The cause of ``f`` is only what is left (no GPU telemetry), its rank waits for a
        CPU at least ``straggler_unproven_wait_share`` of its runnable time and its excess
        is below ``straggler_unproven_excess`` (see :meth:`_unproven`)."""
        cfg = self.cfg
        wait, ran = f.evidence.get("cpu_wait_s"), f.evidence.get("cpu_time_s")
        if f.attribution.evidence.get("gpu_telemetry") != "none" or wait is None or ran is None:
            return False
        return (f.score or 0.0) < cfg.straggler_unproven_excess and bool(
            waiting_share(wait, ran) >= cfg.straggler_unproven_wait_share
        )

    def _unproven_host(self, f: Finding, lasted_s: float) -> bool:
        """:meth:`_unproven` for a host found against its own history or the other hosts,
        found on every step since ``lasted_s`` ago (from the onset it was first found
        with); not a suspect entry."""
        return self._unproven_cause(f) and lasted_s < self.cfg.straggler_unproven_seconds

    def _lasted(self, host: str, ranks: list[int]) -> bool:
        """New incidents need their slowness to have lasted; a host's ranks count together."""
        if host and (T.STRAGGLER, None, f"host:{host}") in self.book.open:
            return True
        if host and len(ranks) == 1:
            ranks = [
                *ranks,
                *(
                    r
                    for r in self.ranks.ranks_on(host)
                    if r != ranks[0] and self.straggler.rising(r)
                ),
            ]
        return self.straggler.lasted(ranks)

    def _new_on_host(
        self, host: str, ranks: list[int], candidates: dict[int, float], cs: ClosedStep
    ) -> list[DetectionMessage]:
        key: Key = (T.STRAGGLER, None, f"host:{host}")
        if key in self.book.open:
            # absorbed by the host's incident, unless slowed another way: its own, linked
            way = self._host_way.get(host)
            other = [
                r for r in ranks if way is not None and self.straggler.way(r) not in (way, None)
            ]
            return [m for r in other for m in self._new_rank(host, r, candidates, cs)]
        if not host or len(ranks) < 2:
            return self._new_rank(host, ranks[0], candidates, cs)
        # ranks slowed in different ways are different faults: the first set of ranks
        # slowed alike is the host's incident, the others each a rank's (linked to it)
        alike = self._alike_sets(ranks)
        together = next((a for a in alike if len(a) >= 2), [])
        out = self._new_host(host, together, ranks, cs) if together else []
        for a in alike:
            if a is not together:
                out.extend(m for r in a for m in self._new_rank(host, r, candidates, cs))
        return out

    def _alike_sets(self, ranks: list[int]) -> list[list[int]]:
        """``ranks`` split into sets slowed alike (StragglerScores.alike), the slowest first."""
        out: list[list[int]] = []
        rest = list(ranks)
        while rest:
            alike = self.straggler.alike(rest)
            out.append(alike)
            rest = [r for r in rest if r not in alike]
        return out

    def _new_host(
        self, host: str, alike: list[int], candidates: list[int], cs: ClosedStep
    ) -> list[DetectionMessage]:
        """One host-level incident for ranks of ``host`` slowed alike, with the host's
        rising ranks (not yet candidates) slowed the same way."""
        way = self.straggler.way(max(alike, key=self.straggler.score))
        rising = [
            r for r in self.ranks.ranks_on(host) if r not in candidates and self.straggler.rising(r)
        ]
        slow = sorted([*alike, *self.straggler.alike(rising, way)] if rising else alike)
        f = self._host_finding(host, slow, cs)
        if self._unproven(f, slow):
            return []
        self._host_defer.pop(host, None)
        self._host_way[host] = way
        # a rank of this host already reported: the host incident continues that one
        f.related = next(iter(self._open_on_host(host)), "")
        return self._observe(f)

    def _new_rank(
        self, host: str, rank: int, candidates: dict[int, float], cs: ClosedStep
    ) -> list[DetectionMessage]:
        """One rank's straggler incident; deferred a few steps while another rank of its
        host is rising (one host incident, not two rank incidents, when it gets there)."""
        others = [r for r in self.ranks.ranks_on(host) if r not in candidates] if host else []
        if not self.book.is_open(T.STRAGGLER, rank) and any(
            self.straggler.rising(r) for r in others
        ):
            waited = self._host_defer.get(host, 0)
            if waited < HOST_DEFER_STEPS:
                self._host_defer[host] = waited + 1
                return []  # a second rank of the host is on its way: one incident
        if not self.book.hold((T.STRAGGLER, rank, ""), cs.end_max, candidates[rank]):
            return []
        f = self._straggler_finding(rank, candidates[rank], cs)
        if not self.book.is_open(T.STRAGGLER, rank):
            if self._unproven(f, [rank]):
                return []
            # another rank of this host already reported: the host's incident, one page
            f.related = next(iter(self._open_on_host(host, but=rank)), "")
        return self._observe(f)

    def _open_on_host(self, host: str, but: int | None = None) -> list[str]:
        """Ids of the open straggler incidents on ``host``: its host-level one first, then
        its ranks' (not ``but``'s)."""
        if not host:
            return []
        ids = [self.book.id_of(k) for k in self.book.keys(T.STRAGGLER) if k[2] == f"host:{host}"]
        return ids + [
            self.book.id_of(k)
            for k in self.book.keys(T.STRAGGLER)
            if k[1] is not None and k[1] != but and self.ranks.host[k[1]] == host
        ]

    def _host_holds(
        self, key: Key, candidates: dict[int, float], cs: ClosedStep
    ) -> list[DetectionMessage]:
        host = key[2].removeprefix("host:")
        way = self._host_way.get(host)
        # its ranks still slow the way it found them (a rank slowed another way is its
        # own incident: see _new_on_host)
        slow = [
            r
            for r in self.ranks.ranks_on(host)
            if (r in candidates or self.straggler.still_slow(r)[0])
            and (way is None or self.straggler.way(r) in (way, None))
        ]
        own = None if slow else self._host_evidence(host)
        if not slow and own is None:
            return self.book.clear(key, cs.end_max, cs.step)
        if self.book.hold(key, cs.end_max, own.score if own is not None else self._median(slow)):
            if own is not None:  # its evidence holds: slower than its own history
                ranks = self.ranks.ranks_on(host)
                if way is not None:  # not a rank slowed another way (its own incident)
                    ranks = [r for r in ranks if self.straggler.way(r) in (way, None)] or ranks
                return self._observe(self._host_finding(host, ranks, cs, own))
            return self._observe(self._host_finding(host, slow, cs))
        return []

    def _host_evidence(self, host: str) -> SlowHost | None:
        """A host incident's evidence beyond its peers: its own history, or the job's
        other hosts (the basis it last reported first); either one keeps it open."""
        cur = self.book.open.get((T.STRAGGLER, None, f"host:{host}"))
        first = str(cur.finding.evidence.get("basis_history", "own")) if cur else "own"
        history = self.host_history
        found = history.still_slow(host, first)
        return found or history.still_slow(host, "peers" if first == "own" else "own")

    def _half_host(self, cs: ClosedStep) -> list[DetectionMessage]:
        """A host that is half of its job (no majority of peers to stand out against),
        slower than its own history while the other hosts are not: one host incident."""
        step_s = self.slowdown_step_s()
        if not step_s:
            return []
        found = self.host_history.slow_host(step_s) or self.host_history.split_host(step_s)
        if found is None:
            self._held_hosts = {}
            return []
        key: Key = (T.STRAGGLER, None, f"host:{found.host}")
        if key in self.book.open or self._explained_elsewhere(found.host):
            return []
        if not self.book.hold(key, cs.end_max):
            return []
        ranks = self.ranks.ranks_on(found.host)
        f = self._host_finding(found.host, ranks, cs, found)
        # held back since (the onset it was first found with): see _unproven_host
        since = self._held_hosts.get(found.host, cs.end_max - (found.onset_back + 1) * step_s)
        self._held_hosts = {found.host: since}
        if self._unproven_host(f, cs.end_max - since):
            return []
        self._held_hosts = {}
        self._host_way[found.host] = None  # found on the host's own history: any way
        f.related = next(iter(self._open_on_host(found.host)), "")
        return self._observe(f)

    def _observe(self, f: Finding) -> list[DetectionMessage]:
        """Open or update; a new straggler that an open job slowdown already explains (same
        cause, or the host the slowdown names) belongs to that incident (``related``)."""
        cur = self.book.open.get(f.key)
        if cur is not None:
            f.related = cur.finding.related
            return self.book.observe(f)
        js = self.book.open.get((T.JOB_SLOWDOWN, None, ""))
        if (
            not f.related
            and js is not None
            and not js.finding.related
            and (
                js.finding.attribution.cause == f.attribution.cause
                or (js.finding.host and js.finding.host == f.host)
            )
        ):
            f.related = js.id
        return self.book.observe(f)

    # ------------------------------------------------------------------ findings
    def _onset(self, key: Key, ranks: list[int], cs: ClosedStep) -> tuple[int | None, float | None]:
        """(estimated first step, seconds since it began) of a new incident on ``ranks``:
        the CUSUM's change point, so that its cause is read from the fault's own steps and
        samples, not from the steps before it. (None, the window's span) otherwise."""
        est = None if key in self.book.open else self.straggler.onset(ranks)
        if est is None or math.isnan(est[1]):
            return None, self._onset_span()
        began = self.clocks.on_job_clock(self.ranks.host[ranks[0]], est[1])  # a rank's start
        return est[0], max(cs.end_max - began, MIN_CAUSE_SPAN_S)

    def _explained_elsewhere(self, host: str) -> bool:
        """A straggler incident or suspect on another host: the job waits for that one."""
        for key in self.book.keys(T.STRAGGLER):
            where = self.ranks.host[key[1]] if key[1] is not None else key[2].removeprefix("host:")
            if where != host:
                return True
        return any(self.ranks.host[r] != host for r in self.suspects)

    def _own_onset(
        self, key: Key, own: SlowHost, cs: ClosedStep
    ) -> tuple[int | None, float | None]:
        """(first step, seconds since) of a host found against its own history: the change
        point of its ratios to its baseline."""
        if key in self.book.open:
            return None, self._onset_span()
        cadence = self.slowdown_step_s() or 0.0
        return cs.step - own.onset_back, max((own.onset_back + 1) * cadence, MIN_CAUSE_SPAN_S)

    def _straggler_finding(self, rank: int, score: float, cs: ClosedStep) -> Finding:
        groups = self.ranks.groups()
        members = groups.members[int(groups.of_rank[rank])]
        key: Key = (T.STRAGGLER, rank, "")
        onset, span = self._onset(key, [rank], cs)
        ev = self.straggler.evidence(rank, members, onset)
        host, gpu, group = self.ranks.host[rank], self.ranks.gpu[rank], self.ranks.group[rank]
        found = shares(ev, self.straggler.longer_phases(rank))
        attr = self._attribution(
            key,
            cs.end_max,
            lambda: self.causes.for_rank(host, gpu, self.hosts, cs.end_max, found, span),
        )
        what = _what(ev)
        summary = (
            f"rank {rank} ({host} gpu {gpu}) has {score:.1%} more {what} than the "
            f"median of its {len(members)} peers in group {group!r}: {attr.reason}"
        )
        return Finding(
            T.STRAGGLER,
            score,
            cs.step,
            cs.end_max,
            summary,
            attr,
            rank,
            gpu,
            group,
            host,
            ev,
            onset_step=onset,
        )

    def _host_finding(
        self, host: str, slow: list[int], cs: ClosedStep, own: SlowHost | None = None
    ) -> Finding:
        groups = self.ranks.groups()
        scores = {r: self.straggler.score(r) for r in slow}
        lead = max(slow, key=lambda r: scores[r])
        key: Key = (T.STRAGGLER, None, f"host:{host}")
        members = groups.members[int(groups.of_rank[lead])]
        peers = None
        if own is None:
            onset, span = self._onset(key, slow, cs)
        else:  # its own history: the peers are the ranks off the host
            onset, span = self._own_onset(key, own, cs)
            peers = np.array([r for r in members.tolist() if r not in set(slow)], dtype=np.intp)
        ev = self.straggler.evidence(lead, members, onset, peers)
        # against its own history, what grew against that history (the group median moved)
        found = shares(ev, self.straggler.longer_phases(lead)) if own is None else own.shares
        gpus = [g for g in (self.ranks.gpu[r] for r in slow) if g is not None]
        attr = self._attribution(
            key,
            cs.end_max,
            lambda: self.causes.for_host(host, gpus, self.hosts, cs.end_max, found, span),
        )
        score = self._median(slow)
        on_host = len(self.ranks.ranks_on(host))
        if own is None:
            summary = (
                f"host {host}: {len(slow)} of its {on_host} ranks are stragglers (median "
                f"{score:.1%} more {_what(ev)} than their peers), one host-level "
                f"incident: {attr.reason}"
            )
        elif own.basis == "peers":
            score = own.score
            summary = (
                f"host {host}: its ranks' busy time is {own.score:.1%} above the job's "
                f"other hosts' ({own.current_s:.3f} s vs {own.baseline_s:.3f} s per step) "
                f"and they wait for it in collectives (the host is too large a part of "
                f"the job for its peers' median): {attr.reason}"
            )
        else:
            score = own.score
            summary = (
                f"host {host}: its ranks' busy time is {own.score:.1%} above their own "
                f"baseline ({own.current_s:.3f} s vs {own.baseline_s:.3f} s per step) "
                f"while the job's other hosts' is not (the host is too large a part of "
                f"the job for its peers' median): {attr.reason}"
            )
        groups_of = {self.ranks.group[r] for r in slow}
        hev: Evidence = {
            **ev,
            "scope": "host",
            "lead_rank": lead,
            "ranks_on_host": on_host,
            "affected_ranks": ",".join(map(str, slow)),
        }
        if own is not None:
            hev.update(
                basis_history=own.basis,
                own_baseline_s=round(own.baseline_s, 6),
                own_current_s=round(own.current_s, 6),
                own_threshold=round(own.threshold, 4),
            )
        return Finding(
            T.STRAGGLER,
            score,
            cs.step,
            cs.end_max,
            summary,
            attr,
            None,
            None,
            groups_of.pop() if len(groups_of) == 1 else "",
            host,
            hev,
            where=f"host:{host}",
            ranks=tuple(slow),
            onset_step=onset,
        )

    def _median(self, ranks: list[int]) -> float:
        """A host incident's score: the median (upper) of its ranks' scores."""
        scores = sorted(self.straggler.score(r) for r in ranks)
        return scores[len(scores) // 2]

    def straggler_incident(self) -> str:
        """The id of an open straggler incident (host-level first), "" when none."""
        keys = sorted(self.book.keys(T.STRAGGLER), key=lambda k: k[1] is not None)
        return self.book.id_of(keys[0]) if keys else ""


def _what(ev: Evidence) -> str:
    longer = ev.get("phases_longer")
    return f"{longer} time" if isinstance(longer, str) and longer else "busy time"


def shares(ev: Evidence, longer: dict[str, float]) -> Shares:
    """Shares of the rank's excess in the data phase, the compute phases and CPU wait."""
    if longer:
        total = sum(longer.values())
        if total > 0:
            data = longer.get("data", 0.0) / total
            compute = sum(longer.get(p, 0.0) for p in COMPUTE_PHASES) / total
            return Shares(data, compute, *_cpu_share(ev, total))
    return Shares(_share(ev, "data", "busy"), _share(ev, "compute", "busy"), *_cpu_share(ev, 0.0))


def _cpu_share(ev: Evidence, longer_total: float) -> tuple[float | None, Evidence]:
    """How much of the rank's excess its extra CPU run-queue wait explains.

    The extra wait is the rank's wait beyond what its own CPU time would have cost
    at its peers' waiting share (``wait / (cpu_time + wait)``): a rank that only
    computes more waits more in proportion on a busy machine, a contended one waits
    for a larger share. Without ``cpu_time`` the plain difference of waits is used.
    The excess in seconds is the larger of the busy-time excess and the longer
    phases' excess (under DDP the busy sums are equal while a phase is longer;
    ``longer_total`` is in units of the peers' median busy time). None when
    ``cpu_wait`` is not measured.
    """
    own, peers = _num(ev, "cpu_wait_s"), _num(ev, "cpu_wait_peer_median_s")
    busy, busy_peers = _num(ev, "busy_s"), _num(ev, "busy_peer_median_s")
    if own is None or peers is None or busy is None or busy_peers is None:
        return None, {}
    excess = max(busy - busy_peers, longer_total * busy_peers)
    if not excess > 0:
        return None, {}
    ran, ran_peers = _num(ev, "cpu_time_s"), _num(ev, "cpu_time_peer_median_s")
    if ran is None or ran_peers is None:
        ran = ran_peers = math.nan
    extra = extra_wait(own, ran, peers, ran_peers)
    return max(0.0, min(1.0, extra / excess)), {"cpu_wait_excess_s": round(extra, 6)}


def _num(ev: Evidence, key: str) -> float | None:
    value = ev.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        return None
    return float(value)


def _share(ev: Evidence, part: str, whole: str) -> float | None:
    """Share of the rank's excess over its peers that sits in phase ``part``."""
    try:
        num = ev[f"{part}_s"] - ev[f"{part}_peer_median_s"]  # type: ignore[operator]
        den = ev[f"{whole}_s"] - ev[f"{whole}_peer_median_s"]  # type: ignore[operator]
    except (KeyError, TypeError):
        return None
    if not isinstance(num, float) or not isinstance(den, float) or den <= 0 or math.isnan(num):
        return None
    return max(0.0, min(1.0, num / den))

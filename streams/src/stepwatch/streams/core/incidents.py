"""Discrete incidents of a job: user errors, fatal GPU errors, NIC link flaps.

User error vs system fault: a NaN/inf loss, an exception raised in user code,
or a job that ends with an error while none of its hosts shows a hardware
signal is a ``user_error`` (fault ``user``: notify, never drain). A fatal GPU
error (XID 79/48/95, double-bit ECC) on a rank's GPU opens ``rank_missing``
for that rank at once (cause ``hardware``, fault ``system``), without waiting
for the hang limit. A NIC link going down opens ``link_flap`` (cause
``network``); it resolves ``resolve_steps`` steps after the link is back.
"""

from __future__ import annotations

from stepwatch.contract import DetectionMessage, EventMessage, EventType
from stepwatch.streams.core.assembly import ClosedStep
from stepwatch.streams.core.causes import HARDWARE_XIDS, Attribution, CauseFinder, Evidence
from stepwatch.streams.core.config import DetectConfig
from stepwatch.streams.core.exits import (
    CLEAN,
    EXIT_SETTLE_SECONDS,
    LEAD_SECONDS,
    TOGETHER_JOB_S,
    ended_how,
    exit_words,
    failed_first,
    first_exits,
    is_peer_failure,
    killed_first,
)
from stepwatch.streams.core.hostclock import HostClocks
from stepwatch.streams.core.hostwindow import LinkIncident
from stepwatch.streams.core.kinds import Cause, DetectionType, Fault
from stepwatch.streams.core.lifecycle import DetectionBook, Finding
from stepwatch.streams.core.ranks import RankTable

T = DetectionType


class Incidents:
    """Mixin of :class:`stepwatch.streams.core.job.Job` (uses its book, ranks and causes)."""

    cfg: DetectConfig
    book: DetectionBook
    ranks: RankTable
    causes: CauseFinder
    clocks: HostClocks
    hosts: set[str]
    job_id: str
    world_size: int
    last_step: int
    newest_step: int
    ended_at: float | None
    finalised: bool
    links_down: set[str]
    end_arrived: float
    exits: dict[int, float]  # rank -> when its process ended, no job_end (its host's stamp)
    exit_how: dict[int, tuple[str, int]]  # rank -> how it ended (exits.ended_how)
    exits_due: float  # the engine's clock when the exits count as settled
    exits_seen: int  # exits when they were last looked at
    peer_failure: str  # the first exception that was a peer's failure ("" none)

    # ------------------------------------------------------------------ user errors
    def _nonfinite_loss(self, cs: ClosedStep) -> list[DetectionMessage]:
        rank = cs.nonfinite_ranks[0]
        summary = f"loss is NaN/inf at step {cs.step} on {len(cs.nonfinite_ranks)} rank(s)"
        attr = Attribution(
            Cause.USER, Fault.USER, "non-finite loss", {"nonfinite_ranks": len(cs.nonfinite_ranks)}
        )
        return self._user_error(rank, cs.step, cs.end_max, summary, attr)

    def _exception(self, ev: EventMessage) -> list[DetectionMessage]:
        if is_peer_failure(ev):  # a peer died (or the transport did): not this rank's code
            if not self.peer_failure:
                message = str(ev.attrs.get("message", ""))[:160]
                self.peer_failure = f"{ev.detail} on rank {ev.rank}: {message}".strip(" :")
            return []  # the rank that died is named once the exits settled (exits_due)
        if self.causes.has_hardware_signal([ev.host], self.clocks.on_job_clock(ev.host, ev.ts)):
            return []  # a hardware fault killed it: reported as a system fault
        attr = Attribution(
            Cause.USER, Fault.USER, "exception in user code", {"exception": ev.detail[:200]}
        )
        return self._user_error(ev.rank, self.last_step, ev.ts, f"exception: {ev.detail}", attr)

    def _job_end(self, ev: EventMessage) -> list[DetectionMessage]:
        """User error now; the rest resolves once the last steps are in (see Job.tick)."""
        # on the job's clock: the sender's may be off (a host a minute behind its peers
        # stamped the job's detections resolved a minute before the job ended)
        self.ended_at = self.clocks.on_job_clock(ev.host, ev.ts)
        detail = (ev.detail or "").lower()
        # interrupted (the SDK's Ctrl-C or SIGINT): stopped by someone, like a cancel
        failed = (bool(ev.code) or "error" in detail) and not detail.startswith("interrupted")
        if not failed or self.book.keys(T.USER_ERROR) or self.peer_failure:
            return []  # a peer's failure: the rank that died first is named (rank_exit)
        system = [o for o in self.book.open.values() if o.finding.attribution.fault == Fault.SYSTEM]
        if system or self.causes.has_hardware_signal(
            self.hosts, self.clocks.on_job_clock(ev.host, ev.ts)
        ):
            return []
        attr = Attribution(
            Cause.USER,
            Fault.USER,
            "job failed without a hardware signal",
            {"exit_code": ev.code, "detail": ev.detail[:200]},
        )
        return self._user_error(
            ev.rank, self.last_step, ev.ts, f"job ended with error {ev.code}", attr
        )

    def _user_error(
        self, rank: int | None, step: int, ts: float, summary: str, attr: Attribution
    ) -> list[DetectionMessage]:
        if self.book.keys(T.USER_ERROR):
            return []  # one user error per job
        host = self.ranks.host[rank] if rank is not None and 0 <= rank < self.world_size else ""
        return self.book.observe(
            Finding(T.USER_ERROR, None, step, ts, summary, attr, rank, None, "", host)
        )

    def _rank_missing(
        self,
        rank: int,
        gpu: int | None,
        host: str,
        step: int,
        ts: float,
        summary: str,
        attr: Attribution,
        evidence: Evidence,
    ) -> list[DetectionMessage]:
        """Open (or update) ``rank_missing`` for ``rank``: one shape for every way a rank
        is found gone (absent, hung, a fatal GPU error, its process ended)."""
        return self.book.observe(
            Finding(T.RANK_MISSING, None, step, ts, summary, attr, rank, gpu, "", host, evidence)
        )

    # ------------------------------------------------------------------ dead ranks
    def _rank_exit(self, ev: EventMessage, arrived: float) -> list[DetectionMessage]:
        """The node agent saw a rank's process end without a job_end (see exits.py). Once
        every rank's did, the job has ended: a job cancelled or out of time sends no
        job_end, and was called hung a minute later (``JobHang``: requeue)."""
        rank = ev.rank
        if self.finalised or rank is None or not 0 <= rank < self.world_size:
            return []
        if self.ranks.host[rank] != ev.host or rank in self.exits:
            return []  # an agent speaks only for its own host's ranks
        if self.ended_at is not None and self.clocks.on_job_clock(ev.host, ev.ts) > self.ended_at:
            return []  # ended after the job did: its launcher stopping it
        if not self.exits:
            self.exits_due = arrived + EXIT_SETTLE_SECONDS
        self.exits[rank] = ev.ts
        self.exit_how[rank] = ended_how(ev)
        if len(self.exits) == self.world_size and self.ended_at is None:
            self.ended_at, self.end_arrived = max(self.exit_times().values()), arrived
        return []

    def exit_times(self, ordered: bool = False) -> dict[int, float]:
        """The exits on the job's clock, or (``ordered``) with each host's offset from its
        peers taken out however small, to tell which came first (HostClocks.in_order)."""
        clock = self.clocks.in_order if ordered else self.clocks.on_job_clock
        return {r: clock(self.ranks.host[r], t) for r, t in self.exits.items()}

    def _exits_settled(self, now: float) -> list[DetectionMessage]:
        """At a tick: once the exits had time to arrive from every host, the ranks that
        exited first are ``rank_missing`` if a peer failed or every other host's ranks
        outlived them (at most once per new exit)."""
        if now < self.exits_due or len(self.exits) == self.exits_seen:
            return []
        self.exits_seen = len(self.exits)
        return self._exited_missing()

    def _exit_story(self, first: list[int]) -> tuple[str, Evidence]:
        """Why the ranks that exited first died rather than were stopped ("" if nothing
        says so): a peer failed after them, or (every rank has ended, one first) each
        rank on another host ended at least LEAD_SECONDS after it. Never when every rank
        ended within TOGETHER_JOB_S: a cancel or a time limit stops every host at once
        (a peer's error races its own end); a crash leaves the other hosts to notice.
        (Before this, ``_exited_missing`` takes the kernel's word: ``killed_first``.)"""
        order = self.exit_times(ordered=True)
        if len(order) == self.world_size and max(order.values()) - min(order.values()) <= (
            TOGETHER_JOB_S
        ):
            return "", {}  # stopped whole: a peer's error raced its own end
        if self.peer_failure:
            return f"and its peers then failed: {self.peer_failure}", {
                "peer_failure": self.peer_failure
            }
        if len(order) < self.world_size or len(first) != 1:
            return "", {}  # a host's ranks ending together first: a finish, not a crash
        if self.exit_how.get(first[0], ("", 0))[0] == CLEAN:
            return "", {}  # it exited with code 0: it finished first (os._exit at the end)
        host = self.ranks.host[first[0]]
        later = [t for r, t in order.items() if self.ranks.host[r] != host]
        lead = min(later, default=0.0) - order[first[0]]
        if not later or lead < LEAD_SECONDS:
            return "", {}
        return f"{lead:.1f} s before any rank on another host", {"lead_s": round(lead, 3)}

    def _exited_missing(self) -> list[DetectionMessage]:
        """``rank_missing`` for the ranks that exited first, when ``_exit_story`` says they
        died. Nothing while a user error explains the end, nor when most of the job ended
        together (a job cancelled or out of time: its peers' errors race their own end)."""
        first = first_exits(self.exit_times(ordered=True), self.ranks.host)
        if self.book.keys(T.USER_ERROR):
            return []
        killed = killed_first(first, self.exit_how)
        failed = [] if killed else failed_first(first, self.exit_how)
        told: Evidence
        if killed:  # the kernel's word: those were killed, the rest stopped after them
            why, told = "and the ranks that ended after it were stopped or failed", {}
            first = killed
        elif failed:  # it exited with an error, and its launcher stopped the rest
            why, told = "and the ranks that ended after it were stopped", {}
            first = failed
        elif len(first) > self.world_size // 2:
            return []
        else:
            why, told = self._exit_story(first)
        if not why:
            return []
        out: list[DetectionMessage] = []
        times = self.exit_times()
        for rank in first[: self.cfg.max_named_ranks]:
            if self.book.is_open(T.RANK_MISSING, rank):
                continue
            host, gpu, t = self.ranks.host[rank], self.ranks.gpu[rank], times[rank]
            attr = self._exit_attribution(host, gpu, rank, t)
            last = int(self.ranks.last_step[rank])
            summary = (
                f"rank {rank} ({host} gpu {gpu}) ended without a job_end after step {last}, "
                f"{why}; {attr.reason}"
            )
            _, status = exit_words(self.exit_how.get(rank))
            evidence: Evidence = {"how": "exited", "last_step": last, **told, **status}
            out.extend(self._rank_missing(rank, gpu, host, last + 1, t, summary, attr, evidence))
        return out

    def _exit_attribution(self, host: str, gpu: int | None, rank: int, t: float) -> Attribution:
        """Why a rank's process ended: a hardware, GPU or link signal on its host then,
        else the exit itself (cause unknown: killed, crashed, out of host memory)."""
        attr = self.causes.for_stop(host, gpu, rank, t, job_id=self.job_id)
        if attr.cause != Cause.UNKNOWN:
            return attr
        words, status = exit_words(self.exit_how.get(rank))
        return Attribution(
            Cause.UNKNOWN,
            Fault.UNKNOWN,
            f"its process {words}, without the SDK's job_end"
            if words
            else "its process ended without the SDK's job_end (killed or crashed)",
            {"how": "exited", **status},
        )

    # ------------------------------------------------------------------ system faults
    def on_hardware(self, ev: EventMessage) -> list[DetectionMessage]:
        """A fatal GPU error on one of the job's GPUs: that rank is gone."""
        if self.ended_at is not None:
            return []
        if ev.type == EventType.XID and ev.code not in HARDWARE_XIDS:
            return []
        rank = ev.rank if ev.rank is not None and 0 <= ev.rank < self.world_size else None
        if rank is not None and self.ranks.host[rank] not in ("", ev.host):
            rank = None  # another host's rank: an event speaks only for its host's GPUs
        if rank is None:
            on_host = [r for r in self.ranks.ranks_on(ev.host) if self.ranks.gpu[r] == ev.gpu]
            rank = on_host[0] if on_host else None
        if rank is None:
            return []
        what = f"XID {ev.code}" if ev.type == EventType.XID else "double-bit ECC error"
        attr = Attribution(
            Cause.HARDWARE, Fault.SYSTEM, what, {"hardware": what, "detail": ev.detail[:200]}
        )
        summary = (
            f"rank {rank} ({ev.host} gpu {ev.gpu}) lost its GPU: {what}; the job will "
            f"hang in its next collective"
        )
        return self._rank_missing(
            rank,
            ev.gpu,
            ev.host,
            self.newest_step + 1,
            self.clocks.on_job_clock(ev.host, ev.ts),  # the host's clock may be off
            summary,
            attr,
            {"how": "fatal_gpu_error", "last_step": self.newest_step},
        )

    def on_link(self, inc: LinkIncident) -> list[DetectionMessage]:
        """A link of one of the job's hosts went down (open) or came back (start clearing)."""
        where = f"{inc.host}/{inc.device}"
        if not inc.down:
            self.links_down.discard(where)
            return []
        if self.ended_at is not None:
            return []
        self.links_down.add(where)
        if self.book.is_open(T.LINK_FLAP, None, where):
            return []
        ranks = self.ranks.ranks_on(inc.host)
        attr = Attribution(
            Cause.NETWORK,
            Fault.SYSTEM,
            f"link down on {inc.device}",
            {"device": inc.device, "port": inc.port, "how": inc.how},
        )
        summary = (
            f"NIC {inc.device} port {inc.port} on {inc.host} went down ({inc.how}); "
            f"{len(ranks)} rank(s) of the job run there"
        )
        return self.book.observe(
            Finding(
                T.LINK_FLAP,
                None,
                self.newest_step + 1,
                self.clocks.on_job_clock(inc.host, inc.ts),  # the host's clock may be off
                summary,
                attr,
                None,
                None,
                "",
                inc.host,
                {"ranks_on_host": len(ranks)},
                where=where,
                # the NIC and the job's ranks on its host, in the detection's own fields (they
                # were in its summary and evidence only: a query by device found nothing)
                device=inc.device,
                port=inc.port,
                ranks=tuple(int(r) for r in ranks),
            )
        )

    def _links_clear(self, cs: ClosedStep) -> list[DetectionMessage]:
        out: list[DetectionMessage] = []
        for key in self.book.keys(T.LINK_FLAP):
            if key[2] not in self.links_down:
                out.extend(self.book.clear(key, cs.end_max, cs.step))
        return out

"""One job's state: assembler, trackers, detections; fed by the engine."""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable

import numpy as np

from stepwatch.contract import DetectionMessage, EventMessage, EventType, StepRecord
from stepwatch.contract.goodput import MFU_UNKNOWN
from stepwatch.streams.core.api import JobStats
from stepwatch.streams.core.assembly import BUSY, DUR, ClosedStep, Rewind, StepAssembler
from stepwatch.streams.core.causes import Attribution, CauseFinder, Evidence
from stepwatch.streams.core.config import DetectConfig
from stepwatch.streams.core.exits import first_exits
from stepwatch.streams.core.hang import allowed_pause, check_hang, checkpoint_seconds
from stepwatch.streams.core.hostclock import HostClocks, ShiftedWindows
from stepwatch.streams.core.hosthistory import HostHistory
from stepwatch.streams.core.incidents import Incidents
from stepwatch.streams.core.kinds import Cause, DetectionType
from stepwatch.streams.core.lifecycle import DetectionBook, Finding, Key
from stepwatch.streams.core.moves import Moves
from stepwatch.streams.core.netwatch import NetworkWatch
from stepwatch.streams.core.ranks import RankTable
from stepwatch.streams.core.ring import Ring
from stepwatch.streams.core.slowdown import Slowdown, SlowdownTracker
from stepwatch.streams.core.straggler_incidents import Stragglers
from stepwatch.streams.core.straggler_scores import StragglerTracker
from stepwatch.streams.core.throughput import Throughput

log = logging.getLogger(__name__)
T = DetectionType
LAG_MESSAGES = 16  # step messages whose arrival lag sets the job's clock (Job.local)
STOP_MARGIN_SECONDS = 10.0  # look this far before the last progress for why a rank stopped


class Job(Incidents, Stragglers, NetworkWatch):
    def __init__(
        self, job_id: str, world_size: int, cfg: DetectConfig, causes: CauseFinder
    ) -> None:
        self.job_id = job_id
        self.world_size = world_size
        self.cfg = cfg
        self.clocks = HostClocks()  # hosts whose clocks are off: their samples read shifted
        self.causes = CauseFinder(cfg, ShiftedWindows(causes.windows, self.clocks))
        self.assembler = StepAssembler(
            world_size, cfg.assembly_deadline_seconds, cfg.max_pending_steps
        )
        self.ranks = RankTable(world_size)
        self.straggler = StragglerTracker(world_size, cfg)
        self.slowdown = SlowdownTracker(cfg)
        self.host_history = HostHistory(cfg)
        self.throughput = Throughput(cfg.throughput_steps)
        self.book = DetectionBook(job_id, cfg)
        self.missing_run = np.zeros(world_size, dtype=np.int32)  # consecutive closed steps absent
        self.last_progress = 0.0
        self.last_seen = 0.0
        self.last_step = -1  # the last step closed (analysed)
        self.newest_step = -1  # the furthest step any rank reported
        self.warm = 0
        self._warmup = cfg.warmup_steps  # steps not scored from the start (or a restart)
        self.hung_since: float | None = None
        self.longest_pause = 0.0  # seconds a step took beyond the cadence, at most (hang limit)
        self.checkpoint_began = 0.0  # host time of the latest checkpoint_begin (hang limit)
        self.ended_at: float | None = None
        self.end_arrived = 0.0  # the engine's clock when job_end came
        self.finalised = False  # job ended and its detections resolved: no new ones
        self.hosts: set[str] = set()
        self.links_down: set[str] = set()
        self._attr_cache: dict[Key, tuple[float, Attribution]] = {}
        self._host_defer: dict[str, int] = {}  # host -> steps a rank-level opening waited
        self._host_way: dict[str, str | None] = {}  # host -> how its host incident's ranks are slow
        self._slowdown_defer = 0  # steps a job_slowdown waited for its straggler incident
        self.suspects: dict[int, float] = {}
        self._net_next = 0.0  # event time of the next check of the job's ports
        self._net_since: dict[str, float] = {}  # net:<host> -> suspect since
        self.step_ends = Ring(2 * cfg.baseline_steps, 2)  # (step, end time) of recent steps
        self.moves = Moves()  # ranks that report from another host (streams.core.moves)
        self._settling = False  # restarted, its first step not closed yet: moves expected
        self.suspects_total = 0
        self._unproven_now: dict[int, float] = {}  # see Stragglers._unproven
        self._held_hosts: dict[str, float] = {}  # see Stragglers._half_host
        # arrival minus host timestamp of the recent step messages (see ``local``)
        self._lags: deque[float] = deque(maxlen=LAG_MESSAGES)
        self._steps_arrived = 0.0  # the engine's clock when step records last made progress
        self.exits: dict[int, float] = {}  # rank -> its process ended, no job_end (exits.py)
        self.exit_how: dict[int, tuple[str, int]] = {}  # rank -> exits.ended_how
        self.exits_due = 0.0  # the engine's clock when the exits count as in
        self.exits_seen = 0
        self.peer_failure = ""  # the first exception that was a peer's failure

    # ------------------------------------------------------------------ input
    def add_records(
        self, records: list[StepRecord], ts: float, arrived: float | None = None
    ) -> list[DetectionMessage]:
        """Records of one message stamped ``ts`` by its host; ``arrived``: the engine's
        clock when it came (None: ``ts``)."""
        self.last_seen = max(self.last_seen, ts)
        arrived = ts if arrived is None else arrived
        self._lags.append(arrived - ts)
        if self.finalised:
            self.assembler.late += len(records)
            return []
        new_hosts = self.ranks.observe(records)
        if new_hosts:
            self.hosts.update(new_hosts)
            self.throughput.peak_flops_total = None  # placement changed: recompute the peak
        out: list[DetectionMessage] = []
        if self.ranks.moved:
            self._ranks_moved(records)
        step = max([r.step for r in records])
        if step > self.newest_step:
            self.newest_step = step
        closed = self.assembler.add(records, arrived)
        if self.assembler.rewinds:
            out.extend(self._on_rewinds())
        # progress: records taken into a step (not a late one, nor one held for a restart
        # that half the job has not confirmed: one forged record resolved a real hang)
        newest = self.assembler.newest_end
        if newest > self.last_progress:
            if self.hung_since is not None:
                out.extend(self._progress_resumed(newest))
            self.last_progress = newest
            # only progress counts as the job still reporting: copies of reported steps
            # sent every second kept a hung job from being called hung
            self._steps_arrived = arrived
        for cs in closed:
            out.extend(self._analyse(cs))
        return out

    def on_event(self, ev: EventMessage, arrived: float | None = None) -> list[DetectionMessage]:
        """An event of this job; ``arrived``: the engine's clock when it came (None: its
        ``ts``). The end waits for the last steps from its arrival (see ``tick``)."""
        self.last_seen = max(self.last_seen, ev.ts)
        if ev.type == EventType.JOB_START:
            self.throughput.on_job_start(ev.host, ev.ts)
        elif ev.type == EventType.CHECKPOINT_BEGIN:
            self.checkpoint_began = max(self.checkpoint_began, ev.ts)
        elif ev.type == EventType.CHECKPOINT_SAVE:
            seconds = checkpoint_seconds(ev.attrs)
            if seconds is not None and seconds > self.longest_pause:
                self.longest_pause = seconds
        elif ev.type == EventType.JOB_END:
            self.end_arrived = ev.ts if arrived is None else arrived
            return self._job_end(ev)
        elif ev.type == EventType.EXCEPTION:
            return self._exception(ev)
        elif ev.type == EventType.RANK_EXIT:
            return self._rank_exit(ev, ev.ts if arrived is None else arrived)
        return []

    def local(self, now: float) -> float:
        """The engine's clock ``now`` on this job's hosts' clock: minus the smallest of
        the recent step messages' arrival lags (arrival minus the host's ``ts``), i.e.
        the lag of a message that came without delay. Replay (event time): 0. Live: the
        hosts' clock offset from the worker's, plus the least transport delay; while a
        backlog is read, the backlog's age, so its steps are not called hung."""
        return now - min(self._lags) if self._lags else now

    def tick(self, now: float) -> list[DetectionMessage]:
        """Time passes: ``now`` is the engine's clock (steps' deadlines count from their
        records' arrival on it); hangs and the end are judged on the job's own clock."""
        if self.finalised:
            return []
        closed = self.assembler.expire(now)
        local = self.local(now)
        out: list[DetectionMessage] = []
        for cs in closed:
            out.extend(self._analyse(cs))
        if self.exits:
            out.extend(self._exits_settled(now))
        if (  # the last steps' records had the deadline after the end came, on one clock
            self.ended_at is not None
            and now >= self.end_arrived + self.cfg.assembly_deadline_seconds
        ):
            # stamped when the job ended (its job_end), not at this tick: a replay's next
            # message 10 minutes later resolved the job's detections 10 minutes late
            if self.exits:  # the dead rank, before the end closes everything
                out.extend(self._exited_missing())
            return out + self._finalise(min(local, self.ended_at))
        if self.ended_at is None and self.hung_since is None:
            # silent no longer than step records stopped making progress (engine's clock): a
            # message stamped ahead (the gate admits up to 5 minutes) moves ``local``, and
            # must not make a job that still reports hung
            out.extend(self._check_hang(min(local, self.last_progress + now - self._steps_arrived)))
        return out

    # ------------------------------------------------------------------ per step
    def _analyse(self, cs: ClosedStep) -> list[DetectionMessage]:
        self.moves.burst.clear()
        self._settling = False
        out_moves = self._settle_moves(cs.step, cs.end_max) if self.moves.candidates else []
        present = np.flatnonzero(cs.present)
        self.ranks.note_progress(present, cs.step, cs.end[present])
        if self.clocks.update(cs.start, cs.end, self.ranks.host_index()) and (
            self.throughput.start_events
        ):
            self.throughput.settle(self.clocks.on_median_clock, self.clocks.knows)
        self.last_step = cs.step
        self.step_ends.push(np.array((cs.step, cs.end_max)))
        sd = self.slowdown
        self.throughput.on_step(
            cs, None if sd.baseline is None else (sd.baseline, sd.baseline_data)
        )
        cadence = self.slowdown.cadence
        if cadence is not None and cs.med[DUR] > 2 * cadence:  # a pause, not noise
            self.longest_pause = max(self.longest_pause, float(cs.med[DUR] - cadence))
        out = out_moves
        if cs.nonfinite_ranks:
            out.extend(self._nonfinite_loss(cs))
        out.extend(self._missing(cs))
        if self.book.open:
            out.extend(self._links_clear(cs))
        self.warm += 1
        if self.warm <= self._warmup or self.finalised:
            return out
        groups = self.ranks.groups()
        self.straggler.update(cs, groups)
        busy, hosts = self.straggler.steps.last(1)[0][BUSY], self.ranks.host_index()
        self.slowdown.update(cs, groups, busy, hosts)
        self.host_history.update(cs, busy, hosts, groups)
        out.extend(self._stragglers(cs))
        out.extend(self._half_host(cs))
        out.extend(self._network(self.causes.windows, cs.end_max, cs.step))
        out.extend(self._job_slowdown(cs))
        return out

    def _job_slowdown(self, cs: ClosedStep) -> list[DetectionMessage]:
        groups = self.ranks.groups()
        key: Key = (T.JOB_SLOWDOWN, None, "")
        is_open = self.book.is_open(*key)
        sd = self.slowdown.still_slow(groups) if is_open else self.slowdown.candidate(groups)
        if sd is None:
            return self.book.clear(key, cs.end_max, cs.step) if is_open else []
        related = ""
        if not is_open:
            if not sd.group and self.straggler.suspicious() and _waits(sd):
                return []  # the job waits longer, for a straggler that is reported as such
            related = self.straggler_incident()
            if (
                not related
                and self.straggler.any_rising()
                and (self._slowdown_defer < self.cfg.window_steps)
            ):
                self._slowdown_defer += 1
                return []  # a straggler incident is on its way: link to it, not a second one
        elif is_open:
            related = self.book.open[key].finding.related
        self._slowdown_defer = 0
        if not self.book.hold(key, cs.end_max, sd.score):
            return []
        attr = self._attribution(
            key,
            cs.end_max,
            lambda: self.causes.for_job(
                self.hosts,
                cs.end_max,
                sd.deltas,
                self._onset_span(),
                sd.cpu,
                sd.cpu_host,
                sd.score * sd.baseline_s,
            ),
        )
        if not is_open and not related and attr.cause == Cause.NETWORK:
            suspect = attr.evidence.get("suspect_host")
            related = self.network_incident(suspect if isinstance(suspect, str) else "")
        where = f"group {sd.group!r}" if sd.group else "the job"
        what = "busy time" if sd.group else "straggler-free step time"
        part = f" (part of incident {related})" if related else ""
        summary = (
            f"{where} is {sd.score:.1%} slower than its own baseline ({what} "
            f"{sd.current_s:.3f} s vs {sd.baseline_s:.3f} s per step){part}: "
            f"{attr.reason}"
        )
        ev: Evidence = {
            "baseline_step_s": round(sd.baseline_s, 6),
            "current_step_s": round(sd.current_s, 6),
            "threshold": round(sd.threshold, 4),
            **{f"delta_{k}_s": v for k, v in sd.deltas.items()},
        }
        host = attr.evidence.get("suspect_host")
        device = attr.evidence.get("device")
        port = attr.evidence.get("port")
        f = Finding(
            T.JOB_SLOWDOWN,
            sd.score,
            cs.step,
            cs.end_max,
            summary,
            attr,
            group=sd.group,
            host=host if isinstance(host, str) else "",
            evidence=ev,
            device=device if isinstance(device, str) else None,
            port=port if isinstance(port, int) else None,
            related=related,
            onset_step=None if is_open else cs.step - self.slowdown.onset_back(),
        )
        return self.book.observe(f)

    def _missing(self, cs: ClosedStep) -> list[DetectionMessage]:
        """A rank absent from several closed steps while its peers progress."""
        self.missing_run = np.where(cs.present, 0, self.missing_run + 1)
        out: list[DetectionMessage] = []
        for key in self.book.keys(T.RANK_MISSING):
            rank, opened = key[1], self.book.opened_at(key)
            if rank is not None and cs.present[rank] and cs.start[rank] > (opened or 0.0):
                out.extend(self.book.resolve(key, cs.end_max, cs.step, "rank reports again"))
        if cs.complete:
            return out
        lost = np.flatnonzero(self.missing_run >= self.cfg.rank_missing_steps)
        if len(lost) > self.world_size // 2:
            return out
        for rank in lost.tolist()[: self.cfg.max_named_ranks]:
            if self.book.is_open(T.RANK_MISSING, rank):
                continue
            host, gpu = self.ranks.host[rank], self.ranks.gpu[rank]
            attr = self.causes.for_stop(host, gpu, rank, cs.end_max, job_id=self.job_id)
            summary = (
                f"rank {rank} ({host}) sent no step records for {self.missing_run[rank]} "
                f"steps while its peers progress: {attr.reason}"
            )
            ev: Evidence = {"absent_steps": int(self.missing_run[rank]), "how": "absent"}
            out.extend(self._rank_missing(rank, gpu, host, cs.step, cs.end_max, summary, attr, ev))
        return out

    # ------------------------------------------------------------------ hangs
    def _check_hang(self, now: float) -> list[DetectionMessage]:
        pause = allowed_pause(
            self.cfg, self.longest_pause, self.checkpoint_began, self.last_progress
        )
        v = check_hang(
            self.cfg,
            now,
            self.last_progress,
            self.slowdown.cadence,
            pause,
            self.ranks,
            self.causes.windows,
            # the first to end, while most ranks still run (most ended: they finished)
            tuple(first_exits(self.exit_times(ordered=True), self.ranks.host))
            if 0 < len(self.exits) <= self.world_size // 2
            else (),
        )
        if v is None:
            return []
        self.hung_since = self.last_progress
        ev: Evidence = {
            "silent_s": round(v.silent_s, 3),
            "limit_s": round(v.limit_s, 3),
            "longest_pause_s": round(min(pause, self.cfg.hang_max_pause_seconds), 3),
            "last_step": v.last_step,
            "how": v.how,
        }
        out: list[DetectionMessage] = []
        for rank in v.named[: self.cfg.max_named_ranks]:
            if self.book.is_open(T.RANK_MISSING, rank):
                continue  # already reported (a fatal GPU error, or absent from steps)
            host, gpu = self.ranks.host[rank], self.ranks.gpu[rank]
            if v.how == "exited":
                attr = self._exit_attribution(host, gpu, rank, self.exit_times()[rank])
            else:
                span = v.silent_s + STOP_MARGIN_SECONDS
                attr = self.causes.for_stop(host, gpu, rank, now, span, job_id=self.job_id)
            last = int(self.ranks.last_step[rank])
            summary = (
                f"job hung {v.silent_s:.0f} s: rank {rank} ({host} gpu {gpu}) stopped at "
                f"step {last} while its peers wait in a collective: {attr.reason}"
            )
            told: Evidence = {**ev, "rank_last_step": last, "named_ranks": len(v.named)}
            out.extend(self._rank_missing(rank, gpu, host, v.last_step, now, summary, attr, told))
        if not v.named:
            attr = self.causes.for_stop("", None, None, now, job_id=self.job_id)
            summary = (
                f"job hung: no step progress for {v.silent_s:.0f} s "
                f"(limit {v.limit_s:.0f} s) after step {v.last_step}"
            )
            out.extend(
                self.book.observe(
                    Finding(T.HANG, v.silent_s, v.last_step, now, summary, attr, evidence=ev)
                )
            )
        return out

    def _progress_resumed(self, ts: float) -> list[DetectionMessage]:
        assert self.hung_since is not None
        self.throughput.on_hang_end(ts - self.hung_since)
        self.hung_since = None
        out: list[DetectionMessage] = []
        for type_ in (T.HANG, T.RANK_MISSING):
            for key in self.book.keys(type_):
                out.extend(self.book.resolve(key, ts, None, "progress resumed"))
        return out

    def _on_rewinds(self) -> list[DetectionMessage]:
        # the old run's dead rank, before its exits are forgotten (a restart 2 s later
        # came before the exits settled, and hid it)
        out: list[DetectionMessage] = self._exited_missing() if self.exits else []
        for rw in self.assembler.rewinds:
            log.info(
                "job rewound job_id=%s from_step=%s to_step=%s",
                self.job_id,
                rw.from_step,
                rw.to_step,
            )
            self.throughput.on_rewind(rw, self.slowdown.cadence, self.cfg.restart_warmup_steps)
            if self.hung_since is not None:
                self.hung_since = None
                restarted_at = self._restart_time(rw)
                for type_ in (T.HANG, T.RANK_MISSING):
                    for key in self.book.keys(type_):
                        out.extend(self.book.resolve(key, restarted_at, rw.to_step, "restarted"))
            out.extend(self._restarted(rw))
        self.assembler.rewinds.clear()
        self.moves.clear()
        self._settling = True
        self.warm = 0
        self._warmup = self.cfg.restart_warmup_steps
        self.straggler.reset()
        self.slowdown.on_restart()
        self.host_history.on_restart()
        self.ranks.last_step[:] = -1  # "behind" compares steps of this run only
        self.exits.clear()  # the old run's processes
        self.exit_how.clear()
        self.exits_seen = 0
        self.peer_failure = ""
        self.newest_step = self.assembler.last_closed + 1
        return out

    def _ranks_moved(self, records: list[StepRecord]) -> None:
        """Ranks now reporting from another host than before (stepwatch.streams.core.moves):
        half the job or more since the last closed step, after a gap, is a restart on a
        new allocation (a requeue that resumed right after its checkpoint, so that no
        step number went back): handled as a rewind. Other moves wait for evidence
        (:meth:`_settle_moves`)."""
        moved, self.ranks.moved = self.ranks.moved, []
        last = self.assembler.last_closed
        step = min(r.step for r in records)
        if self._settling or step <= last:
            return  # a restart being handled, or a step going back (the assembler's)
        self.moves.note(moved, self.ranks.host, step)
        if 2 * len(self.moves.burst) < self.ranks.world_size or last < 0:
            return
        gap = min(r.start for r in records) - self.assembler.last_closed_end
        if gap >= self.moves.restart_gap(self.slowdown.cadence):
            began = min(r.start for r in records)
            self.assembler.rewinds.append(Rewind(last, max(last + 1, step), gap, began))
            self.moves.clear()  # handled with the assembler's rewinds (_on_rewinds)

    def _settle_moves(self, step: int, ts: float) -> list[DetectionMessage]:
        """Ranks that reported from their new host long enough: their stragglers resolve,
        never carried over to the new host, and their straggler state starts afresh."""
        settled = self.moves.settled(self.ranks.host, step)
        out: list[DetectionMessage] = []
        for rank, before in settled:
            why = f"rank {rank} moved from {before} to {self.ranks.host[rank]}"
            for key in self.book.keys(T.STRAGGLER):
                gone = key[2].removeprefix("host:") if key[1] is None else None
                if key[1] == rank or (gone == before and not self.ranks.ranks_on(before)):
                    out.extend(self.book.resolve(key, ts, self.last_step, why))
        if settled:
            self.straggler.forget(np.array([rank for rank, _ in settled]))
        return out

    def _restarted(self, rw: Rewind) -> list[DetectionMessage]:
        """A restart from a checkpoint is a new run: its ranks may sit on other hosts, so the
        run's stragglers and slowdowns are resolved; a fault that persists opens again once
        the new run has warmed up."""
        out: list[DetectionMessage] = []
        at = self._restart_time(rw)
        for type_ in (T.STRAGGLER, T.JOB_SLOWDOWN):
            for key in self.book.keys(type_):
                out.extend(
                    self.book.resolve(key, at, rw.to_step, "job restarted from a checkpoint")
                )
        return out

    def _restart_time(self, rw: Rewind) -> float:
        """When the new run began: its ranks' first starts. Before, the old run's newest
        end plus the gap from its last *closed* step, which counted the old run's
        unclosed tail twice: a detection resolved by the restart was stamped after the
        new run's steps (14 s after its alert resolved, in the demo)."""
        if rw.started_at is not None:
            return rw.started_at
        return self.last_progress + max(rw.gap_seconds, 0.0)

    def _finalise(self, now: float) -> list[DetectionMessage]:
        """After job_end plus the assembly deadline: close the last steps, resolve."""
        out: list[DetectionMessage] = []
        for cs in self.assembler.expire(float("inf")):
            out.extend(self._analyse(cs))
        self.finalised = True
        for key in list(self.book.open):
            if key[0] != T.USER_ERROR:
                out.extend(self.book.resolve(key, now, self.last_step, "job ended"))
        return out

    # ------------------------------------------------------------------ helpers
    def slowdown_step_s(self) -> float | None:
        """The job's typical step time (its baseline, else the recent median)."""
        return self.slowdown.cadence

    def _onset_span(self) -> float | None:
        """Seconds covered by the persistence window: where a fresh detection's symptoms are."""
        cadence = self.slowdown.cadence
        return None if cadence is None else self.cfg.window_steps * cadence

    def step_at(self, ts: float) -> int | None:
        """The first recent step that ended at or after event time ``ts``."""
        rows = self.step_ends.filled()
        later = rows[rows[:, 1] >= ts]
        return int(later[:, 0].min()) if len(later) else None

    def _attribution(self, key: Key, ts: float, compute: Callable[[], Attribution]) -> Attribution:
        cached = self._attr_cache.get(key)
        opened = self.book.opened_at(key)
        young = opened is None or ts - opened < self.cfg.update_min_seconds
        ttl = self.cfg.cause_refresh_seconds if young else self.cfg.update_min_seconds
        if cached is not None and ts - cached[0] < ttl:
            return cached[1]
        attr = compute()
        if (
            cached is not None
            and key in self.book.open
            and (attr.cause == Cause.UNKNOWN and cached[1].cause != Cause.UNKNOWN)
        ):
            # the evidence of an open detection does not fade into "unknown" because the
            # port's own history (or the window) now holds the fault itself: keep the cause
            attr = cached[1]
        self._attr_cache[key] = (ts, attr)
        return attr

    def finish(self, ts: float, why: str = "job ended") -> list[DetectionMessage]:
        """Resolve whatever is still open (the job is being forgotten)."""
        return self.book.resolve_all(ts, self.last_step, why)

    def _peak_flops(self) -> float | None:
        """Sum of the ranks' peak FLOP/s, once every rank's GPU model is known."""
        if self.throughput.peak_flops_total is None:
            total = 0.0
            for rank in range(self.world_size):
                win = self.causes.windows.get(self.ranks.host[rank])
                name = win.gpu_names.get(self.ranks.gpu[rank] or 0) if win else None
                peak = self.cfg.peak_flops(name) if name else None
                if peak is None:
                    return None
                total += peak
            self.throughput.peak_flops_total = total
        return self.throughput.peak_flops_total

    def _runs_ranks(self, host: str) -> bool:
        """Whether ``host`` runs ranks of this job (any host while none is known yet)."""
        return not self.hosts or host in self.hosts

    def stats(self, now: float) -> JobStats:
        self._peak_flops()
        hang = now - self.hung_since if self.hung_since is not None else 0.0
        ratio, badput = self.throughput.goodput(
            now, hang, self.clocks.on_median_clock, self._runs_ranks
        )
        mfu = self.throughput.mfu()
        flagged = {
            k[1]: round(o.score_now or 0.0, 4)
            for k, o in self.book.open.items()
            if k[0] == T.STRAGGLER and k[1] is not None
        }
        return JobStats(
            job_id=self.job_id,
            last_step=self.last_step,
            world_size=self.world_size,
            step_seconds_median=self.throughput.step_median(),
            step_seconds_baseline=self.slowdown.baseline,
            samples_per_second=self.throughput.samples_per_second(),
            tokens_per_second=self.throughput.tokens_per_second(),
            mfu=mfu,
            mfu_note="" if mfu is not None else MFU_UNKNOWN,
            goodput_ratio=ratio,
            hung=self.hung_since is not None,
            open_detections=len(self.book.open),
            flagged_ranks=flagged,
            badput_seconds=badput,
            suspect_ranks={r: round(v, 4) for r, v in self.suspects.items()},
            suspects_total=self.suspects_total,
        )


def _waits(sd: Slowdown) -> bool:
    """Most of the slowdown is waiting (collectives, unexplained), not the median rank's work."""
    grew = sd.current_s - sd.baseline_s
    return sd.deltas.get("busy", 0.0) < 0.5 * grew

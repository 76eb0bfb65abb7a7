"""The detection engine: an :class:`~stepwatch.streams.core.api.Analyzer` over contract messages.

Drivers (the Faust workers, the offline replay) feed every valid message of the
jobs they own to :meth:`Engine.process` and call :meth:`Engine.tick` with the
current time (replay: the largest timestamp seen so far; live: the wall
clock). Everything inside runs on event time. Memory is bounded: per-job ring
buffers, per-host sample windows, and eviction of jobs after ``job_end`` plus a
grace period or a long silence.
"""

from __future__ import annotations

import logging
import math
from collections import Counter

from stepwatch.contract import (
    DetectionMessage,
    EventMessage,
    EventType,
    GpuMessage,
    Message,
    PortMessage,
    StepMessage,
    StepRecord,
)
from stepwatch.logs import LogOnce
from stepwatch.streams.core.api import JobStats
from stepwatch.streams.core.causes import CauseFinder
from stepwatch.streams.core.config import DetectConfig
from stepwatch.streams.core.hostsamples import HostStores
from stepwatch.streams.core.hostwindow import HostWindow, LinkIncident, is_dbe
from stepwatch.streams.core.job import Job

log = logging.getLogger(__name__)


class Engine:
    """Finds stragglers, slowdowns, hangs, missing ranks and user errors; says why."""

    def __init__(self, config: DetectConfig | None = None) -> None:
        self.cfg = config or DetectConfig()
        self.jobs: dict[str, Job] = {}
        self.windows: dict[str, HostWindow] = {}
        self.stores = HostStores(self.cfg.host_samples)  # every host's GPU and port samples
        self.causes = CauseFinder(self.cfg, self.windows)
        # the engine's clock: the largest timestamp seen or ticked (replay: event time), or
        # the driver's clock at arrival (``process(arrived=...)``, the live worker); each
        # job maps it onto its own hosts' clocks (``Job.local``)
        self.now = 0.0
        self._seen_floor = -math.inf  # no host window was last seen before this
        self.counts: Counter[str] = Counter()
        self._log_once = LogOnce(log)

    # ------------------------------------------------------------------ Analyzer
    def process(self, message: Message, arrived: float | None = None) -> list[DetectionMessage]:
        """Feed one valid message (any kind); return detection state changes.

        ``arrived``: the driver's clock when the message arrived (the live worker passes
        its wall clock, and ticks with the same clock); None: event time, the message's
        own ``ts`` (replay). Hosts' clocks may be off from the driver's and from each
        other: docs/detection.md, "Clocks"."""
        t = message.ts if arrived is None else arrived
        if t > self.now:
            self.now = t
        try:
            match message:
                case StepMessage():
                    return self._steps(message)
                case GpuMessage():
                    self._window(message.host).add(message)
                    return []
                case PortMessage():
                    incidents = self._window(message.host).add(message)
                    return self._links(incidents, message.job_id) if incidents else []
                case EventMessage():
                    return self._event(message, t)
                case _:
                    return []
        except Exception as err:  # the pipeline must go on: count, log once
            self.counts["errors"] += 1
            self._log_once(
                f"process:{type(err).__name__}",
                "detection failed on a message kind=%s error=%r",
                type(message).__name__,
                err,
                level=logging.ERROR,
            )
            return []

    def tick(self, now: float) -> list[DetectionMessage]:
        """Time passes: close steps past their deadline, look for hangs, evict the old."""
        if now > self.now:
            self.now = now
        out: list[DetectionMessage] = []
        for job_id in list(self.jobs):
            job = self.jobs[job_id]
            try:
                out.extend(job.tick(now))
                why = self._expired(job, now)
                if why:
                    out.extend(job.finish(job.local(now), why))
                    del self.jobs[job_id]
                    self.counts["jobs_evicted"] += 1
            except Exception as err:
                self.counts["errors"] += 1
                self._log_once(
                    f"tick:{type(err).__name__}",
                    "tick failed job_id=%s error=%r",
                    job_id,
                    err,
                    level=logging.ERROR,
                )
        self._forget_silent_hosts(now)
        return out

    def forget(self, job_id: str, now: float, why: str) -> list[DetectionMessage]:
        """Drop a job's state now (its driver's admission let it go to make room): its
        open detections resolve with ``why``."""
        job = self.jobs.pop(job_id, None)
        if job is None:
            return []
        self.counts["jobs_evicted"] += 1
        return job.finish(job.local(now), f"job forgotten: {why}")

    def forget_host(self, host: str) -> None:
        """Drop a host's samples and events now (its driver's admission let it go)."""
        win = self.windows.pop(host, None)
        if win is not None:
            win.close()

    def _forget_silent_hosts(self, now: float) -> None:
        """Host windows silent for ``host_silence_seconds`` go. Each window's ``last_seen``
        only grows, so the oldest one found by the last look bounds them all: the
        windows are looked at only once that bound is old enough (or a new one came)."""
        silence = self.cfg.host_silence_seconds
        if now - self._seen_floor <= silence:
            return
        for host in [h for h, w in self.windows.items() if now - w.last_seen > silence]:
            self.windows.pop(host).close()
        self._seen_floor = min((w.last_seen for w in self.windows.values()), default=now)

    def stats(self) -> list[JobStats]:
        return [job.stats(job.local(self.now)) for job in self.jobs.values()]

    def health(self) -> dict[str, int]:
        """Counters for the driver's metrics: records, duplicates, late records, errors."""
        out = dict(self.counts)
        out["duplicates"] = sum(j.assembler.duplicates for j in self.jobs.values())
        out["late"] = sum(j.assembler.late for j in self.jobs.values())
        out["jobs"] = len(self.jobs)
        out["hosts"] = len(self.windows)
        return out

    # ------------------------------------------------------------------ routing
    def _steps(self, message: StepMessage) -> list[DetectionMessage]:
        records = message.steps
        if not records:
            return []
        self.counts["records"] += len(records)
        first = records[0].job_id
        for r in records:  # a plain loop: cheaper than any() over a generator, per message
            if r.job_id != first:
                return self._several_jobs(records, message.ts)
        return self._job_records(records, message.ts)

    def _several_jobs(self, records: list[StepRecord], ts: float) -> list[DetectionMessage]:
        by_job: dict[str, list[StepRecord]] = {}
        for r in records:
            by_job.setdefault(r.job_id, []).append(r)
        out: list[DetectionMessage] = []
        for group in by_job.values():
            out.extend(self._job_records(group, ts))
        return out

    def _job_records(self, records: list[StepRecord], ts: float) -> list[DetectionMessage]:
        job_id, world = records[0].job_id, records[0].world_size
        job = self.jobs.get(job_id)
        out: list[DetectionMessage] = []
        if job is not None and job.world_size != world:
            if job.ended_at is None and records[0].start < job.last_progress:
                self.counts["records_wrong_world_size"] += len(records)
                return []  # stray records of another size: not a new incarnation
            log.info("job resized job_id=%s from=%s to=%s", job_id, job.world_size, world)
            out.extend(job.finish(ts, f"job restarted with {world} ranks"))
            job = None
        if job is not None and self._started_again(job, records):
            log.info("job started again after its end job_id=%s", job_id)
            out.extend(job.finish(job.ended_at or ts))
            job = None
        if job is None:
            job = self.jobs[job_id] = Job(job_id, world, self.cfg, self.causes)
        for r in records:  # a plain loop: cheaper than any() over a generator, per message
            if r.world_size != world:
                kept = [r for r in records if r.world_size == world]
                self.counts["records_wrong_world_size"] += len(records) - len(kept)
                records = kept
                break
        out.extend(job.add_records(records, ts, self.now))
        return out

    def _started_again(self, job: Job, records: list[StepRecord]) -> bool:
        """Records of a run that began after the job ended (a requeue under the same job
        id, its first run having sent ``job_end``): a new incarnation. Before, they were
        dropped as late until the ended job was forgotten (``job_end_grace_seconds``,
        5 min): a straggler still there after the requeue was found 5 min late, its onset
        put 200 steps after the truth. Only once the end is final (the assembly deadline
        after ``job_end`` came, on the engine's clock) and for records starting more than
        that deadline after both the end and the old run's latest record."""
        if job.ended_at is None or not job.finalised:
            return False
        began = min(r.start for r in records)
        # after the run's own latest end too: the old run's last records from a host whose
        # clock is ahead of the job_end's sender's start after the end on that clock
        over = max(job.ended_at, job.last_progress) + self.cfg.assembly_deadline_seconds
        return began > over

    def _event(self, ev: EventMessage, arrived: float) -> list[DetectionMessage]:
        win = self._window(ev.host)
        job = self._named(ev.host, ev.job_id)  # None too when the host may not speak for it
        # a rank's exception is kept only for a job the host runs: one naming no job, or a
        # job id a sender chose, cannot push a real job's exceptions out of the window
        ours = ev.type != EventType.EXCEPTION or job is not None
        incidents = win.add(ev) if ours else []
        if incidents:
            return self._links(incidents, ev.job_id)
        if ev.job_id and ev.job_id not in self.jobs and ev.type == EventType.JOB_START:
            world = ev.attrs.get("world_size")
            if isinstance(world, int) and not isinstance(world, bool) and world > 0:
                job = self.jobs[ev.job_id] = Job(ev.job_id, world, self.cfg, self.causes)
        out: list[DetectionMessage] = []
        if ev.type in (EventType.XID, EventType.ECC):
            if ev.type == EventType.XID or is_dbe(ev):
                for j in self._jobs_of(ev.host, ev.job_id):
                    out.extend(j.on_hardware(ev))
            return out
        if job is not None:
            return job.on_event(ev, arrived)
        # an exception that names no job this host may speak for is no job's: before, one
        # with an empty job_id opened user_error on every job running on the host
        return out

    def _links(self, incidents: list[LinkIncident], job_id: str | None) -> list[DetectionMessage]:
        out: list[DetectionMessage] = []
        for inc in incidents:
            for job in self._jobs_of(inc.host, job_id):
                out.extend(job.on_link(inc))
        return out

    def _jobs_of(self, host: str, job_id: str | None) -> list[Job]:
        """The job named, when ``host`` may speak for it (:meth:`_named`), or (when none
        is) the jobs running on ``host``."""
        if not job_id:
            return [j for j in self.jobs.values() if host in j.hosts]
        job = self._named(host, job_id)
        return [] if job is None else [job]

    def _named(self, host: str, job_id: str | None) -> Job | None:
        """The job a message from ``host`` names, if ``host`` may speak for it: one of its
        hosts (step records say so), or any host while it has none (a job known from its
        ``job_start`` only). A host that runs none of a job's ranks says nothing of it
        (docs/security.md: one XID from such a host opened ``rank_missing`` on the job)."""
        job = self.jobs.get(job_id) if job_id is not None else None
        if job is None or (job.hosts and host not in job.hosts):
            return None
        return job

    def _window(self, host: str) -> HostWindow:
        win = self.windows.get(host)
        if win is None:
            win = self.windows[host] = HostWindow(host, self.cfg.host_samples, self.stores)
            self._seen_floor = -math.inf  # its first sample may be older than the others
        if self.now > win.last_seen:  # seen now on the engine's clock: a host whose own
            win.last_seen = self.now  # clock is far behind is not silent (see "Clocks")
        return win

    def _expired(self, job: Job, now: float) -> str:
        """Why the job can be forgotten now ("" while it must be kept)."""
        if job.ended_at is not None:  # counted from the job_end's arrival (see Job.tick)
            return "job ended" if now - job.end_arrived > self.cfg.job_end_grace_seconds else ""
        now = job.local(now)
        if job.last_seen > 0 and now - job.last_seen > self.cfg.job_silence_seconds:
            return "job silent"
        return ""

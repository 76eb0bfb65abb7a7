"""What a record may claim, judged against its job's own progress and the worker's clock.

The contract bounds each value on its own (``absurd_value``); this module
bounds what one record may do to the worker's state, before the duplicate
filter and the detection core see it, so that a single forged or broken
record cannot move a high-water mark that real data is then judged against:

* ``future_timestamp`` — a message (or a step record in it: that record alone) stamped
  more than ``future_seconds`` ahead of the worker's clock. The host's sample watermark
  and the job's step clock never move for it.
* ``too_old`` — a message (or a step record: that record alone) older than
  ``max_age_seconds``: live detection has
  nothing to do with it (a new job 200 days old would read as a hang). The
  store keeps it (the sink has its own, longer, limit).
* ``step_jump`` — a step number far beyond the job's peak (the highest step
  admitted): more than ``max(step_jump_min, step_jump_factor x cadence x
  elapsed event time)``. A job's first record may start anywhere (a job
  resumed from a checkpoint); a step going *back* is always admitted, and when
  it starts after the run's latest step ended it is a restart
  (:attr:`Admission.rewound` names the job so that the duplicate filter
  forgets its window).
* ``foreign_lifecycle`` — a ``job_end``, or a ``job_start`` of a job it already
  has, from a host that is not one of the job's (:meth:`GateJob.foreign`);
  likewise a step record with another ``world_size`` than the job's from such
  a host (the detection core takes a new size for a restart
  and closes the job's open detections). A job this worker has no step from
  yet is not judged.
* ``foreign_job`` — any other event that names a job, from a host that is not
  one of the job's (the same rule): a job's own event (a checkpoint save, an
  exception) is refused (a restart or checkpoint load, which the core reads
  nothing from, is not judged); a host's hardware or link event (``xid``, ``ecc``,
  ``link_state``) goes on as the host's own, without the job and rank it named
  (one XID from a host that runs none of a job's ranks opened ``rank_missing``
  on that job; one ``checkpoint_save`` of 10^12 s hid its hangs).
* ``world_size`` — a ``world_size`` above ``max_world_size``, in a step record
  or a ``job_start``'s ``attrs``: the detection core's memory per job grows with
  the size a record claims, not with the ranks that report (one record of 2^20
  ranks cost the worker ~2 GiB).
* ``capacity`` — a new job, or a new host's samples and events, when the
  worker's detection cores already hold what :class:`Capacity` allows: the sum
  of the jobs' world sizes (``max_ranks``), the hosts (``max_hosts``), and
  ``max_jobs`` jobs per partition. A job or host quiet for its idle time (the
  core's own silence limits) gives its place up first; one still active is
  never pushed out, so a flood of new job ids or host names is refused instead
  of evicting the real jobs' state (the checks above would then pass anything
  for them) or growing the core's memory without bound.

Memory: one small entry per job and per host, bounded as above.
"""

from __future__ import annotations

import enum
from collections import OrderedDict
from dataclasses import dataclass, field

import msgspec

from stepwatch.contract import EventMessage, EventType, Message, StepMessage, StepRecord
from stepwatch.streams.worker.capacity import Capacity
from stepwatch.streams.worker.gatejob import GateJob

__all__ = ["Admission", "AdmissionConfig", "Capacity", "Gate", "Reason", "Refusal"]

LIFECYCLE = frozenset({EventType.JOB_END, EventType.JOB_START})
# events that say something of the sending host itself: from a host that is not one of
# the job's they go on as the host's own, without the job (and its rank) they named
HOST_FACTS = frozenset({EventType.XID, EventType.ECC, EventType.LINK_STATE})
# events the detection core reads nothing from: unjudged (a restart onto new nodes sends
# them from hosts the job does not have yet, and a dead letter would be noise)
NO_EFFECT = frozenset({EventType.RESTART, EventType.CHECKPOINT_LOAD})
_NO_LIMIT = float("inf")


class Reason(enum.StrEnum):
    FUTURE = "future_timestamp"
    TOO_OLD = "too_old"
    STEP_JUMP = "step_jump"
    FOREIGN_LIFECYCLE = "foreign_lifecycle"
    FOREIGN_JOB = "foreign_job"
    WORLD_SIZE = "world_size"
    CAPACITY = "capacity"


@dataclass(frozen=True)
class AdmissionConfig:
    future_seconds: float = 120.0  # ahead of the worker's clock; <= 0: no check
    max_age_seconds: float = 86400.0  # behind the worker's clock; <= 0: no check
    step_jump_min: int = 1000
    step_jump_factor: float = 100.0
    max_jobs: int = 4096  # per partition; <= 0: no check
    max_world_size: int = 65536  # 4x a 16,384-GPU job; <= 0: no check
    max_ranks: int = 131072  # the worker's jobs' world sizes summed; <= 0: no check
    max_hosts: int = 16384  # hosts whose samples the worker keeps; <= 0: no check
    job_idle_seconds: float = 3600.0  # a job this quiet gives its place up (core: the same)
    # a job fewer than half of whose ranks reported this long after its first record gives
    # its place up to a new job when the worker is full (a claim of many ranks, unbacked)
    confirm_seconds: float = 120.0
    host_idle_seconds: float = 900.0  # a host this quiet gives its place up (core: the same)


@dataclass(frozen=True)
class Refusal:
    reason: Reason
    detail: str


@dataclass
class Admission:
    """The message to go on with (None: nothing), what was refused, the jobs that restarted."""

    message: Message | None
    refusals: list[Refusal] = field(default_factory=list)
    rewound: list[str] = field(default_factory=list)


def _unless_plain(admission: Admission) -> Admission | None:
    """None for an admission that passes its message as it is (see :meth:`Gate.check`)."""
    if admission.refusals or admission.rewound or admission.message is None:
        return admission
    return None


def _foreign(ev: EventMessage, job: GateJob, reason: Reason, then: str = "") -> Refusal:
    """An event naming ``job`` from a host that is not one of its hosts."""
    hosts = ", ".join(sorted(job.hosts or job.newcomers)[:8])
    return Refusal(
        reason,
        f"{ev.type} for job {ev.job_id} from host {ev.host!r}, which is not one of its "
        f"hosts (records of 3 steps make one) (hosts: {hosts}){then}",
    )


def _mixed(rec: StepRecord, first: int) -> Refusal:
    """A record whose world_size differs from its job's earlier record in the same message:
    the detection core takes one size a message (the first), so the gate must too (else it
    counted the job at one size while the core built it at the other)."""
    return Refusal(
        Reason.WORLD_SIZE,
        f"job {rec.job_id} rank {rec.rank}: world_size {rec.world_size}, but {first} "
        "in an earlier record of the same message",
    )


class Gate:
    """Per-partition admission state: each job's step ceiling, cadence and hosts."""

    def __init__(
        self, config: AdmissionConfig | None = None, capacity: Capacity | None = None
    ) -> None:
        self.cfg = config or AdmissionConfig()
        self.capacity = capacity or Capacity.of(self.cfg)
        self._jobs: OrderedDict[str, GateJob] = OrderedDict()
        self._hosts: OrderedDict[str, float] = OrderedDict()  # host -> its newest message
        self._unconfirmed: OrderedDict[str, None] = OrderedDict()  # oldest first
        self._backing: dict[str, int] = {}  # host -> jobs here it is a host of
        self.evicted: list[tuple[str, str]] = []  # (job, why) let go: the core forgets them
        self.evicted_hosts: list[str] = []  # hosts let go: the core forgets their samples
        self._now = 0.0  # the clock of the message being judged
        # seconds of it the worker could not read this partition (streams.worker.sight):
        # not counted as a job's or host's quiet, nor as an unconfirmed job's age
        self.unseen = 0.0
        # the clock bounds as plain numbers (<= 0: no check) for :meth:`check`
        self._future = self.cfg.future_seconds if self.cfg.future_seconds > 0 else _NO_LIMIT
        self._max_age = self.cfg.max_age_seconds if self.cfg.max_age_seconds > 0 else _NO_LIMIT

    def admit(self, message: Message, now: float) -> Admission:
        self._now = now
        refusal = self._clock(message, now)
        if refusal is not None:
            return Admission(None, [refusal])
        if isinstance(message, StepMessage):
            return self._steps(message)
        refusal = self._host(message.host, message.ts)
        if refusal is not None:
            return Admission(None, [refusal])
        if isinstance(message, EventMessage):
            if message.type in LIFECYCLE:
                return self._lifecycle(message)
            if message.job_id:
                return self._job_claim(message)
        return Admission(message)

    def check(self, message: Message, now: float) -> Admission | None:
        """:meth:`admit` for the worker's hot path: None when the message passes as it is.

        The same decisions and the same state changes as :meth:`admit`, without
        an :class:`Admission` (two lists) per message: one is built only when a
        record is refused or a job restarted. The common case, a step message of
        one job whose records all pass, looks the job up once per run of
        records and keeps no list; a sample of a known host, the host once.
        """
        if isinstance(message, StepMessage):
            return self._check_steps(message, now)
        if isinstance(message, EventMessage):  # rare next to samples: judged in full
            return _unless_plain(self.admit(message, now))
        ts = message.ts
        if ts > now + self._future or ts < now - self._max_age:
            return self.admit(message, now)  # refused: the precise reason
        self._now = now
        refusal = self._host(message.host, ts)
        return None if refusal is None else Admission(None, [refusal])

    def _check_steps(self, message: StepMessage, now: float) -> Admission | None:
        self._now = now
        steps = message.steps
        newest = oldest = message.ts
        for r in steps:  # _clock's extremes: plain comparisons, no max()/min() calls
            if r.end > newest:
                newest = r.end
            if r.start < oldest:
                oldest = r.start
        cfg = self.cfg
        if newest > now + self._future or oldest < now - self._max_age:
            return _unless_plain(self.admit(message, now))  # refused whole by the clock
        max_world = cfg.max_world_size if cfg.max_world_size > 0 else _NO_LIMIT
        host = message.host
        out: Admission | None = None
        kept: list[StepRecord] | None = None
        job_id: str | None = None
        job: GateJob | None = None
        firsts: dict[str, int] = {}  # each job's first admitted world_size in this message
        for i, rec in enumerate(steps):
            refusal: Refusal | None = None
            first: int | None = None
            if rec.world_size > max_world:
                refusal = self._step(rec, host, out or Admission(message), firsts)  # precise
            else:
                if rec.job_id != job_id or job is None:
                    job_id, job = rec.job_id, self._job(rec)
                step = rec.step
                first = firsts.get(rec.job_id)
                if job is None:
                    refusal = self._no_room(rec)
                elif first is not None and first != rec.world_size:
                    refusal = _mixed(rec, first)
                elif (
                    rec.world_size != job.world
                    or step > job.peak
                    or step != job.ceiling
                    or (host and host not in job.hosts)
                ):
                    if out is None:
                        out = Admission(message)
                    refusal = self._judge(job, rec, host, out)
            if refusal is None:
                if first is None:
                    firsts[rec.job_id] = rec.world_size
                if job is not None and job.seen is not None and job.saw(rec.rank):
                    self._unconfirmed.pop(rec.job_id, None)
                if kept is not None:
                    kept.append(rec)
                elif i == 0 and job is not None and self._rest_pass(steps, job, host):
                    break  # the others are the first's job, size and step: nothing to judge
                continue
            if out is None:
                out = Admission(message)
            out.refusals.append(refusal)
            if kept is None:
                kept = list(steps[:i])
        if out is None:
            return None
        if kept is not None:
            out.message = msgspec.structs.replace(message, steps=kept) if kept else None
        return _unless_plain(out)

    def _rest_pass(self, steps: list[StepRecord], job: GateJob, host: str) -> bool:
        """Whether the records after an admitted first one pass as they are: of its job,
        size and step, which the job (as the first left it) expects from this host, so
        that the loop of :meth:`_check_steps` would judge none of them (the common
        message: one host's ranks at one step). Their ranks are noted as that loop notes
        them; False (nothing changed) when a record differs."""
        head = steps[0]
        job_id, world, step = head.job_id, head.world_size, head.step
        if (
            world != job.world
            or step > job.peak
            or step != job.ceiling
            or (host and host not in job.hosts)
        ):
            return False
        for r in steps:
            if r.step != step or r.world_size != world or r.job_id != job_id:
                return False
        if job.seen is not None:
            for r in steps[1:]:
                if job.saw(r.rank):
                    self._unconfirmed.pop(job_id, None)
        return True

    def _clock(self, message: Message, now: float) -> Refusal | None:
        """The message's own time (a step record's times are judged with the record:
        :meth:`_record_clock`, so one record out of the window costs no other)."""
        cfg = self.cfg
        ts = message.ts
        if cfg.future_seconds > 0 and ts > now + cfg.future_seconds:
            return Refusal(
                Reason.FUTURE,
                f"timestamp {ts:.3f} is {ts - now:.0f} s ahead "
                f"of the worker's clock (tolerance {cfg.future_seconds:.0f} s)",
            )
        if cfg.max_age_seconds > 0 and ts < now - cfg.max_age_seconds:
            return Refusal(
                Reason.TOO_OLD,
                f"timestamp {ts:.3f} is {now - ts:.0f} s old (limit {cfg.max_age_seconds:.0f} s)",
            )
        return None

    def _steps(self, message: StepMessage) -> Admission:
        out = Admission(message)
        kept: list[StepRecord] | None = None
        firsts: dict[str, int] = {}
        for i, rec in enumerate(message.steps):
            refusal = self._step(rec, message.host, out, firsts)
            if refusal is None:
                if kept is not None:
                    kept.append(rec)
                continue
            out.refusals.append(refusal)
            if kept is None:
                kept = list(message.steps[:i])
        if kept is not None:
            out.message = msgspec.structs.replace(message, steps=kept) if kept else None
        return out

    def _record_clock(self, rec: StepRecord) -> Refusal | None:
        """A step record stamped outside the window. Before, the whole message was refused
        for it: one such record (a broken clock, or a sender the agent cannot tie to a
        job) cost every other record of its job from that host in that tick."""
        now = self._now
        if rec.end > now + self._future:
            return Refusal(
                Reason.FUTURE,
                f"job {rec.job_id} rank {rec.rank} step {rec.step}: ends {rec.end:.3f}, "
                f"{rec.end - now:.0f} s ahead of the worker's clock "
                f"(tolerance {self.cfg.future_seconds:.0f} s)",
            )
        if rec.start < now - self._max_age:
            return Refusal(
                Reason.TOO_OLD,
                f"job {rec.job_id} rank {rec.rank} step {rec.step}: starts {rec.start:.3f}, "
                f"{now - rec.start:.0f} s old (limit {self.cfg.max_age_seconds:.0f} s)",
            )
        return None

    def _step(
        self, rec: StepRecord, host: str, out: Admission, firsts: dict[str, int]
    ) -> Refusal | None:
        """One record (``firsts``: each job's first admitted world_size in the message)."""
        late_or_early = self._record_clock(rec)
        if late_or_early is not None:
            return late_or_early
        if 0 < self.cfg.max_world_size < rec.world_size:
            return self._too_large(rec.job_id, f"rank {rec.rank}: ", rec.world_size)
        job = self._job(rec)
        if job is None:
            return self._no_room(rec)
        first = firsts.get(rec.job_id)
        if first is not None and first != rec.world_size:
            return _mixed(rec, first)
        refusal = self._judge(job, rec, host, out)
        if refusal is None:
            firsts.setdefault(rec.job_id, rec.world_size)
            if job.seen is not None and job.saw(rec.rank):
                self._unconfirmed.pop(rec.job_id, None)
        return refusal

    def _too_large(self, job_id: str, what: str, world: int) -> Refusal:
        return Refusal(
            Reason.WORLD_SIZE,
            f"job {job_id} {what}world_size {world} is over {self.cfg.max_world_size}",
        )

    def _judge(self, job: GateJob, rec: StepRecord, host: str, out: Admission) -> Refusal | None:
        """One record against its job (looked up by the caller): refusal, or the job moved on."""
        if rec.world_size != job.world:
            if job.foreign(host):
                return Refusal(
                    Reason.FOREIGN_LIFECYCLE,
                    (
                        f"job {rec.job_id} rank {rec.rank}: world_size {rec.world_size} "
                        f"(the job has {job.world}) from host {host!r}, "
                        "which is not one of its hosts (records of 3 steps make one)"
                    ),
                )
            grow = rec.world_size - job.world
            if grow > 0 and not self._room_for_ranks(grow):
                return self._no_room(rec, f"{job.world} ranks to {rec.world_size}")
            self.capacity.ranks += grow
            job.resized(rec.world_size, rec.end)
            self._unconfirmed[rec.job_id] = None
        if rec.step > job.peak:
            limit = job.allowance(rec.end, self.cfg)
            if rec.step - job.peak > limit:
                return Refusal(
                    Reason.STEP_JUMP,
                    f"job {rec.job_id} rank {rec.rank} step {rec.step}: "
                    f"{rec.step - job.peak} beyond the job's step {job.peak} "
                    f"(allowed {limit:.0f})",
                )
            job.peak, job.peak_end = rec.step, max(rec.end, job.peak_end)
        if rec.step > job.ceiling:
            job.ceiling, job.ceiling_end = rec.step, max(rec.end, job.ceiling_end)
        elif rec.step < job.ceiling and rec.start >= job.ceiling_end:
            job.ceiling, job.ceiling_end = rec.step, rec.end  # a restart from a checkpoint
            if rec.job_id not in out.rewound:
                out.rewound.append(rec.job_id)
        if host and host not in job.hosts and job.note_host(host, rec.step):
            self._backing[host] = self._backing.get(host, 0) + 1
        return None

    def _job(self, rec: StepRecord) -> GateJob | None:
        """The record's job, a new one when there is room for it (None: there is not)."""
        jobs = self._jobs
        job = jobs.get(rec.job_id)
        if job is None:
            if not self._room_for_job(rec.world_size):
                return None
            job = jobs[rec.job_id] = GateJob(rec, rec.world_size, rec.end)
            self.capacity.ranks += rec.world_size
            self._unconfirmed[rec.job_id] = None
        else:
            jobs.move_to_end(rec.job_id)
            if job.stepless:
                job.first(rec)
        return job

    # ------------------------------------------------------------------ capacity
    def _room_for_job(self, world: int) -> bool:
        """Room for one more job of ``world`` ranks, after letting quiet or unconfirmed
        jobs go."""
        most = self.cfg.max_jobs
        while 0 < most <= len(self._jobs) or not self.capacity.room_for_ranks(world):
            if not (self._let_quiet_job_go() or self._let_unconfirmed_job_go()):
                return False
        return True

    def _room_for_ranks(self, n: int) -> bool:
        while not self.capacity.room_for_ranks(n):
            if not (self._let_quiet_job_go() or self._let_unconfirmed_job_go()):
                return False
        return True

    def _let_unconfirmed_job_go(self) -> bool:
        """Forget the oldest job fewer than half of whose ranks reported within
        ``confirm_seconds`` of its first record (a claim no ranks back); never a job
        whose ranks did report."""
        if not self._unconfirmed:
            return False
        job_id = next(iter(self._unconfirmed))
        job = self._jobs.get(job_id)
        if job is None:  # forgotten another way
            del self._unconfirmed[job_id]
            return True
        age = self._now - self.unseen - job.born
        if age <= self.cfg.confirm_seconds:
            return False
        self._forget_job(job_id)
        self.evicted.append((job_id, f"{job.n_seen} of its {job.world} ranks in {age:.0f} s"))
        return True

    def _let_quiet_job_go(self) -> bool:
        """Forget the least recently seen job if it has been quiet for its idle time (the
        core forgets it then too); never one still active."""
        if not self._jobs:
            return False
        job_id, job = next(iter(self._jobs.items()))
        if self._now - self.unseen - job.quiet_since() <= self.cfg.job_idle_seconds:
            return False
        self._forget_job(job_id)
        self.evicted.append((job_id, f"quiet for {self.cfg.job_idle_seconds:.0f} s"))
        return True

    def _forget_job(self, job_id: str) -> None:
        job = self._jobs.pop(job_id, None)
        self._unconfirmed.pop(job_id, None)
        if job is not None:
            self.capacity.ranks -= job.world
            for host in job.hosts:
                left = self._backing.get(host, 0) - 1
                if left > 0:
                    self._backing[host] = left
                else:
                    self._backing.pop(host, None)

    def take_evicted_hosts(self) -> list[str]:
        """The hosts let go to make room since the last call: the core forgets them too."""
        out, self.evicted_hosts = self.evicted_hosts, []
        return out

    def take_evicted(self) -> list[tuple[str, str]]:
        """The jobs let go to make room since the last call, and why: the detection core
        forgets them too (it holds their memory)."""
        out, self.evicted = self.evicted, []
        return out

    def _no_room(self, rec: StepRecord, what: str = "") -> Refusal:
        cap = self.capacity
        return Refusal(
            Reason.CAPACITY,
            f"job {rec.job_id} rank {rec.rank}: no room "
            f"{'to grow from ' + what if what else 'for a new job'} "
            f"(jobs {len(self._jobs)} of {self.cfg.max_jobs} in this partition, "
            f"ranks {cap.ranks} of {cap.max_ranks} in this worker; none quiet for "
            f"{self.cfg.job_idle_seconds:.0f} s)",
        )

    def _host(self, host: str, ts: float) -> Refusal | None:
        """A sample's or event's host: known, or new with room for it (quiet hosts go)."""
        hosts = self._hosts
        seen = hosts.get(host)
        if seen is not None:
            hosts.move_to_end(host)
            if ts > seen:
                hosts[host] = ts
            return None
        cap = self.capacity
        while not cap.room_for_host():
            gone = self._host_to_let_go(host)
            if gone is None:
                return Refusal(
                    Reason.CAPACITY,
                    f"host {host!r}: no room for a new host (hosts {cap.hosts} of "
                    f"{cap.max_hosts} in this worker; none quiet for "
                    f"{self.cfg.host_idle_seconds:.0f} s, and none that runs no job here "
                    "for a host of a job)",
                )
            del hosts[gone]
            cap.hosts -= 1
            self.evicted_hosts.append(gone)
        hosts[host] = ts
        cap.hosts += 1
        return None

    def _host_to_let_go(self, new: str) -> str | None:
        """The least recently seen host if it is quiet; else, for a new host that is one of
        a job's hosts here (its step records say so), the least recently seen host that
        is no job's (a flood of made-up host names gives way to real ones)."""
        hosts = self._hosts
        oldest = next(iter(hosts.items()), None)
        if oldest is None:
            return None
        if self._now - self.unseen - oldest[1] > self.cfg.host_idle_seconds:
            return oldest[0]
        if not self._backing.get(new):
            return None
        return next((h for h in hosts if h not in self._backing), None)

    def release(self) -> None:
        """The partition is gone: give its jobs' and hosts' places back to the worker."""
        self.capacity.ranks -= sum(j.world for j in self._jobs.values())
        self.capacity.hosts -= len(self._hosts)
        self._jobs.clear()
        self._hosts.clear()
        self._unconfirmed.clear()
        self._backing.clear()

    # ------------------------------------------------------------------ lifecycle
    def _lifecycle(self, ev: EventMessage) -> Admission:
        job = self._jobs.get(ev.job_id or "")
        if job is not None and job.foreign(ev.host):
            return Admission(None, [_foreign(ev, job, Reason.FOREIGN_LIFECYCLE)])
        if ev.type == EventType.JOB_START:
            return self._job_start(ev)
        if job is not None:  # a job_end
            self._forget_job(ev.job_id or "")
        return Admission(ev)

    def _job_claim(self, ev: EventMessage) -> Admission:
        """Any other event naming a job: from a host that is not one of the job's, a host's
        own fact (:data:`HOST_FACTS`) goes on without the job and rank; the rest is refused."""
        job = self._jobs.get(ev.job_id or "")
        if job is None or ev.type in NO_EFFECT or not job.foreign(ev.host):
            return Admission(ev)
        if ev.type not in HOST_FACTS:
            return Admission(None, [_foreign(ev, job, Reason.FOREIGN_JOB)])
        kept = msgspec.structs.replace(ev, job_id=None, rank=None)
        return Admission(kept, [_foreign(ev, job, Reason.FOREIGN_JOB, "; kept as the host's own")])

    def _job_start(self, ev: EventMessage) -> Admission:
        """A ``job_start`` whose ``attrs`` give a ``world_size`` makes the core keep a job
        of that size before any step: bounded and counted like a step record's."""
        world = ev.attrs.get("world_size")
        if not ev.job_id or not isinstance(world, int) or isinstance(world, bool) or world < 1:
            return Admission(ev)  # the core keeps no job for it
        if 0 < self.cfg.max_world_size < world:
            return Admission(None, [self._too_large(ev.job_id, "job_start: ", world)])
        if ev.job_id in self._jobs:
            return Admission(ev)
        if not self._room_for_job(world):
            cap = self.capacity
            detail = (
                f"job {ev.job_id} job_start: no room for a new job of {world} ranks (jobs "
                f"{len(self._jobs)} of {self.cfg.max_jobs} in this partition, ranks "
                f"{cap.ranks} of {cap.max_ranks} in this worker)"
            )
            return Admission(None, [Refusal(Reason.CAPACITY, detail)])
        self._jobs[ev.job_id] = GateJob(None, world, ev.ts)
        self.capacity.ranks += world
        self._unconfirmed[ev.job_id] = None
        return Admission(ev)

    def __len__(self) -> int:
        return len(self._jobs)

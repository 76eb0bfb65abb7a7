"""What the admission gate keeps of each job: its step ceiling, cadence, hosts, ranks.

One small entry per job (:class:`GateJob`); the gate
(:mod:`stepwatch.streams.worker.admission`) judges each record against it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from stepwatch.contract import StepRecord

if TYPE_CHECKING:
    from stepwatch.streams.worker.admission import AdmissionConfig

HOST_STEPS = 3  # distinct steps a host's records must cover before it is one of the job's
MAX_NEWCOMERS = 4096  # hosts of a job still short of HOST_STEPS, at most


class GateJob:
    """``peak``: the highest step admitted (jumps are judged against it); ``ceiling``:
    this run's."""

    __slots__ = (
        "born",
        "ceiling",
        "ceiling_end",
        "first_end",
        "first_step",
        "hosts",
        "n_seen",
        "newcomers",
        "peak",
        "peak_end",
        "seen",
        "stepless",
        "world",
    )

    def __init__(self, rec: StepRecord | None, world: int, ts: float) -> None:
        """From the job's first step record; or (``rec`` None) from its ``job_start``:
        then its first step record, whenever it comes, may start anywhere."""
        self.stepless = rec is None
        step = -1 if rec is None else rec.step
        end = ts if rec is None else rec.end
        self.first_step = self.ceiling = self.peak = step
        self.first_end = self.ceiling_end = self.peak_end = end
        self.hosts: set[str] = set()  # hosts that sent records of HOST_STEPS steps or more
        self.newcomers: dict[str, tuple[int, int]] = {}  # other hosts: (steps, the last one)
        self.world = world
        self.born = end
        self.seen: bytearray | None = bytearray(world)  # ranks that reported (None: confirmed)
        self.n_seen = 0

    def note_host(self, host: str, step: int) -> bool:
        """A host sent an admitted record of ``step``: one of the job's hosts once it has
        sent records of ``HOST_STEPS`` distinct steps (one forged record makes no host
        the job's, whose ``job_end`` or resize would then pass). True when it just
        became one."""
        steps, last = self.newcomers.get(host, (0, -1))
        if step != last:
            steps += 1
        if steps >= HOST_STEPS:
            self.newcomers.pop(host, None)
            self.hosts.add(host)
            return True
        if host in self.newcomers or len(self.newcomers) < MAX_NEWCOMERS:
            self.newcomers[host] = (steps, step)
        return False

    def foreign(self, host: str) -> bool:
        """Whether ``host`` is not one of the job's hosts: those that sent records of
        ``HOST_STEPS`` steps; while none has, those that sent any (a young job). A job
        with no host yet judges none foreign."""
        if self.hosts:
            return host not in self.hosts
        return bool(self.newcomers) and host not in self.newcomers

    def saw(self, rank: int) -> bool:
        """Note a rank that reported; True when the job has just become confirmed (half
        of its ranks or more reported)."""
        seen = self.seen
        if seen is None or rank >= len(seen) or seen[rank]:
            return False
        seen[rank] = 1
        self.n_seen += 1
        if 2 * self.n_seen < self.world:
            return False
        self.seen = None
        return True

    def resized(self, world: int, end: float) -> None:
        self.world = world
        self.seen, self.n_seen = bytearray(world), 0  # to be confirmed again at its new size
        self.born = end  # ... given the same time to be

    def first(self, rec: StepRecord) -> None:
        """The first step record of a job known until now from its ``job_start``."""
        self.stepless = False
        self.first_step = self.ceiling = self.peak = rec.step
        self.first_end = self.ceiling_end = self.peak_end = self.born = rec.end

    def quiet_since(self) -> float:
        return max(self.peak_end, self.ceiling_end)

    def allowance(self, end: float, cfg: AdmissionConfig) -> float:
        span = self.peak_end - self.first_end
        rate = (self.peak - self.first_step) / span if span > 0 else 0.0
        elapsed = max(end - self.peak_end, 1.0)
        return max(float(cfg.step_jump_min), cfg.step_jump_factor * rate * elapsed)

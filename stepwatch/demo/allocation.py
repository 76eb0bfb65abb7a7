"""Where the scheduler runs the demo's job: its state and node list, read from Slurm.

The simulated job follows its Slurm job as a real one does: it runs on the
nodes ``squeue`` gives it, stops when the allocation goes away (a drain and a
requeue), and starts again on the new allocation. A node list is expanded by
``scontrol show hostnames`` and every name must match a strict pattern before
it is used.
"""

from __future__ import annotations

import logging
import re
import subprocess
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

log = logging.getLogger(__name__)

NODE_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,62}$")
JOB_ID = re.compile(r"^[0-9]{1,12}$")
UNKNOWN = "UNKNOWN"


@dataclass(frozen=True)
class Allocation:
    """One reading: the job's state (RUNNING, PENDING, ...) and its nodes ('' when none)."""

    state: str
    nodes: tuple[str, ...] = ()

    @property
    def running(self) -> bool:
        return self.state == "RUNNING" and bool(self.nodes)


Follow = Callable[[], Allocation]


@dataclass(frozen=True)
class Incarnation:
    """One run of the job on one allocation."""

    number: int
    started: float  # wall clock
    nodes: tuple[str, ...]
    first_step: int


def lost(now: Allocation, hosts: tuple[str, ...]) -> bool:
    """Whether a job running on ``hosts`` must stop: its allocation went away or changed
    (a reading that says nothing, ``UNKNOWN``, changes nothing)."""
    return now.state != UNKNOWN and not (now.running and now.nodes == hosts)


def next_running(
    follow: Follow, stop: threading.Event, poll_seconds: float
) -> Iterator[Allocation]:
    """Wait (until ``stop``) for the scheduler to run the job again: yields that allocation once."""
    while not stop.wait(poll_seconds):
        now = follow()
        if now.running:
            yield now
            return


@dataclass(frozen=True)
class SlurmAllocation:
    """Reads one job's allocation with the cluster's own commands (``SLURM_CONF`` in ``env``)."""

    job_id: str
    env: Mapping[str, str]
    squeue: str = "squeue"
    scontrol: str = "scontrol"

    def __post_init__(self) -> None:
        if not JOB_ID.match(self.job_id):
            raise ValueError(f"not a Slurm job id: {self.job_id!r}")

    def __call__(self) -> Allocation:
        out = self._run(self.squeue, "-h", "-j", self.job_id, "-o", "%T %N")
        if out is None:  # the scheduler did not answer: nothing is known, nothing changes
            return Allocation(UNKNOWN)
        fields = out.split()
        if not fields:
            return Allocation("GONE")
        state = fields[0]
        if len(fields) < 2 or state != "RUNNING":
            return Allocation(state)
        return Allocation(state, self.expand(fields[1]))

    def expand(self, nodelist: str) -> tuple[str, ...]:
        names = tuple((self._run(self.scontrol, "show", "hostnames", nodelist) or "").split())
        bad = [n for n in names if not NODE_NAME.match(n)]
        if bad:
            log.warning("allocation: refusing node names job_id=%s names=%s", self.job_id, bad[:3])
            return ()
        return names

    def _run(self, *argv: str) -> str | None:
        try:
            # own session: a terminal's Ctrl-C to the demo must not kill a client between its
            # request and slurmctld's reply (slurmctld logs that as an error)
            done = subprocess.run(
                argv,
                capture_output=True,
                text=True,
                env=dict(self.env),
                timeout=10,
                check=False,
                start_new_session=True,
            )
        except (OSError, subprocess.TimeoutExpired) as err:
            log.debug("allocation: %s failed err=%s", argv[0], err)
            return None
        return done.stdout if done.returncode == 0 else None

"""The agent's trust boundary for step datagrams: who sent it, may it say what it says.

The reader thread calls :meth:`SenderGate.admit` for every datagram with the
kernel's credentials of its sender (:mod:`stepwatch.agents.collectors.creds`):
per-process and per-user token buckets drop floods (reason ``rate_limited``),
then the sender's identity is looked up in ``/proc`` at once, while the
process surely still runs (:mod:`stepwatch.agents.collectors.procfs`; cached
per pid and start time). At each tick :meth:`SenderGate.check` compares what
a decoded record claims with what is known:

* ``host`` must be empty, the agent's host, one of its aliases or the
  machine's own host name (``host_mismatch`` otherwise); the agent stamps its
  own host on everything it forwards;
* the job must be one the sender runs (``job_mismatch``): its Slurm job from
  the cgroup when there is one (strong: only that job id passes), else any
  job id its environment names (``SLURM_JOB_ID``, ``STEPWATCH_JOB_ID``,
  ``TORCHELASTIC_RUN_ID``, a PyTorchJob pod name);
* the rank must be the one its environment gives (``STEPWATCH_RANK``, else
  ``RANK``), when it gives one (``rank_mismatch``);
* the GPU (a step's ``gpu``, else its ``local_rank``; an event's ``gpu``) must
  be one its ``CUDA_VISIBLE_DEVICES`` names, when that is numeric
  (``gpu_mismatch``): the agent labels that GPU's samples and XID events with
  the job that claims it.

A sender that had already exited when its datagram was read, and that the
agent never saw alive, is rejected (``sender_gone``) unless ``verify_job`` is
``off``: sending and exiting at once was a way around every check above. (A
rank seen alive keeps its identity for a while after it exits, so its final
``job_end`` verifies.) Where the agent cannot see every process (not root,
``hidepid``), a missing sender is not judged.

``verify_job`` decides what happens when nothing ties the sender to a job:
``off`` checks no job or rank at all, ``when_known`` (default) lets it
through, ``strict`` rejects it (``job_unverified``).
"""

from __future__ import annotations

import enum
import logging
import socket
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from stepwatch.agents.collectors.creds import Creds
from stepwatch.agents.collectors.procfs import IdentityCache, ProcFS, ProcIdentity
from stepwatch.agents.collectors.ratelimit import TokenBuckets
from stepwatch.errors import ConfigError

log = logging.getLogger(__name__)

LOGGED_SENDERS = 1024  # (reason, pid) pairs remembered for "logged once per sender"


class VerifyJob(enum.StrEnum):
    OFF = "off"
    WHEN_KNOWN = "when_known"
    STRICT = "strict"

    @classmethod
    def parse(cls, text: str) -> VerifyJob:
        try:
            return cls(text.strip().lower().replace("-", "_"))
        except ValueError as err:
            raise ConfigError(
                f"agent_verify_job must be off, when_known or strict, got {text!r}"
            ) from err


@dataclass(frozen=True)
class SenderPolicy:
    """What the gate enforces (from :class:`~stepwatch.settings.Settings`)."""

    verify_job: VerifyJob = VerifyJob.WHEN_KNOWN
    host_aliases: frozenset[str] = frozenset()
    sender_rate: float = 500.0  # datagrams per second per process; <= 0: no limit
    sender_burst: float = 1000.0
    user_rate: float = 4000.0  # datagrams per second per uid; <= 0: no limit
    user_burst: float = 8000.0
    proc_root: str = "/proc"


@dataclass(frozen=True)
class Sender:
    """A datagram's sender: the kernel's credentials and what /proc said at receipt."""

    creds: Creds | None = None
    identity: ProcIdentity | None = None
    gone: bool = False  # a visible pid /proc no longer shows, never seen alive


LOCAL = Sender()  # datagrams fed in-process (tests, replays): no credentials


def machine_names(hostname: Callable[[], str] = socket.gethostname) -> frozenset[str]:
    """This machine's own host name and its short form."""
    try:
        name = hostname()
    except OSError:
        return frozenset()
    return frozenset({name, name.split(".", 1)[0]} - {""})


DATAGRAM_UNIT = 2048  # bytes a rate-limit token pays for (see SenderGate.admit)


class SenderGate:
    """Rate limits and identity checks; see the module docstring."""

    def __init__(
        self,
        policy: SenderPolicy | None = None,
        *,
        proc: ProcFS | None = None,
        clock: Callable[[], float] | None = None,
        hostname: Callable[[], str] = socket.gethostname,
    ) -> None:
        self.policy = policy or SenderPolicy()
        clock = clock or time.monotonic
        self.identities = IdentityCache(proc or ProcFS(self.policy.proc_root), clock=clock)
        self.per_sender = TokenBuckets(
            self.policy.sender_rate, self.policy.sender_burst, clock=clock
        )
        self.per_user = TokenBuckets(self.policy.user_rate, self.policy.user_burst, clock=clock)
        self._names = machine_names(hostname) | self.policy.host_aliases
        # Whether this agent sees every process in /proc (root, no hidepid): then a sender
        # /proc does not show has exited, not hidden. Pid 1 is the probe.
        self._sees_all = self.identities.proc.start_time(1) is not None
        self._logged: OrderedDict[tuple[str, int], None] = OrderedDict()
        self.rate_limited = 0  # only the reader thread writes it

    # ------------------------------------------------------------------ reader thread
    def admit(self, creds: Creds | None, size: int = 0) -> Sender | None:
        """The datagram's sender, or None when its rate limit drops it (counted).

        A datagram of ``size`` bytes costs one token per started :data:`DATAGRAM_UNIT`
        (an SDK step is well under one): the limits bound the agent's decoding and spool
        bytes, not just datagrams (4,000 datagrams of 16 KiB a second cost the agent
        about 1.1 s of CPU and 61 MiB of spool)."""
        if creds is None:
            return LOCAL
        # pid 0: a sender outside the agent's pid namespace (run the agent with the host's)
        visible = creds.pid > 0
        cost = float(max(1, -(-size // DATAGRAM_UNIT)))
        sender_cost = min(cost, self.policy.sender_burst)  # never more than a full bucket
        user_cost = min(cost, self.policy.user_burst)
        if (visible and not self.per_sender.allow(creds.pid, sender_cost)) or not (
            self.per_user.allow(creds.uid, user_cost)
        ):
            self.rate_limited += 1
            self.log_once(
                "rate_limited",
                creds,
                "datagrams over the rate limit dropped rate_per_process=%s burst=%s",
                self.policy.sender_rate,
                self.policy.sender_burst,
            )
            return None
        if self.policy.verify_job is VerifyJob.OFF or not visible:
            return Sender(creds)
        ident = self.identities.get(creds.pid)
        return Sender(creds, ident, gone=ident is None and self._sees_all)

    # ------------------------------------------------------------------ tick
    def check(
        self,
        sender: Sender,
        own_host: str,
        host: str,
        job: str,
        rank: int | None,
        gpu: int | None = None,
    ) -> str | None:
        """The reason to reject a record from ``sender`` claiming ``host/job/rank/gpu``, or None."""
        if host and host != own_host and host not in self._names:
            return "host_mismatch"
        if self.policy.verify_job is VerifyJob.OFF:
            return None
        if sender.gone:  # sent and exited before the agent could look: nothing to verify
            return "sender_gone"
        reason = self._check_job(sender.identity, job, rank)
        ident = sender.identity
        if (
            reason is None
            and gpu is not None
            and ident is not None
            and ident.env_gpus is not None
            and gpu not in ident.env_gpus
        ):
            return "gpu_mismatch"
        return reason

    def _check_job(self, ident: ProcIdentity | None, job: str, rank: int | None) -> str | None:
        strict = self.policy.verify_job is VerifyJob.STRICT
        if ident is None or not ident.known:
            return "job_unverified" if strict else None
        if ident.pod_uid and ident.env_pod_uid and ident.pod_uid != ident.env_pod_uid:
            return "job_mismatch"  # the environment names another pod than the cgroup
        jobs = frozenset({ident.slurm_job}) if ident.slurm_job else ident.env_jobs
        if jobs and job not in jobs:
            return "job_mismatch"
        if rank is not None and ident.env_rank is not None and rank != ident.env_rank:
            return "rank_mismatch"
        if strict and not jobs:
            return "job_unverified"  # a pod, but no job id to compare with
        return None

    def close(self) -> None:
        """Release the pidfds the identity cache holds."""
        self.identities.close()

    # ------------------------------------------------------------------ logging
    def log_once(self, reason: str, creds: Creds | None, msg: str, *args: object) -> None:
        """Log ``msg`` the first time ``reason`` is seen from this sender (bounded memory)."""
        pid = creds.pid if creds else -1
        key = (reason, pid)
        if key in self._logged:
            return
        self._logged[key] = None
        if len(self._logged) > LOGGED_SENDERS:
            self._logged.popitem(last=False)
        who = f"pid={pid} uid={creds.uid} gid={creds.gid}" if creds else "pid=- uid=- gid=-"
        log.warning(
            "%s reason=%s %s (further ones from this sender counted, not logged)",
            msg % args if args else msg,
            reason,
            who,
        )


def parse_aliases(text: str) -> frozenset[str]:
    return frozenset(_split(text.split(",")))


def _split(items: Iterable[str]) -> Iterable[str]:
    return (s.strip() for s in items if s.strip())

"""Who a local process is, read from ``/proc``: its start time, Slurm job, pod, launcher env.

The steps collector learns each datagram's sender pid from the kernel
(``SCM_CREDENTIALS``, :mod:`stepwatch.agents.collectors.creds`) and asks this
module which job the process runs. Two sources, of different weight:

* ``/proc/<pid>/cgroup`` is written by the kernel and the job's launcher
  (slurmd's cgroup plugin puts every task of job 42 under a ``job_42``
  directory; the kubelet puts a pod's containers under ``pod<uid>``); a
  process cannot move itself into another user's job. This is **strong**
  evidence.
* ``/proc/<pid>/environ`` is the environment the process was started with
  (``SLURM_JOB_ID``, ``STEPWATCH_JOB_ID``, ``TORCHELASTIC_RUN_ID``, ``RANK``,
  ``POD_NAME``...). Whoever starts a process chooses it, so it catches a
  misconfigured or naive sender, not a determined one: **weak** evidence.

``/proc`` is injectable (``root``), so unit tests use fake trees. Nothing
here raises: an unreadable file (the process exited, another user's
``environ`` without privileges) is simply no evidence.
"""

from __future__ import annotations

import os
import re
import signal
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from stepwatch.sdk.identity import torchrun_job_id

# A job's or pod's cgroup counts only where the scheduler puts it: under Slurm's own root
# (v1 /slurm*/uid_N/job_N, v2 /system.slice/[node_]slurmstepd.scope/job_N) or the
# kubelet's (/kubepods...), folders only root can create. Anywhere else (a user's
# delegated subtree, user@UID.service: any login session) a process could make
# .../job_42/ or .../pod<uid>/ itself, move into it, and speak for that job.
_CGROUP_PATH = re.compile(r"^\d+:[^:\n]*:(/[^\n]*)$", re.M)
_SLURM_JOB = re.compile(
    r"^/(?:slurm[^/]*/uid_\d+|system\.slice/(?:[^/]+_)?slurmstepd\.scope)/job_(\d+)(?:/|$)"
)
# cgroupfs: /kubepods/burstable/pod0d2b9c1e-...; systemd: ...-pod0d2b9c1e_..._....slice
_POD_UID = re.compile(
    r"^/kubepods(?:\.slice)?/(?:[^/]+/)*?[^/]*pod"
    r"([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})(?:[./]|$)"
)
_PYTORCHJOB_POD = re.compile(r"^(?P<job>.+)-(?:master|worker)-\d+$")
MAX_READ = 256 * 1024  # environ and cgroup files are small; never read more


@dataclass(frozen=True)
class ProcIdentity:
    """What /proc says about one process (empty fields: not known)."""

    pid: int
    start_time: int = 0  # clock ticks after boot (field 22 of /proc/<pid>/stat)
    slurm_job: str = ""  # from the cgroup path (strong)
    pod_uid: str = ""  # from the cgroup path (strong)
    env_jobs: frozenset[str] = frozenset()  # job ids the environment names (weak)
    env_rank: int | None = None  # STEPWATCH_RANK, else RANK
    env_pod_uid: str = ""  # POD_UID from the downward API, when set
    env_gpus: frozenset[int] | None = None  # CUDA_VISIBLE_DEVICES when all numeric
    environ_readable: bool = False

    @property
    def known(self) -> bool:
        """Whether anything ties this process to a job."""
        return bool(self.slurm_job or self.pod_uid or self.env_jobs)


class ProcFS:
    """Reads ``<root>/<pid>/{stat,cgroup,environ}``; never raises."""

    def __init__(self, root: str | os.PathLike[str] = "/proc") -> None:
        self.root = Path(root)
        self._prefix = str(self.root) + "/"  # string paths: pathlib costs more than the read
        self._live = self.root == Path("/proc") and hasattr(os, "pidfd_open")

    @property
    def live(self) -> bool:
        """Whether this is the system's /proc, with pidfds (not a fake tree in tests)."""
        return self._live

    def pin(self, pid: int) -> int:
        """A pidfd holding this process (its pid is not reused while it lives); -1 on a
        fake tree, where pidfds are unavailable, or when the process is gone."""
        if not self._live:
            return -1
        try:
            return os.pidfd_open(pid)
        except OSError:
            return -1

    def _read(self, pid: int, name: str) -> bytes | None:
        try:
            fd = os.open(f"{self._prefix}{pid}/{name}", os.O_RDONLY)
        except OSError:
            return None
        try:
            return os.read(fd, MAX_READ)
        except OSError:
            return None
        finally:
            os.close(fd)

    def _stat(self, pid: int) -> list[bytes]:
        """The fields of ``<pid>/stat`` after the command name ([] when it is gone): the
        name (field 2) may hold spaces and ')', so they are split after the last ')'.
        Index 0 is the state (field 3), 19 the start time (22), 49 the exit code (52)."""
        raw = self._read(pid, "stat")
        return raw[raw.rfind(b")") + 2 :].split() if raw else []

    def start_time(self, pid: int) -> int | None:
        """The process's start time in clock ticks, or None when it is gone."""
        try:
            return int(self._stat(pid)[19])
        except (IndexError, ValueError):
            return None

    def alive_as(self, pid: int, start_time: int) -> bool:
        """Whether ``pid`` is still the process that started at ``start_time`` and has
        not ended (not a zombie waiting for its parent)."""
        fields = self._stat(pid)
        try:
            return fields[0] != b"Z" and int(fields[19]) == start_time
        except (IndexError, ValueError):
            return False

    def exit_status(self, pid: int, start_time: int) -> int | None:
        """How a process that just ended ended, as ``waitpid`` would say (field 52 of its
        stat: the kernel keeps it while the process waits for its parent to reap it),
        or None once reaped (the pid gone, or another process's now). Shown only to a
        reader that may ptrace the process (root, or its own user): 0 to any other."""
        fields = self._stat(pid)
        try:
            if fields[0] != b"Z" or int(fields[19]) != start_time:
                return None
            return int(fields[49])
        except (IndexError, ValueError):
            return None

    def identity(self, pid: int) -> ProcIdentity | None:
        start = self.start_time(pid)
        if start is None:
            return None
        slurm, pod = _from_cgroup(self._read(pid, "cgroup") or b"")
        raw_env = self._read(pid, "environ")
        env = _parse_environ(raw_env or b"")
        return ProcIdentity(
            pid=pid,
            start_time=start,
            slurm_job=slurm,
            pod_uid=pod,
            env_jobs=env_jobs(env),
            env_rank=env_rank(env),
            env_pod_uid=env.get("POD_UID", "").strip().lower(),
            env_gpus=env_gpus(env),
            environ_readable=raw_env is not None,
        )


def _from_cgroup(raw: bytes) -> tuple[str, str]:
    """The Slurm job and the pod uid of ``/proc/<pid>/cgroup``, each from the first line
    whose path sits under the scheduler's own root ("" when none does)."""
    job = pod = ""
    for path in _CGROUP_PATH.findall(raw.decode("utf-8", "replace")):
        slurm = None if job else _SLURM_JOB.match(path)
        found = None if pod else _POD_UID.match(path)
        job = slurm.group(1) if slurm else job
        pod = found.group(1).replace("_", "-") if found else pod
    return job, pod


# the variables the identity reads (env_jobs, env_rank, env_gpus, POD_UID)
ENV_KEYS = (
    "STEPWATCH_JOB_ID",
    "SLURM_JOB_ID",
    "TORCHELASTIC_RUN_ID",
    "MASTER_ADDR",
    "MASTER_PORT",
    "POD_NAME",
    "POD_NAMESPACE",
    "POD_UID",
    "CUDA_VISIBLE_DEVICES",
    "STEPWATCH_RANK",
    "RANK",
)
_ENV_NEEDLES = tuple((k, b"\0" + k.encode() + b"=") for k in ENV_KEYS)


def _parse_environ(raw: bytes) -> dict[str, str]:
    """The :data:`ENV_KEYS` of a ``/proc/<pid>/environ`` (the last of a repeated one).

    Found by one search per variable, not a dict of every variable: a sender with an
    environment of 20,000 variables made each identity lookup cost milliseconds (the
    figures: ``python bench/bench_agent_identity.py``), and a user cycling 300 pids
    through the cache held the socket's reader to 220 datagrams a second, under every
    rate limit, while other jobs' steps were dropped."""
    padded = b"\0" + raw
    out: dict[str, str] = {}
    for key, needle in _ENV_NEEDLES:
        at = padded.rfind(needle)
        if at >= 0:
            begin = at + len(needle)
            end = padded.find(b"\0", begin)
            out[key] = padded[begin : end if end >= 0 else len(padded)].decode("utf-8", "replace")
    return out


def env_jobs(env: Mapping[str, str]) -> frozenset[str]:
    """Every job id the SDK could take from this environment (see sdk/identity.py)."""
    jobs = {
        env.get(v, "").strip() for v in ("STEPWATCH_JOB_ID", "SLURM_JOB_ID", "TORCHELASTIC_RUN_ID")
    }
    match = _PYTORCHJOB_POD.match(env.get("POD_NAME", ""))
    if match:
        namespace = env.get("POD_NAMESPACE", "")
        jobs.add(f"{namespace}/{match.group('job')}" if namespace else match.group("job"))
    jobs.add(torchrun_job_id(env))  # torchrun without --rdzv-id: its store's address
    return frozenset(j for j in jobs if j and j != "none")  # torchrun's default run id


def env_gpus(env: Mapping[str, str]) -> frozenset[int] | None:
    """The physical GPUs ``CUDA_VISIBLE_DEVICES`` gives, when it is set and all numeric
    (UUIDs and MIG names: None, no evidence)."""
    items = [v.strip() for v in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    if not items or not all(v.isdigit() for v in items):
        return None
    return frozenset(int(v) for v in items)


def env_rank(env: Mapping[str, str]) -> int | None:
    """The rank the environment gives (STEPWATCH_RANK, else RANK), if any."""
    for var in ("STEPWATCH_RANK", "RANK"):
        raw = env.get(var, "").strip()
        if raw.isdigit():
            return int(raw)
    return None


class IdentityCache:
    """pid -> :class:`ProcIdentity`, keyed on pid *and* start time (pids are reused).

    An entry lives ``ttl`` seconds; a process that has exited keeps its last
    entry until then (its final datagrams still verify). On the real /proc
    each entry holds a pidfd: while it says the process lives, its pid cannot
    have been reused and nothing is read; otherwise the start time is read
    again. At most ``max_entries`` pids are held (the oldest go first).
    """

    def __init__(
        self,
        proc: ProcFS,
        *,
        ttl: float = 30.0,
        max_entries: int = 256,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.proc = proc
        self.ttl = ttl
        self.max_entries = max_entries
        self._clock = clock
        self._entries: OrderedDict[int, tuple[float, ProcIdentity, int]] = OrderedDict()
        self.lookups = 0  # /proc reads of a whole identity (cache misses)

    def get(self, pid: int) -> ProcIdentity | None:
        now = self._clock()
        entry = self._entries.get(pid)
        if entry is not None and now < entry[0]:
            if entry[2] >= 0 and _alive(entry[2]):
                return entry[1]
            start = self.proc.start_time(pid)
            if start in (None, entry[1].start_time):
                return entry[1]  # the same process (or it just exited)
        else:
            start = self.proc.start_time(pid)
        if start is None:
            return None
        found = self.proc.identity(pid)
        self.lookups += 1
        if found is None:
            return None
        self._put(pid, now, found)
        return found

    def _put(self, pid: int, now: float, found: ProcIdentity) -> None:
        fd = self.proc.pin(pid)
        if fd >= 0 and self.proc.start_time(pid) != found.start_time:  # gone meanwhile
            os.close(fd)
            fd = -1
        old = self._entries.pop(pid, None)
        if old is not None and old[2] >= 0:
            os.close(old[2])
        self._entries[pid] = (now + self.ttl, found, fd)
        while len(self._entries) > self.max_entries:
            _, (_, _, evicted) = self._entries.popitem(last=False)
            if evicted >= 0:
                os.close(evicted)

    def close(self) -> None:
        for _, _, fd in self._entries.values():
            if fd >= 0:
                os.close(fd)
        self._entries.clear()


def _alive(pidfd: int) -> bool:
    """Whether the process a pidfd holds has not exited (a zombie still holds its pid)."""
    try:
        signal.pidfd_send_signal(pidfd, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # EPERM: it exists, we may not signal it
    return True

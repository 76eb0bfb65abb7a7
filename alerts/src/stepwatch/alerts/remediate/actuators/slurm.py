"""Slurm through ``scontrol``: drain a node, requeue a job excluding a node.

- node state: ``scontrol show node N -o``, which must describe exactly node N
  (a name Slurm would expand, ALL or a NodeSet, is refused).
- the job's owner, state, nodes and exclusions: ``squeue --jobs=J
  --format=%A|%i|%u|%T|%N|%x``, keeping the one row whose own job id (``%A``) or
  task id (``%i``, ``A_T``) is J, its node list expanded by ``scontrol show
  hostnames <NodeList>``. An array's last task has the array's id as its
  ``SLURM_JOB_ID``, and ``squeue --jobs=<array id>`` lists every task: before,
  an alert from that task requeued the whole array. Every ``scontrol`` call
  names the row's task id (``7_3``), never the array's. A job counts as on its
  nodes only while running (a finished job keeps its old node list in squeue
  for a while: a stale alert drained its former node). Not ``scontrol show job -o``: it
  prints the job's name (the user's free text) before its other fields, so a
  job named ``x NodeList=gpu-077 UserId=root(0)`` named a node it never ran on,
  and an owner, for anyone reading the first ``NodeList=``.
- drain: ``scontrol update nodename=N state=drain reason="stepwatch: ..."``
- requeue: ``scontrol requeuehold J`` (back to pending, held), ``scontrol update
  jobid=J ExcNodeList=...`` (the job's exclusions plus the node), ``scontrol
  release J``. Holding first means the job cannot start again before the
  exclusion is in place. A job already pending gets the exclusion alone: it is
  never held or released (a release lifted a hold its owner had placed). The
  job resumes from its last checkpoint the way it always does on a restart
  (``SLURM_RESTART_COUNT`` is set by Slurm).

Every node name and job id is checked against :mod:`..identity` right before
its argv is built (the engine checked it already: defence in depth).

Failures are told apart: a controller that does not answer or is busy is
transient; an unknown node or job, or a refusal, is permanent.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from stepwatch.alerts.remediate.actuators.base import NodeState
from stepwatch.alerts.remediate.identity import require_job, require_node
from stepwatch.errors import ActuatorError

log = logging.getLogger(__name__)

Runner = Callable[
    [Sequence[str], float, "Mapping[str, str] | None"], "subprocess.CompletedProcess[str]"
]
_TRANSIENT = (
    "unable to contact slurm controller",
    "socket timed out",
    "temporarily unavailable",
    "slurm_persist_conn",
    "connection refused",
    "resource busy",
    "try again",
    "zero bytes were transmitted or received",
    "communication connection failure",
    "transport endpoint is not connected",
    "connection reset",
)
_FIELD = re.compile(r"(\w+)=")
_HOSTLIST = re.compile(r"^[A-Za-z0-9._,\[\]-]{1,4096}$")  # a NodeList as scontrol prints it
# what the actuator reads of a job, no field its owner writes (a name, a comment, a path)
JOB_FORMAT = "%A|%i|%u|%T|%N|%x"
RUNNING = frozenset({"RUNNING", "SUSPENDED", "CONFIGURING", "COMPLETING"})
# a node out of service, by whoever put it there: drained, or a person's (or slurmctld's)
# DOWN, FAIL or maintenance. Draining one of those wrote stepwatch's reason over a person's
# ("bob: GPU RMA"), made the node read as stepwatch's, and took the breaker's slot
OUT_OF_SERVICE = frozenset({"DRAIN", "DRAINED", "DRAINING", "DOWN", "FAIL", "FAILING", "MAINT"})
DRAINED = frozenset({"DRAIN", "DRAINED", "DRAINING"})
# ... but not slurmctld's own DOWN of a node that stopped answering (a hung GPU node, the
# very thing an alert is about): that one is not a person's word, and with ReturnToService
# the node comes back into service by itself; a drain keeps it out (DOWN+DRAIN). As
# slurmctld writes it: "State=DOWN+NOT_RESPONDING Reason=Not responding [slurm@...]".
# Matched exactly (a person's reason may begin with the same words) and only on a plain
# DOWN: a FAIL or MAINT is a person's whatever the reason says.
PERSONS = frozenset({"FAIL", "FAILING", "MAINT"}) | DRAINED


def _slurmctlds_down(states: set[str], reason: str) -> bool:
    """slurmctld's own DOWN of a node that stopped answering or rebooted unasked."""
    if "DOWN" not in states or states & PERSONS:
        return False
    text = reason.lower()
    if text == "not responding":
        return "NOT_RESPONDING" in states
    # "Node unexpectedly rebooted boot_time=N last response=N": the words after it read
    # as fields of their own (scontrol -o), so the reason is these words exactly
    return text == "node unexpectedly rebooted"


OUR_HOLDS = ("job requeued in held state", "JobHeldAdmin")  # squeue %r after requeuehold
_UNSET = ("", "(null)", "N/A")
RELEASE_TRIES, RELEASE_PAUSE_S = 3, 0.5  # a held job's release, on transient failures


@dataclass(frozen=True)
class JobRow:
    """One job (or array task) as ``squeue --format=JOB_FORMAT`` prints it."""

    own: str  # the job's own id (%A): unique, an array task's too
    job: str  # the job or array task id (%i): 42, or 7_3
    user: str
    state: str
    nodes: str  # a host-list expression ("" while pending)
    excluded: str  # the job's ExcNodeList ("" when none)


def run_command(
    argv: Sequence[str], timeout: float, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        list(argv),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env=None if env is None else dict(env),
    )


class SlurmActuator:
    name = "slurm"

    def __init__(
        self,
        scontrol: str = "scontrol",
        sinfo: str = "sinfo",
        timeout: float = 20.0,
        runner: Runner = run_command,
        conf: str = "",
        squeue: str = "",
    ) -> None:
        self.scontrol = scontrol
        self.sinfo = sinfo
        # beside scontrol when that is a path (/opt/slurm/bin/scontrol), else on PATH
        self.squeue = squeue or os.path.join(os.path.dirname(scontrol), "squeue")
        self.timeout = timeout
        self.runner = runner
        self.env = (
            {**os.environ, "SLURM_CONF": conf} if conf else None
        )  # else the default slurm.conf

    def _run(self, argv: Sequence[str]) -> str:
        try:
            done = self.runner(argv, self.timeout, self.env)
        except FileNotFoundError as err:
            raise ActuatorError(f"{argv[0]} not found", transient=False) from err
        except subprocess.TimeoutExpired as err:
            raise ActuatorError(
                f"{' '.join(argv[:3])} timed out after {self.timeout:.0f} s", transient=True
            ) from err
        if done.returncode != 0:
            text = (done.stderr or done.stdout or "").strip()
            transient = any(t in text.lower() for t in _TRANSIENT)
            raise ActuatorError(
                f"{' '.join(argv[:3])} failed ({done.returncode}): {text}", transient=transient
            )
        return done.stdout

    def node_state(self, node: str) -> NodeState:
        try:
            out = self._run([self.scontrol, "show", "node", require_node(node), "-o"])
        except ActuatorError as err:
            text = str(err).lower()
            if not err.transient and ("invalid node name" in text or "not found" in text):
                return NodeState(False, False)
            raise
        records = [line for line in out.splitlines() if line.strip()]
        fields = parse_fields(records[0]) if records else {}
        if len(records) != 1 or fields.get("NodeName") != node:
            raise ActuatorError(
                f"scontrol show node {node}: not exactly that one node ({len(records)} record(s))",
                transient=False,
            )
        shown = fields.get("State", "").upper()
        states = set(shown.replace("*", "").split("+"))
        if "*" in shown:  # sinfo's and older scontrol's mark of a node not responding
            states.add("NOT_RESPONDING")
        reason = re.sub(r"\s*\[[^\]]*@[^\]]*\]$", "", fields.get("Reason", "")).strip()
        reason = "" if reason == "(null)" else reason
        daemons = _slurmctlds_down(states, reason)
        return NodeState(True, bool(states & OUT_OF_SERVICE) and not daemons, reason)

    def node_count(self) -> int:
        out = self._run([self.sinfo, "-h", "-N", "-o", "%N"])
        return len({line.strip() for line in out.splitlines() if line.strip()})

    def drain(self, node: str, reason: str) -> str:
        self._run(
            [
                self.scontrol,
                "update",
                f"nodename={require_node(node)}",
                "state=drain",
                f"reason={reason}",
            ]
        )
        return f"scontrol drained {node}"

    def job_owner(self, job_id: str) -> str:
        return self._job(job_id).user

    def job_nodes(self, job_id: str) -> frozenset[str]:
        """The nodes the job runs on, expanded by Slurm; none unless it is running."""
        row = self._job(job_id)
        if row.state not in RUNNING or row.nodes in _UNSET:
            return frozenset()  # pending, or finished with its old node list
        if not _HOSTLIST.fullmatch(row.nodes):
            raise ActuatorError(f"squeue job {job_id}: unexpected NodeList", transient=False)
        out = self._run([self.scontrol, "show", "hostnames", row.nodes])
        return frozenset(n.strip() for n in out.splitlines() if n.strip())

    def _job(self, job_id: str) -> JobRow:
        """The job's own row (of an array's, the task whose id it is); an unknown job is a
        permanent failure."""
        argv = [
            self.squeue,
            "--noheader",
            "--array",
            "--states=all",
            f"--jobs={require_job(job_id)}",
            f"--format={JOB_FORMAT}",
        ]
        rows: list[JobRow] = []
        for line in self._run(argv).splitlines():
            if not line.strip():
                continue
            parts = line.strip().split("|")
            if len(parts) != 6:
                raise ActuatorError(f"squeue job {job_id}: unexpected line", transient=False)
            rows.append(JobRow(*parts))
        mine = [r for r in rows if job_id in (r.own, r.job)]
        if len(mine) != 1:
            raise ActuatorError(f"squeue job {job_id}: no such job", transient=False)
        require_job(mine[0].job)  # what every scontrol call below names
        return mine[0]

    def requeue(self, job_id: str, exclude_node: str) -> str:
        require_node(exclude_node)
        row = self._job(job_id)
        task = row.job
        excluded = set(self._hostnames(row.excluded, job_id)) | {exclude_node}
        update = self._exclusion(task, excluded)
        if row.state not in RUNNING:
            self._run(update)  # pending (or held by its owner): the exclusion alone
            return f"job {task} {row.state.lower()}: excluding {','.join(sorted(excluded))}"
        self._run([self.scontrol, "requeuehold", task])
        try:
            self._run(update)
        finally:
            self._release(task)
        return (
            f"job {task} requeued from {row.state.lower()} excluding {','.join(sorted(excluded))}"
        )

    def release_interrupted(self, job_id: str, exclude_node: str) -> str:
        """Finish a requeue a stopped remediator left after ``requeuehold``: a job held as
        ``requeuehold`` leaves it (reason ``job requeued in held state``, or
        ``JobHeldAdmin``; a hold of its owner's reads ``JobHeldUser`` and is left alone)
        gets the exclusion and is released."""
        row = self._job(job_id)
        argv = [self.squeue, "--noheader", "--array", "--states=all", f"--jobs={row.job}"]
        lines = self._run([*argv, "--format=%i|%r"]).splitlines()
        if not {f"{row.job}|{r}" for r in OUR_HOLDS} & {ln.strip() for ln in lines}:
            return f"job {row.job} {row.state.lower()}, not held by an administrator: left as is"
        excluded = set(self._hostnames(row.excluded, job_id)) | {require_node(exclude_node)}
        self._run(self._exclusion(row.job, excluded))
        self._release(row.job)
        return f"job {row.job} released excluding {','.join(sorted(excluded))}"

    def _exclusion(self, task: str, excluded: set[str]) -> list[str]:
        """``scontrol update`` setting the job's (task's) excluded nodes."""
        return [
            self.scontrol,
            "update",
            f"jobid={task}",
            f"ExcNodeList={','.join(sorted(excluded))}",
        ]

    def _hostnames(self, hostlist: str, job_id: str) -> list[str]:
        """A job's node list as squeue prints it (``node[01,03]``), expanded by Slurm: split
        on commas it made ``node[01`` and ``03]``, and the update was refused."""
        if not hostlist or hostlist in _UNSET:
            return []
        if not _HOSTLIST.fullmatch(hostlist):
            raise ActuatorError(f"squeue job {job_id}: unexpected ExcNodeList", transient=False)
        out = self._run([self.scontrol, "show", "hostnames", hostlist])
        return [n.strip() for n in out.splitlines() if n.strip()]

    def _release(self, job_id: str) -> None:
        """Release the held job, tried again on a transient failure: a job left held is
        a job stopped, and the next try finds it not running and so does nothing."""
        for attempt in range(RELEASE_TRIES):
            try:
                self._run([self.scontrol, "release", job_id])
                return
            except ActuatorError as err:
                if not err.transient or attempt == RELEASE_TRIES - 1:
                    raise ActuatorError(
                        f"job {job_id} left held (release it by hand): {err}", transient=False
                    ) from err
                time.sleep(RELEASE_PAUSE_S * (attempt + 1))


def parse_fields(text: str) -> dict[str, str]:
    """``key=value`` pairs of ``scontrol show ... -o`` (values may hold spaces, e.g. Reason)."""
    out: dict[str, str] = {}
    matches = list(_FIELD.finditer(text))
    for i, found in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(text)
        out.setdefault(found.group(1), text[found.end() : end].strip())
    return out

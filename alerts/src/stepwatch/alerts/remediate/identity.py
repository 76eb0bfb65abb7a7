"""Which node names and job ids may reach a scheduler command. Pure and strict.

Slurm expands host-list expressions wherever it takes a node name
(``gpu-[001-100]``, ``a,b,c``, ``ALL``, a NodeSet name) and job-id lists
(``1,2,3``, ``123_[1-5]``). A name from an alert's labels is therefore
checked against a closed pattern before any command is built: in the engine
when the alert arrives and again in each actuator right before its argv
(defence in depth). See docs/security.md, "Boundary 3: the remediator".
"""

from __future__ import annotations

import re

from stepwatch.errors import ActuatorError

NODE_MAX = 63  # a host name label (HOST_NAME_MAX 64 with the NUL)
NODE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
SLURM_JOB = re.compile(r"^[0-9]{1,10}(_[0-9]{1,10})?$")  # 123 or an array task 123_4
LABEL_JOB = re.compile(
    r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$"
)  # a Kubernetes label value
NAMESPACE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")  # a Kubernetes namespace
OWNER = re.compile(r"^[A-Za-z0-9._@-]{1,64}$")
_RESERVED = {"all", "none", "(null)", "localhost"}  # names the scheduler reads specially
_TEXT = re.compile(r"[^A-Za-z0-9 _.,:/@#%+()-]+")
_WORD = re.compile(r"[^A-Za-z0-9_.:-]+")


def node_ok(node: str) -> bool:
    return bool(NODE.fullmatch(node)) and node.lower() not in _RESERVED


def job_ok(job_id: str, scheme: str = "slurm") -> bool:
    """``scheme`` "slurm": a Slurm job id; "label": a plain label value (Kubernetes,
    command, log), or ``namespace/value`` (the SDK's id of a Kubeflow PyTorchJob pod)."""
    if scheme == "slurm":
        return bool(SLURM_JOB.fullmatch(job_id)) and job_id.lower() not in _RESERVED
    namespace, slash, name = job_id.rpartition("/")
    if slash and not NAMESPACE.fullmatch(namespace):  # "/train7": a second spelling of train7
        return False
    return bool(LABEL_JOB.fullmatch(name)) and name.lower() not in _RESERVED


def canonical_job(job_id: str, scheme: str = "slurm") -> str:
    """One spelling per job: Slurm reads ``042`` as job 42, so cooldowns counted ``42``,
    ``042`` and ``0042`` as three jobs (three requeues of one)."""
    if scheme == "slurm" and SLURM_JOB.fullmatch(job_id):
        return "_".join(str(int(part)) for part in job_id.split("_"))
    return job_id


def scheme_of(actuator_name: str) -> str:
    """The job-id scheme an actuator takes: Slurm ids for Slurm, plain label values otherwise."""
    return "slurm" if actuator_name == "slurm" else "label"


def problem(node: str, job_id: str, scheme: str = "slurm") -> str:
    """'' when both are acceptable (an empty job is allowed here), else what is wrong."""
    if node and not node_ok(node):
        return f"host label is not one plain node name ({shown(node)})"
    if job_id and not job_ok(job_id, scheme):
        return f"job_id label is not one plain {scheme} job id ({shown(job_id)})"
    return ""


def require_node(node: str) -> str:
    """The actuator's last check before an argv: raise (permanent) unless one plain node name."""
    if not node_ok(node):
        raise ActuatorError(
            f"refusing node name {shown(node)}: not one plain node name", transient=False
        )
    return node


def require_job(job_id: str, scheme: str = "slurm") -> str:
    if not job_ok(job_id, scheme):
        raise ActuatorError(
            f"refusing job id {shown(job_id)}: not one plain {scheme} job id", transient=False
        )
    return job_id


def shown(value: str, limit: int = 40) -> str:
    """A sender-chosen value safe to log or record: printable, bounded, quoted."""
    return repr(value[:limit] + ("..." if len(value) > limit else ""))


def text(value: str, limit: int = 200) -> str:
    """Free text from an alert (a summary) reduced to a bounded, plain line."""
    return " ".join(_TEXT.sub(" ", value).split())[:limit]


def word(value: str, limit: int = 64) -> str:
    """A label used as a word (alertname, cause): plain characters, bounded."""
    return _WORD.sub("_", value)[:limit]

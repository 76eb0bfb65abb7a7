"""A recording fake ``scontrol``/``sinfo``/``squeue`` for the remediator's attack tests.

:func:`install` writes two small executables into a folder (put it first on
PATH) that answer like Slurm 22.05 does (formats copied from a real
``scontrol`` of the local test cluster), keep the cluster's state in a JSON
file and append every argv to a log. Like the real thing they expand
host-list expressions (``gpu-[001-100]``, ``a,b``) wherever a node name is
taken and ``ALL`` in ``update nodename=``, so a hole shows up as nodes drained.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SCRIPT = r"""#!{python}
import json, re, sys
STATE, CALLS = {state!r}, {calls!r}
with open(CALLS, "a") as f:
    f.write(json.dumps(sys.argv) + "\n")
with open(STATE) as f:
    st = json.load(f)

def expand(expr):
    out, depth, part = [], 0, ""
    for ch in expr + ",":
        if ch == "," and depth == 0:
            m = re.fullmatch(r"(.*)\[([^\]]*)\](.*)", part)
            if not m:
                out.append(part)
            else:
                for rng in m.group(2).split(","):
                    lo, _, hi = rng.partition("-")
                    for i in range(int(lo), int(hi or lo) + 1):
                        out.append(f"{{m.group(1)}}{{str(i).zfill(len(lo))}}{{m.group(3)}}")
            part = ""
            continue
        depth += ch == "["
        depth -= ch == "]"
        part += ch
    return [n for n in out if n]

def node_line(n):
    drained = st["drained"].get(n)
    state = ("ALLOCATED" if any(n in expand(j["nodes"]) for j in st["jobs"].values()) else "IDLE")
    state += "+DRAIN" if drained is not None else ""
    reason = f" Reason={{drained}} [root@2026-11-25T15:58:21]" if drained is not None else ""
    return (f"NodeName={{n}} Arch=x86_64 CoresPerSocket=1  CPUAlloc=1 CPUEfctv=1 CPUTot=1 "
            f"CPULoad=0.36 AvailableFeatures=(null) ActiveFeatures=(null) Gres=(null) "
            f"NodeAddr={{n}} NodeHostName={{n}} Version=22.05.8 OS=Linux 6.1.0 #1 SMP  "
            f"RealMemory=1 AllocMem=0 FreeMem=22548 Sockets=1 "
            f"Boards=1 State={{state}} ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A "
            f"Partitions=debug  BootTime=2026-11-25T15:47:20 SlurmdStartTime=2026-11-25T15:58:21 "
            f"LastBusyTime=2026-11-25T15:58:21 CfgTRES=cpu=1,mem=1M,billing=1 AllocTRES=cpu=1 "
            f"CapWatts=n/a CurrentWatts=0 AveWatts=0 ExtSensorsJoules=n/s ExtSensorsWatts=0 "
            f"ExtSensorsTemp=n/s{{reason}}")

def job_line(jid, j):
    return (f"JobId={{jid}} JobName=wrap UserId={{j.get('user', 'ada')}}(1000) GroupId=ada(1000) "
            f"MCS_label=N/A Priority=4294901759 Nice=0 Account=(null) QOS=(null) JobState=RUNNING "
            f"Reason=None Dependency=(null) Requeue=1 Restarts={{j.get('restarts', 0)}} "
            f"BatchFlag=1 Reboot=0 ExitCode=0:0 RunTime=00:00:01 TimeLimit=UNLIMITED TimeMin=N/A "
            f"Partition=debug AllocNode:Sid=localhost:3599 ReqNodeList=(null) "
            f"ExcNodeList={{j.get('exclude') or '(null)'}} NodeList={{j['nodes']}} BatchHost=x "
            f"NumNodes=2 NumCPUs=2 NumTasks=2 CPUs/Task=1 TRES=cpu=2,node=2,billing=2")

def fail(text, out=False):
    print(text, file=sys.stdout if out else sys.stderr)
    sys.exit(1)

def save():
    with open(STATE, "w") as f:
        json.dump(st, f)

args = sys.argv[1:]
if sys.argv[0].endswith("sinfo"):
    print("\n".join(st["nodes"]))
    sys.exit(0)
if sys.argv[0].endswith("squeue"):  # --noheader --array --states=all --jobs=J --format=...
    jid = next(a.split("=", 1)[1] for a in args if a.startswith("--jobs="))
    fmt = next(a.split("=", 1)[1] for a in args if a.startswith("--format="))
    if fmt != "%A|%i|%u|%T|%N|%x":
        fail(f"fake squeue: unexpected format {{fmt}}")
    if jid not in st["jobs"]:
        fail("slurm_load_jobs error: Invalid job id specified")
    j = st["jobs"][jid]
    state, user, excluded = j.get("state", "RUNNING"), j.get("user", "ada"), j.get("exclude")
    print(f"{{jid}}|{{jid}}|{{user}}|{{state}}|{{j['nodes']}}|{{excluded or ''}}")
    sys.exit(0)
if args[:2] == ["show", "node"]:
    lines = []
    for n in expand(args[2]):
        if n not in st["nodes"]:
            fail(f"Node {{n}} not found", out=True)
        lines.append(node_line(n))
    print("\n".join(lines))
elif args[:2] == ["show", "job"]:
    if args[2] not in st["jobs"]:
        fail("slurm_load_jobs error: Invalid job id specified")
    print(job_line(args[2], st["jobs"][args[2]]))
elif args[:2] == ["show", "hostnames"]:
    print("\n".join(expand(args[2])))
elif args[0] == "update" and args[1].startswith("nodename="):
    expr = args[1].split("=", 1)[1]
    names = st["nodes"] if expr.upper() == "ALL" else expand(expr)
    if any(n not in st["nodes"] for n in names):
        fail("Invalid node name specified")
    reason = next((a.split("=", 1)[1] for a in args if a.startswith("reason=")), "")
    for n in names:
        if "state=resume" in args:
            st["drained"].pop(n, None)
        else:
            st["drained"][n] = reason
    save()
elif args[0] == "update" and args[1].startswith("jobid="):
    for jid in args[1].split("=", 1)[1].split(","):
        if jid in st["jobs"]:
            st["jobs"][jid]["exclude"] = args[2].split("=", 1)[1]
    save()
elif args[0] in ("requeuehold", "hold", "release", "requeue"):
    ids = list(st["jobs"]) if args[1].upper() == "ALL" else args[1].split(",")
    for jid in ids:
        if jid not in st["jobs"]:
            fail(f"Invalid job id specified for job {{jid}}")
        if args[0] != "release":
            st["requeued"].append(jid)
    save()
else:
    fail("invalid keyword")
"""


@dataclass
class FakeSlurm:
    folder: Path

    @property
    def state_file(self) -> Path:
        return self.folder / "cluster.json"

    def state(self) -> dict[str, Any]:
        doc: dict[str, Any] = json.loads(self.state_file.read_text())
        return doc

    def calls(self) -> list[list[str]]:
        log = self.folder / "calls.log"
        if not log.exists():
            return []
        return [json.loads(line)[1:] for line in log.read_text().splitlines()]

    def drained(self) -> dict[str, str]:
        drained: dict[str, str] = self.state()["drained"]
        return drained

    def requeued(self) -> list[str]:
        requeued: list[str] = self.state()["requeued"]
        return requeued

    def set_owner(self, job: str, user: str) -> None:
        """The user Slurm names as ``job``'s owner (``ada`` unless set)."""
        doc = self.state()
        doc["jobs"][job]["user"] = user
        self.state_file.write_text(json.dumps(doc))

    def acting_calls(self) -> list[list[str]]:
        """Calls that change the cluster (update, requeue, hold, release)."""
        return [
            c for c in self.calls() if c and c[0] not in ("show", "--noheader") and "-h" not in c
        ]


def install(folder: Path, nodes: list[str], jobs: dict[str, str]) -> FakeSlurm:
    """Fake ``scontrol``, ``sinfo`` and ``squeue`` in ``folder``; ``jobs``: job id -> NodeList
    expression."""
    folder.mkdir(parents=True, exist_ok=True)
    fake = FakeSlurm(folder)
    fake.state_file.write_text(
        json.dumps(
            {
                "nodes": nodes,
                "drained": {},
                "requeued": [],
                "jobs": {j: {"nodes": n} for j, n in jobs.items()},
            }
        )
    )
    text = SCRIPT.format(
        python=sys.executable, state=str(fake.state_file), calls=str(folder / "calls.log")
    )
    for name in ("scontrol", "sinfo", "squeue"):
        path = folder / name
        path.write_text(text)
        path.chmod(0o755)
    return fake

"""A sender that exits before the agent reads its datagram (agent, Boundary 1).

Before: the agent looked the sender up in /proc when it read the datagram; a
process that sent and exited at once (or had its parent reap it) left no
/proc entry, and with ``--verify-job when_known`` (the default) "nothing ties
it to a job" let it speak for any job and rank on the host. The datagrams go
through the real socket (the kernel's credentials name this process); the
fake /proc tree is the one the agent would find after the sender exited.
"""

from __future__ import annotations

import os
import shutil
import socket
import time
from pathlib import Path

from stepwatch.agents.collectors.base import HostContext
from stepwatch.agents.collectors.senders import SenderGate, SenderPolicy
from stepwatch.agents.collectors.steps import StepsCollector
from stepwatch.contract import EventType, StepMessage, StepRecord
from stepwatch.contract.wire import RankEvent, RankStep, encode_datagram

NOW = time.time()


def fake_proc(root: Path, pid: int, cgroup: str = "0::/init.scope\n") -> None:
    d = root / str(pid)
    d.mkdir(parents=True, exist_ok=True)
    rest = ["S"] + ["0"] * 18 + ["5000"] + ["0"] * 10
    (d / "stat").write_text(f"{pid} (python) " + " ".join(rest) + "\n")
    (d / "cgroup").write_text(cgroup)
    (d / "environ").write_bytes(b"")


def forged_step(job: str = "42") -> bytes:
    return encode_datagram(
        RankStep(step=StepRecord(job_id=job, rank=3, world_size=8, step=1, start=NOW - 1, end=NOW))
    )


class Agent:
    def __init__(self, tmp_path: Path, proc: Path) -> None:
        self.path = str(tmp_path / "run" / "agent.sock")
        self.c = StepsCollector(
            self.path, gate=SenderGate(SenderPolicy(proc_root=str(proc))), clock=lambda: NOW
        )

    def send(self, *datagrams: bytes) -> list:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            for d in datagrams:
                s.sendto(d, self.path)
        deadline = time.monotonic() + 5
        while len(self.c._buf) < len(datagrams) and time.monotonic() < deadline:
            time.sleep(0.005)
        return self.c.collect(HostContext("node07", NOW, {}))


def test_a_sender_gone_before_it_was_seen_speaks_for_no_job(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    fake_proc(proc, 1)  # the agent sees every process, but not this sender any more
    agent = Agent(tmp_path, proc)
    try:
        out = agent.send(forged_step())
    finally:
        agent.c.close()
    assert out == [] and agent.c.rejected["sender_gone"] == 1


def test_a_rank_seen_alive_keeps_its_identity_for_its_last_datagram(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    fake_proc(proc, 1)
    fake_proc(proc, os.getpid(), "0::/system.slice/slurmstepd.scope/job_42/step_0/user/task_0\n")
    agent = Agent(tmp_path, proc)
    try:
        assert [m.job_id for m in agent.send(forged_step()) if isinstance(m, StepMessage)] == ["42"]
        shutil.rmtree(proc / str(os.getpid()))  # the rank exits
        end = RankEvent(type=EventType.JOB_END, ts=NOW, job_id="42", rank=3)
        out = agent.send(encode_datagram(end))
    finally:
        agent.c.close()
    assert [m.type for m in out] == [EventType.JOB_END] and not agent.c.rejected


def test_where_the_agent_cannot_see_every_process_a_missing_sender_is_not_judged(
    tmp_path: Path,
) -> None:
    proc = tmp_path / "proc"  # no pid 1: hidepid, or not root
    proc.mkdir()
    agent = Agent(tmp_path, proc)
    try:
        out = agent.send(forged_step())
    finally:
        agent.c.close()
    assert len(out) == 1 and not agent.c.rejected

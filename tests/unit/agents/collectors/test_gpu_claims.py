"""A rank may claim only a GPU its ``CUDA_VISIBLE_DEVICES`` gives it (agent, Boundary 1).

Before: the agent took the ``gpu`` (else ``local_rank``) of any admitted step
for the job that owns that GPU, so a rank of job 41 on GPU 0 that sent
``gpu=5`` had GPU 5's samples and XID events labelled with job 41, not with
job 42 that runs there. The datagrams go through the real socket, so the
kernel's credentials name this test process; its identity comes from a fake
``/proc`` tree.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest

from stepwatch.agents.collectors.base import HostContext
from stepwatch.agents.collectors.senders import SenderGate, SenderPolicy
from stepwatch.agents.collectors.steps import StepsCollector
from stepwatch.contract import StepRecord
from stepwatch.contract.wire import RankEvent, RankStep, encode_datagram

NOW = time.time()


def fake_proc(root: Path, pid: int, env: dict[str, str]) -> None:
    d = root / str(pid)
    d.mkdir(parents=True, exist_ok=True)
    rest = ["S"] + ["0"] * 18 + ["5000"] + ["0"] * 10
    (d / "stat").write_text(f"{pid} (python) " + " ".join(rest) + "\n")
    (d / "cgroup").write_text("0::/system.slice/slurmstepd.scope/job_41/step_0/user/task_0\n")
    (d / "environ").write_bytes(b"\0".join(f"{k}={v}".encode() for k, v in env.items()))


def step(gpu: int | None, local_rank: int = 0) -> bytes:
    rec = StepRecord(
        job_id="41",
        rank=0,
        world_size=8,
        step=1,
        start=NOW - 1,
        end=NOW,
        local_rank=local_rank,
        gpu=gpu,
    )
    return encode_datagram(RankStep(step=rec))


def run(tmp_path: Path, env: dict[str, str], *datagrams: bytes) -> StepsCollector:
    proc = tmp_path / "proc"
    fake_proc(proc, os.getpid(), {"SLURM_JOB_ID": "41", "RANK": "0", **env})
    path = str(tmp_path / "run" / "agent.sock")
    c = StepsCollector(path, gate=SenderGate(SenderPolicy(proc_root=str(proc))), clock=lambda: NOW)
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        for d in datagrams:
            s.sendto(d, path)
    deadline = time.monotonic() + 5
    while len(c._buf) < len(datagrams) and time.monotonic() < deadline:
        time.sleep(0.005)
    c.collect(HostContext("node07", NOW, {}))
    c.close()
    return c


def test_a_rank_cannot_claim_another_jobs_gpu(tmp_path: Path) -> None:
    c = run(tmp_path, {"CUDA_VISIBLE_DEVICES": "0"}, step(5), step(None, local_rank=6), step(0))
    assert c.job_of_gpu() == {0: "41"}  # GPUs 5 and 6 stay unlabelled
    assert c.rejected["gpu_mismatch"] == 2
    event = RankEvent(type="exception", ts=NOW, job_id="41", rank=0, gpu=3)  # type: ignore[arg-type]
    assert (
        run(tmp_path, {"CUDA_VISIBLE_DEVICES": "0"}, encode_datagram(event)).rejected[
            "gpu_mismatch"
        ]
        == 1
    )


@pytest.mark.parametrize("visible", ["", "GPU-8f6c1d2e-0000-1111-2222-333344445555", "MIG-1/2/0"])
def test_no_numeric_visible_devices_is_no_evidence(tmp_path: Path, visible: str) -> None:
    c = run(tmp_path, {"CUDA_VISIBLE_DEVICES": visible} if visible else {}, step(5))
    assert c.job_of_gpu() == {5: "41"} and not c.rejected


def test_visible_devices_are_parsed_as_physical_indexes() -> None:
    from stepwatch.agents.collectors.procfs import env_gpus

    assert env_gpus({"CUDA_VISIBLE_DEVICES": "4, 5,6,7"}) == frozenset({4, 5, 6, 7})
    assert env_gpus({"CUDA_VISIBLE_DEVICES": "0,GPU-abc"}) is None
    assert env_gpus({}) is None

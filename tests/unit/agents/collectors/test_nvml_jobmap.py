"""The NVML collector reads the Slurm prolog's hpc-job mapping directory."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from stepwatch.agents.collectors import build_host_collectors
from stepwatch.agents.collectors.base import HostContext
from stepwatch.agents.collectors.jobmap import JobMap
from stepwatch.agents.collectors.nvml import NvmlCollector
from stepwatch.agents.collectors.nvml_replay import ReplayNvml
from stepwatch.contract import GpuMessage, Message
from stepwatch.settings import Settings
from tests.support import paths

ROOT = paths.ROOT
NOW = 1_767_225_600.0


def ctx(jobs: dict[int, str] | None = None) -> HostContext:
    return HostContext(host="gpu-node-017", now=NOW, job_of_gpu=jobs or {})


def gpu_job(messages: list[Message]) -> str | None:
    [msg] = [m for m in messages if isinstance(m, GpuMessage)]
    return msg.job_id


def write(directory: Path, jobs: dict[int, str]) -> None:
    directory.mkdir(exist_ok=True)
    for gpu, job in jobs.items():
        (directory / str(gpu)).write_text(job + "\n")


def collector(directory: Path) -> NvmlCollector:
    return NvmlCollector(ReplayNvml.from_file(clock=lambda: 0.0), job_map=JobMap(directory))


def test_the_mapping_gives_gpu_samples_their_job(tmp_path: Path) -> None:
    jobs = tmp_path / "jobs"
    write(jobs, dict.fromkeys(range(8), "81234"))
    assert gpu_job(collector(jobs).collect(ctx())) == "81234"


def test_without_a_mapping_the_job_stays_unknown(tmp_path: Path) -> None:
    assert gpu_job(collector(tmp_path / "absent").collect(ctx())) is None
    assert gpu_job(NvmlCollector(ReplayNvml.from_file(clock=lambda: 0.0)).collect(ctx())) is None


def test_two_jobs_on_the_host_leave_the_message_unattributed(tmp_path: Path) -> None:
    jobs = tmp_path / "jobs"
    write(jobs, {**dict.fromkeys(range(4), "1"), **dict.fromkeys(range(4, 8), "2")})
    assert gpu_job(collector(jobs).collect(ctx())) is None


def test_step_ownership_wins_over_the_mapping(tmp_path: Path) -> None:
    jobs = tmp_path / "jobs"
    write(jobs, dict.fromkeys(range(8), "stale"))
    assert gpu_job(collector(jobs).collect(ctx(dict.fromkeys(range(8), "live")))) == "live"


def test_the_mapping_follows_prolog_and_epilog(tmp_path: Path) -> None:
    jobs = tmp_path / "jobs"
    env = {
        "PATH": os.environ["PATH"],
        "STEPWATCH_JOB_MAP_DIR": str(jobs),
        "STEPWATCH_PROLOG_NO_SYSTEMD": "1",
        "SLURM_JOB_ID": "4242",
        "SLURM_JOB_GPUS": "0,1,2,3,4,5,6,7",
    }
    nvml = collector(jobs)
    subprocess.run(["bash", str(ROOT / "deploy/slurm/prolog.sh")], env=env, check=True)
    assert gpu_job(nvml.collect(ctx())) == "4242"
    subprocess.run(["bash", str(ROOT / "deploy/slurm/epilog.sh")], env=env, check=True)
    assert gpu_job(nvml.collect(ctx())) is None


def test_odd_entries_are_skipped(tmp_path: Path) -> None:
    jobs = tmp_path / "jobs"
    write(jobs, {0: "7", 1: ""})
    (jobs / "2.tmp").write_text("8\n")
    (jobs / "3").write_text("x" * 500)
    (jobs / "4").mkdir()
    assert JobMap(jobs).read() == {0: "7"}


def test_the_agent_setting_reaches_the_nvml_collector(tmp_path: Path) -> None:
    settings = Settings.load(env={"STEPWATCH_JOB_MAP_DIR": str(tmp_path)})
    assert settings.job_map_dir == str(tmp_path)
    [nvml] = build_host_collectors(settings, ["nvml-replay"])
    assert isinstance(nvml, NvmlCollector)
    assert nvml._job_map is not None and nvml._job_map.directory == tmp_path
    off = build_host_collectors(Settings.load(env={"STEPWATCH_JOB_MAP_DIR": ""}), ["nvml-replay"])[
        0
    ]
    assert isinstance(off, NvmlCollector) and off._job_map is None

"""The README's main job, end to end on embedded defaults (short run)."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.timeout(240)
def test_demo_runs_finds_the_straggler_and_loses_nothing(tmp_path) -> None:
    cmd = [
        sys.executable, "-m", "stepwatch.cli", "demo", "--plain", "--duration", "40",
        "--nodes", "2", "--step-seconds", "0.5", "--workers", "1",
        "--fault", "slow_gpu:rank=5:start=8:severity=0.3", "--workdir", str(tmp_path / "demo"),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=200)
    out = done.stdout
    assert done.returncode == 0, out[-3000:] + done.stderr[-3000:]
    summary = out[out.rindex("published "):]
    published = int(summary.split()[1])
    arrived = int(summary.split("arrived ")[1].split(";")[0])
    assert published > 50 and arrived == published
    assert "missing 0; duplicates 0; undelivered 0" in summary
    assert "sequence audit:" in out and "agent spool:" in out
    # the stream worker found the injected straggler and said why
    assert "straggler job=demo-job rank=5 host=node0000 cause=gpu" in summary
    assert "stepwatch query job_timeline" in summary

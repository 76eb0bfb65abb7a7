"""The README's main job, end to end on embedded defaults (short run)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest


@pytest.mark.timeout(240)
def test_demo_runs_finds_the_straggler_and_loses_nothing(tmp_path) -> None:
    cmd = [
        sys.executable, "-m", "stepwatch.cli", "demo", "--plain", "--duration", "40",
        "--nodes", "2", "--step-seconds", "0.5", "--workers", "1",
        "--fault", "slow_gpu:rank=5:start=8:severity=0.3", "--workdir", str(tmp_path / "demo"),
        "--no-alerting",
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


@pytest.mark.timeout(300)
def test_demo_fault_is_found_alerted_and_acted_on(tmp_path) -> None:
    """The whole path: detection -> Prometheus rule -> Alertmanager -> remediator -> Slurm."""
    from stepwatch.daemons.slurm import missing_binaries

    slurm = not missing_binaries() and os.geteuid() == 0
    cmd = [
        sys.executable, "-m", "stepwatch.cli", "demo", "--plain", "--duration", "120",
        "--nodes", "4", "--step-seconds", "0.5", "--no-report",
        "--fault", "slow_gpu:rank=13:start=10:severity=0.3", "--workdir", str(tmp_path / "demo"),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=280)
    out = done.stdout
    assert done.returncode == 0, out[-3000:] + done.stderr[-3000:]
    summary = out[out.rindex("published "):]
    assert "missing 0; duplicates 0; undelivered 0" in summary
    assert "firing alerts (" in out and "StragglerPersistent" in out
    assert "first alert firing" in summary and "first remediator decision" in summary
    if slurm:  # execute mode on the local Slurm cluster: the slow node, and only it, drained
        assert "drain node02" in summary and ": done" in summary, summary
        states = out[out.rindex("slurm nodes:"):].splitlines()[0]
        assert "node02=drain" in states and states.count("=drain") == 1, states
    else:  # no Slurm here: observe mode, a dry run
        assert ": dry_run" in summary, summary


def _children(pid: int) -> set[int]:
    """Every live descendant of ``pid`` (from /proc)."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(stat.parent.name)] = int(fields[1])
    out, todo = set(), [pid]
    while todo:
        cur = todo.pop()
        kids = {p for p, pp in parents.items() if pp == cur}
        out |= kids
        todo.extend(kids)
    return out


@pytest.mark.timeout(240)
def test_ctrl_c_stops_every_process_the_demo_started(tmp_path) -> None:
    # a terminal's Ctrl-C: SIGINT to the whole foreground process group
    cmd = [sys.executable, "-m", "stepwatch.cli", "demo", "--plain", "--nodes", "2",
           "--step-seconds", "0.5", "--no-report", "--workdir", str(tmp_path / "demo")]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    seen = ""
    assert proc.stdout is not None
    for line in proc.stdout:  # wait until the first status block: everything has started
        seen += line
        if "sequence audit:" in line:
            break
    started = _children(proc.pid)
    assert len(started) >= 3, seen  # broker, stream worker, sink
    os.killpg(proc.pid, signal.SIGINT)
    rest, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, (seen + rest)[-3000:]
    assert "interrupted: stopping every process" in rest and "published " in rest
    time.sleep(0.5)
    assert not {p for p in started if Path(f"/proc/{p}").exists()
                and "(Z)" not in Path(f"/proc/{p}/stat").read_text()}, "left running"

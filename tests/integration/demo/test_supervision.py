"""The demo's process supervision, on a dummy service (tests/integration/demo/supervised.py).

A service killed with SIGKILL while the demo runs: the live view says which, how and
where its log is, the status lines and the summary keep saying so, and the demo exits
non-zero. A demo killed with SIGKILL: the next run in its workdir says what it left
running and stops it before it deletes the folder.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stepwatch.demo.ledger import STATE_FILE, Ledger, proc_stat
from stepwatch.errors import StepwatchError
from tests.support import paths

DUMMY = "dummy-0"


def _demo(workdir: Path, duration: float) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPWATCH_")}
    env["PYTHONPATH"] = str(paths.ROOT)
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.integration.demo.supervised",
            "--workdir",
            str(workdir),
            "--duration",
            str(duration),
        ],
        cwd=paths.ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _recorded(workdir: Path, name: str, timeout: float = 30.0) -> int:
    """The pid the demo's state file gives ``name``, once it is there."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            ledger = Ledger.from_json((workdir / STATE_FILE).read_text())
        except (OSError, StepwatchError):
            ledger = None
        found = [p.pid for p in ledger.processes if p.what == name] if ledger else []
        if found:
            return found[0]
        time.sleep(0.1)
    raise AssertionError(f"{name} not in {workdir / STATE_FILE} after {timeout:.0f} s")


def _alive(pid: int) -> bool:
    stat = proc_stat(pid)
    return stat is not None and stat.live


@pytest.mark.timeout(90)
def test_a_service_killed_during_the_run_is_reported_and_fails_the_demo(tmp_path) -> None:
    workdir = tmp_path / "demo"
    demo = _demo(workdir, 13)  # a status line every 10 s: one after the death
    pid = _recorded(workdir, DUMMY)
    time.sleep(1.0)
    os.kill(pid, signal.SIGKILL)
    out, err = demo.communicate(timeout=60)
    assert demo.returncode == 1, out[-3000:] + err[-3000:]
    down = [line for line in out.splitlines() if f"service {DUMMY}: DOWN" in line]
    assert len(down) == 1, out
    assert "killed by SIGKILL at t=" in down[0] and f"{DUMMY}.log" in down[0], down
    statuses = out[out.index(down[0]) :].splitlines()
    assert any("status: " in s and f"down={DUMMY}" in s for s in statuses), out
    summary = out[out.index("services that died during the run") :]
    assert f"{DUMMY}: killed by SIGKILL" in summary, summary
    assert f"demo failed: service {DUMMY} died" in out.splitlines()[-1], out[-1500:]
    assert not (workdir / STATE_FILE).exists()  # a run that stopped normally leaves none


@pytest.mark.timeout(120)
def test_the_next_run_stops_what_a_killed_demo_left_running(tmp_path) -> None:
    workdir = tmp_path / "demo"
    first = _demo(workdir, 300)
    orphan = _recorded(workdir, DUMMY)
    os.kill(first.pid, signal.SIGKILL)  # the demo only: its service runs on, orphaned
    first.communicate(timeout=30)
    assert _alive(orphan)
    try:
        second = _demo(workdir, 3)
        out, err = second.communicate(timeout=60)
    finally:
        if _alive(orphan):
            os.kill(orphan, signal.SIGKILL)
    assert second.returncode == 0, out[-3000:] + err[-3000:]
    said = [line for line in out.splitlines() if line.startswith("previous demo run:")]
    assert said[0] == (
        f"previous demo run: {DUMMY} (pid {orphan}) still running: "
        "stopping it and its process group"
    ), said
    assert said[-1] == "previous demo run: stopped 1 process it left running", said
    assert not _alive(orphan)
    assert out.index("previous demo run:") < out.index("status: "), out

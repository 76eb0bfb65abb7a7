"""The demo's supervision: its state file, the stale-process finder, a service that died."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pytest

from stepwatch.audit import SeqAudit
from stepwatch.demo.ledger import (
    STATE_FILE,
    DemoRunningError,
    Ledger,
    Recorded,
    Recorder,
    boot_id,
    clear_previous,
    proc_stat,
    stop_survivors,
    survivors,
    write,
)
from stepwatch.demo.plain import Changes, snapshot
from stepwatch.demo.runner import Demo, DemoOptions
from stepwatch.demo.services import Child
from stepwatch.demo.watch import Watch, how_it_ended, verdict

NO_SUCH_PID = 4_194_304 + 7  # above Linux's largest pid_max


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """A process in its own session, as the demo starts its services."""
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True
    )
    yield proc
    if proc.poll() is None:
        proc.kill()
    proc.wait(5)


def started(pid: int) -> int:
    stat = proc_stat(pid)
    assert stat is not None
    return stat.start


def gone() -> Recorded:
    return Recorded(NO_SUCH_PID, 1, "demo")


def test_the_state_file_records_the_demo_and_what_runs_below_it(
    tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    path = tmp_path / STATE_FILE
    recorder = Recorder(path, names=lambda: {sleeper.pid: "stream-0"}).start()
    ledger = Ledger.from_json(path.read_text())
    assert ledger.owner == Recorded(os.getpid(), started(os.getpid()), "demo", ledger.owner.leader)
    assert ledger.boot == boot_id() != ""
    [entry] = [p for p in ledger.processes if p.pid == sleeper.pid]
    assert entry == Recorded(sleeper.pid, started(sleeper.pid), "stream-0", leader=True)
    recorder.close()
    assert not path.exists()


def test_the_finder_refuses_a_pid_whose_start_time_differs(
    tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    start = started(sleeper.pid)
    reused = Recorded(sleeper.pid, start - 1, "stream-0", leader=True)  # the pid, reused since
    path = tmp_path / STATE_FILE
    write(path, Ledger(boot_id(), gone(), (reused,)))
    assert survivors(path) == []
    assert stop_survivors([reused], boot_id(), lambda _: None, grace=0.5) == []
    assert sleeper.poll() is None  # not signalled
    same = Recorded(sleeper.pid, start, "stream-0", leader=True)
    write(path, Ledger("another boot", gone(), (same,)))
    assert survivors(path) == []  # the pid and start time of another boot prove nothing
    write(path, Ledger(boot_id(), gone(), (same, reused)))
    assert survivors(path) == [same]


def test_a_new_run_stops_the_previous_runs_survivors(
    tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    entry = Recorded(sleeper.pid, started(sleeper.pid), "sink", leader=True)
    write(tmp_path / STATE_FILE, Ledger(boot_id(), gone(), (entry,)))
    said: list[str] = []
    assert clear_previous(tmp_path, said.append, grace=5.0) == 1
    assert sleeper.wait(5) == -signal.SIGTERM
    assert said == [
        f"previous demo run: sink (pid {sleeper.pid}) still running: "
        "stopping it and its process group",
        "previous demo run: stopped 1 process it left running",
    ]
    assert clear_previous(tmp_path, said.append) == 0  # nothing alive any more


def test_a_killed_runs_private_slurm_folder_is_removed_with_its_processes(
    tmp_path: Path,
) -> None:
    # before: a demo killed with SIGKILL left <tmp>/swslurm-* (munge seed, Slurm spool)
    run_dir = Path(tempfile.mkdtemp(prefix="swslurm-"))
    (run_dir / "sock").write_text("")
    munged = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)", f"--socket={run_dir}/sock"],
        start_new_session=True,
    )
    try:
        entry = Recorded(munged.pid, started(munged.pid), "munged", leader=True)
        write(tmp_path / STATE_FILE, Ledger(boot_id(), gone(), (entry,)))
        said: list[str] = []
        assert clear_previous(tmp_path, said.append, grace=5.0) == 1
        assert not run_dir.exists()
        assert said[-1] == f"previous demo run: removed its private Slurm/munge folder {run_dir}"
    finally:
        if munged.poll() is None:
            munged.kill()
        munged.wait(5)
        shutil.rmtree(run_dir, ignore_errors=True)


def test_a_previous_demo_still_running_is_left_alone(
    tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    owner = Recorded(sleeper.pid, started(sleeper.pid), "demo", leader=True)
    write(tmp_path / STATE_FILE, Ledger(boot_id(), owner, ()))
    with pytest.raises(DemoRunningError, match=f"another demo \\(pid {sleeper.pid}\\)"):
        clear_previous(tmp_path, lambda _: None)
    assert sleeper.poll() is None


def test_an_unreadable_state_file_stops_nothing(tmp_path: Path) -> None:
    (tmp_path / STATE_FILE).write_text("{not json")
    assert survivors(tmp_path / STATE_FILE) == []


@dataclass(frozen=True)
class Service:
    name: str
    log_path: Path
    how: str | None = None

    def ended(self) -> str | None:
        return self.how


def test_how_a_service_ended() -> None:
    assert how_it_ended(-9) == "killed by SIGKILL"
    assert how_it_ended(-15) == "killed by SIGTERM"
    assert how_it_ended(3) == "exited with code 3"


def test_a_dead_service_stays_down_in_every_view() -> None:
    watch = Watch()
    log = Path("var/demo/stream-0.log")
    up = [Service("stream-0", log), Service("sink", Path("sink.log"))]
    assert watch.check(up, 10.0) == [] and watch.status() == "" and watch.summary() == []
    down = [Service("stream-0", log, "killed by SIGKILL"), up[1]]
    [death] = watch.check(down, 37.6)
    assert (death.name, death.how) == ("stream-0", "killed by SIGKILL")
    assert watch.check(down, 39.6) == []  # once
    assert watch.states(down) == {
        "stream-0": "DOWN (killed by SIGKILL at t=37.6s; log var/demo/stream-0.log)",
        "sink": "up",
    }
    assert watch.status() == " down=stream-0"
    assert watch.summary() == [
        "services that died during the run (not restarted):",
        "  stream-0: killed by SIGKILL at t=37.6s; log var/demo/stream-0.log",
    ]
    changes = Changes()
    lines = changes.lines(
        37.6,
        snapshot(
            stages=(), detections=(), alerting=None, slurm={}, job="", services=watch.states(down)
        ),
        "steps=1",
    )
    assert lines[0] == (
        "[t=  37.6s] service stream-0: DOWN (killed by SIGKILL at t=37.6s; "
        "log var/demo/stream-0.log)"
    )
    assert verdict(deaths=["stream-0"], missing=0, undelivered=0) == ["service stream-0 died"]
    assert verdict(deaths=[], missing=0, undelivered=0) == []


class Tap:
    audit = SeqAudit()
    detections: list[object] = []


class Fleet:
    sent = 0
    finished = threading.Event()


def killed_child(tmp_path: Path) -> Child:
    child = Child(
        "stream-0",
        [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"],
        tmp_path / "stream-0.log",
    )
    child.start({})
    assert child.proc is not None
    child.proc.wait(10)
    return child


def test_the_summary_and_the_exit_status_say_a_service_died(tmp_path: Path) -> None:
    demo = Demo(DemoOptions(workdir=tmp_path, alerting=False))
    demo.children = [killed_child(tmp_path)]
    demo.tap, demo.fleet = cast(Any, Tap()), Fleet()
    assert demo.ok
    demo._check_services(37.6)
    summary = demo._summary(undelivered=0)
    assert not demo.ok and demo.failures == ["service stream-0 died"]
    assert (
        f"  stream-0: killed by SIGKILL at t=37.6s; log {tmp_path / 'stream-0.log'}"
        in summary.splitlines()
    ), summary


def test_a_service_that_ends_while_the_demo_stops_did_not_die(tmp_path: Path) -> None:
    demo = Demo(DemoOptions(workdir=tmp_path, alerting=False))
    demo.children = [killed_child(tmp_path)]
    demo._on_signal()  # SIGTERM: the demo stops
    demo._check_services(40.0)
    assert demo.watch.deaths == {}

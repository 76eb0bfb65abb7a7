"""The demo's child processes: stream workers and the ClickHouse sink.

Each is the real ``stepwatch`` subcommand in its own process, exactly as it
runs in production, pointed at the demo's broker. A part not present in this
build is skipped with a note.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from stepwatch.daemons.process import free_port
from stepwatch.demo.watch import how_it_ended

log = logging.getLogger(__name__)


@dataclass
class Child:
    name: str
    argv: list[str]
    log_path: Path
    metrics: str = ""  # host:port of its /metrics, for Prometheus and the live view
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    def start(self, env: dict[str, str]) -> None:
        with open(self.log_path, "ab") as out:
            # own session: a terminal's Ctrl-C reaches only the demo, which stops its
            # children in order (workers drain, the sink commits) instead of all at once
            self.proc = subprocess.Popen(
                self.argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        log.info(
            "demo child started name=%s pid=%s log=%s", self.name, self.proc.pid, self.log_path
        )

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def ended(self) -> str | None:
        """How it ended (``killed by SIGKILL``); None while it runs or before it started."""
        code = None if self.proc is None else self.proc.poll()
        return None if code is None else how_it_ended(code)

    def stop(self, timeout: float = 20.0) -> None:
        if not self.alive or self.proc is None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)


def available(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def children(bootstrap: str, workdir: Path, *, workers: int, store: bool) -> list[Child]:
    """The services to start, in order."""
    cli = [sys.executable, "-m", "stepwatch.cli"]
    common = ["--bootstrap-servers", bootstrap]
    out: list[Child] = []
    if workers and available("stepwatch.streams.worker.app"):
        for i in range(workers):
            port = free_port()
            out.append(
                Child(
                    f"stream-{i}",
                    [
                        *cli,
                        "stream",
                        *common,
                        "--worker-name",
                        f"demo-{i}",
                        "--data-dir",
                        str(workdir / f"faust-{i}"),
                        "--metrics-port",
                        str(port),
                    ],
                    workdir / f"stream-{i}.log",
                    metrics=f"127.0.0.1:{port}",
                )
            )
    if store and available("stepwatch.exporters.clickhouse.sink"):
        port = free_port()
        out.append(
            Child(
                "sink",
                [
                    *cli,
                    "db",
                    "sink",
                    *common,
                    "--store-path",
                    str(workdir / "chdb"),
                    "--metrics-port",
                    str(port),
                ],
                workdir / "sink.log",
                metrics=f"127.0.0.1:{port}",
            )
        )
    return out


def child_env(prefix: str, partitions: int) -> dict[str, str]:
    env = dict(os.environ)
    env["STEPWATCH_TOPIC_PREFIX"] = prefix
    env["STEPWATCH_PARTITIONS"] = str(partitions)
    return env


PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    """Orphans of our descendants (a daemon's double-forked helper) come back to this process.

    Linux only; elsewhere a no-op. :func:`stop_descendants` then finds them at shutdown.
    """
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (from /proc), parents before children."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] not in ("Z", "X"):
            parents[int(stat.parent.name)] = int(fields[1])
    out, todo = [], [pid]
    while todo:
        cur = todo.pop()
        kids = [p for p, pp in parents.items() if pp == cur]
        out += kids
        todo += kids
    return out


def stop_descendants(timeout: float = 5.0) -> list[int]:
    """SIGTERM, then SIGKILL, whatever still runs under this process; reap the zombies."""
    left = descendants(os.getpid())
    for pid in left:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and descendants(os.getpid()):
        _reap()
        time.sleep(0.1)
    for pid in descendants(os.getpid()):
        _signal(pid, signal.SIGKILL)
    time.sleep(0.1)
    _reap()
    return left


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except OSError:
        pass


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return

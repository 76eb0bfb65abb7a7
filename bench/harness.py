"""Process plumbing shared by the availability benches (takeover, chaos, soak)
and their short forms in tests/integration: real ``stepwatch`` subcommands in
subprocesses, killed with SIGKILL and restarted, scraped over ``/metrics``,
sized from ``/proc``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from stepwatch.daemons.process import free_port

ROOT = Path(__file__).resolve().parents[1]

CLI = [sys.executable, "-m", "stepwatch.cli"]
PAGE = os.sysconf("SC_PAGE_SIZE")


@dataclass
class Proc:
    """One restartable child process with a log file (appended across restarts)."""

    name: str
    argv: Callable[[], list[str]]  # called at each start: ports may change
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0

    def start(self) -> Proc:
        env = {**os.environ, **self.env}
        with open(self.log_path, "ab") as out:
            self.proc = subprocess.Popen(
                self.argv(), cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT
            )
        self.starts += 1
        return self

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.alive and self.proc is not None else None

    def kill9(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self, timeout: float = 30.0) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode

    def tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


def rss_bytes(pid: int | None) -> int:
    """Resident set size of ``pid`` (0 when gone)."""
    if pid is None:
        return 0
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * PAGE
    except (OSError, IndexError, ValueError):
        return 0


def scrape(port: int, timeout: float = 2.0) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """A ``/metrics`` page as {(name, sorted labels): value}; empty when unreachable."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout) as r:
            text = r.read().decode()
    except OSError:
        return {}
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def metric(
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str
) -> float:
    return sum(
        v
        for (n, lab), v in samples.items()
        if n == name and all(dict(lab).get(k) == x for k, x in labels.items())
    )


def job_steps(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float]) -> dict[str, float]:
    return {
        dict(lab)["job_id"]: v for (n, lab), v in samples.items() if n == "stepwatch_job_last_step"
    }


@dataclass
class Worker:
    """``stepwatch stream`` with a fixed name, data dir and metrics port."""

    proc: Proc
    port: int


def stream_worker(
    name: str,
    workdir: Path,
    bootstrap: str,
    prefix: str,
    partitions: int,
    group: str,
    extra: list[str] | None = None,
    env: dict[str, str] | None = None,
) -> Worker:
    port = free_port()
    argv = [
        *CLI,
        "stream",
        "--bootstrap-servers",
        bootstrap,
        "--topic-prefix",
        prefix,
        "--partitions",
        str(partitions),
        "--metrics-port",
        str(port),
        "--app-id",
        group,
        "--worker-name",
        name,
        "--data-dir",
        str(workdir / name),
        *(extra or []),
    ]
    base_env = {"STEPWATCH_HANG_MIN_SECONDS": "3600"}
    proc = Proc(name, lambda: argv, workdir / f"{name}.log", {**base_env, **(env or {})})
    return Worker(proc, port)


def sink(workdir: Path, bootstrap: str, prefix: str, partitions: int) -> Worker:
    port = free_port()
    argv = [
        *CLI,
        "db",
        "sink",
        "--bootstrap-servers",
        bootstrap,
        "--topic-prefix",
        prefix,
        "--partitions",
        str(partitions),
        "--store-path",
        str(workdir / "chdb"),
        "--metrics-port",
        str(port),
        "--no-serve",
        "--batch-seconds",
        "0.5",
    ]
    return Worker(Proc("sink", lambda: argv, workdir / "sink.log"), port)


def wait_until(
    what: str,
    check: Callable[[], object],
    timeout: float,
    procs: tuple[Proc, ...] = (),
    poll: float = 0.25,
) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = check()
        if result:
            return result
        for p in procs:
            if p.proc is not None and p.proc.poll() is not None:
                raise RuntimeError(f"{p.name} exited ({p.proc.returncode}):\n{p.tail()}")
        time.sleep(poll)
    logs = "\n".join(f"--- {p.name}\n{p.tail()}" for p in procs)
    raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}\n{logs}")

"""``stepwatch demo --torch``: a real PyTorch DDP job (examples/ddp_train.py) instead of the simulator.

Two node agents (``stepwatch agent``, steps collector, one per emulated host)
receive the ranks' step datagrams and publish them; the example runs 4 ranks
with gloo on CPU, pinned two to a core, and one rank's forward pass does 2.5x
the work from step 60 on. The object looks like the simulator's FleetDriver to
the demo: ``sent``, ``finished``, ``stop()``.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path
from typing import Any

from stepwatch.broker import free_port
from stepwatch.demo.services import Child
from stepwatch.errors import ConfigError
from stepwatch.settings import Settings

log = logging.getLogger(__name__)
HOSTS = ("host-0", "host-1")
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "ddp_train.py"


class TorchJob:
    def __init__(self, settings: Settings, workdir: Path, job_id: str, options: Any) -> None:
        self.settings = settings
        self.workdir = workdir
        self.job_id = f"{job_id}-torch"
        self.options = options
        self.agents: list[Child] = []
        self.job: subprocess.Popen[bytes] | None = None
        self.finished = threading.Event()
        self._watch: threading.Thread | None = None
        self._sent = 0
        self.fault = "slow compute: rank 1 forward x2.5 from step 60 (real DDP job)"

    def start(self, env: dict[str, str]) -> TorchJob:
        if not EXAMPLE.is_file():
            raise ConfigError(f"demo --torch needs a source checkout: {EXAMPLE.name} not found")
        socket = str(self.workdir / "agent-{host}.sock")
        for host in HOSTS:
            port = free_port()
            agent = Child(f"agent-{host}", [
                sys.executable, "-m", "stepwatch.cli", "agent", "--bootstrap-servers",
                self.settings.bootstrap_servers, "--host", host, "--collectors", "steps",
                "--tick", "0.5", "--socket", socket.replace("{host}", host),
                "--spool-dir", str(self.workdir / f"spool-{host}"), "--metrics-port", str(port),
            ], self.workdir / f"agent-{host}.log", metrics=f"127.0.0.1:{port}")
            agent.start(env)
            self.agents.append(agent)
        argv = [sys.executable, str(EXAMPLE), "--nproc", "4", "--steps",
                str(min(self.options.steps, 400)), "--pin", "--emulate-hosts", str(len(HOSTS)),
                "--job-id", self.job_id, "--slow-rank", "1", "--slow-kind", "compute",
                "--slow-factor", "2.5", "--slow-from", "60"]
        job_env = {**env, "STEPWATCH_AGENT_SOCKET": socket}
        for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
            job_env.pop(key, None)
        with open(self.workdir / "ddp_train.log", "ab") as out:
            self.job = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=job_env,
                                        start_new_session=True)
        log.info("demo: real DDP job started job_id=%s pid=%s", self.job_id, self.job.pid)
        self._watch = threading.Thread(target=self._wait, name="ddp-job", daemon=True)
        self._watch.start()
        return self

    def _wait(self) -> None:
        assert self.job is not None
        self.job.wait()
        self.finished.set()

    @property
    def sent(self) -> int:
        """Messages the agents had confirmed by Kafka (their /metrics; the last count once stopped)."""
        if not any(agent.alive for agent in self.agents):
            return self._sent
        total = 0
        for agent in self.agents:
            try:
                with urllib.request.urlopen(f"http://{agent.metrics}/metrics", timeout=1) as resp:
                    text = resp.read().decode()
            except OSError:
                continue
            total += int(sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                             if line.startswith("stepwatch_agent_messages_produced_total")))
        self._sent = max(self._sent, total)
        return self._sent

    def stop(self, timeout: float = 10.0) -> None:
        if self.job is not None and self.job.poll() is None:
            os.killpg(self.job.pid, 15)
            try:
                self.job.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.job.pid, 9)
                self.job.wait(5)
        self.finished.set()
        self.sent  # noqa: B018 - read the agents' count while they still answer
        for agent in self.agents:  # SIGTERM: each agent flushes its spool to Kafka first
            agent.stop()

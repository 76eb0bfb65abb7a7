"""``stepwatch demo --torch``: a real PyTorch DDP job (examples/ddp_train.py)
instead of the simulator.

A node agent (``stepwatch agent``, steps collector) per node receives the
ranks' step datagrams and publishes them; the example runs 4 ranks with gloo
on CPU, pinned two to a core, as two emulated hosts, and one rank on the
job's second node does 5x the forward work from step 60 on (on 2 busy cores the
forward is a small part of a step: at 2.5x the job hardly slowed, and the
remediator rightly judged the drain's outcome not_recovered by the step times it
prints). Rank 0 saves a checkpoint every 100 steps.

With ``follow`` (the demo's Slurm job, :mod:`stepwatch.demo.allocation`) the
hosts are the allocation's nodes and the job follows its scheduler job as the
simulated one does: when the allocation goes away (a drain and a requeue) its
processes are stopped, and once Slurm runs the job again they start on the
new nodes with ``--resume``, from the last checkpoint (the step numbers go
back to it). The slow rank belongs to its node: a new node is a healthy one.
The job id is the Slurm job's (the remediator requeues that job), and the
processes carry it as ``SLURM_JOB_ID`` and ``STEPWATCH_JOB_ID``: the agent
accepts records only for the job their sender's environment names.

The object looks like the simulator's FleetDriver to the demo: ``sent``,
``finished``, ``incarnations``, ``stop()``.
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from stepwatch.daemons.process import free_port
from stepwatch.demo.allocation import Follow, Incarnation, lost, next_running
from stepwatch.demo.services import Child
from stepwatch.errors import ConfigError
from stepwatch.settings import Settings

log = logging.getLogger(__name__)
HOSTS = ("host-0", "host-1")  # without Slurm
RANKS = 4
SLOW_NODE = 1  # the fault is on the job's second node (as of its first run) ...
SLOW_LOCAL_RANK = 1  # ... on its second rank
SLOW_FROM = 60
SLOW_FACTOR = 5.0
CHECKPOINT_EVERY = 100  # steps (~10 s on 2 cores): a restart goes back up to this many
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "ddp_train.py"


class TorchJob:
    def __init__(
        self,
        settings: Settings,
        workdir: Path,
        job_id: str,
        options: Any,
        follow: Follow | None = None,
        hosts: tuple[str, ...] = HOSTS,
        agent_hosts: tuple[str, ...] = (),
        poll_seconds: float = 1.0,
    ) -> None:
        self.settings = settings
        self.workdir = workdir
        self.job_id = job_id
        self.options = options
        self.follow = follow
        self.hosts = hosts
        self.agent_hosts = agent_hosts or hosts  # a node agent on every node
        self.poll_seconds = poll_seconds
        self.slow_node = hosts[SLOW_NODE]
        self.checkpoints = workdir / "checkpoints"
        self.agents: list[Child] = []
        self.job: subprocess.Popen[bytes] | None = None
        self.incarnations: list[Incarnation] = []
        self.finished = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ddp-job", daemon=True)
        self._env: dict[str, str] = {}
        self._sent = 0
        per_host = RANKS // len(hosts)
        self.fault = (
            f"slow compute: rank {SLOW_NODE * per_host + SLOW_LOCAL_RANK} on "
            f"{self.slow_node}, forward x{SLOW_FACTOR} from step {SLOW_FROM} "
            "(real DDP job)"
        )

    @property
    def socket(self) -> str:
        return str(self.workdir / "agent-{host}.sock")

    def start(self, env: dict[str, str]) -> TorchJob:
        if not EXAMPLE.is_file():
            raise ConfigError(f"demo --torch needs a source checkout: {EXAMPLE.name} not found")
        for host in self.agent_hosts:
            self.agents.append(self._agent(host, env))
        self._env = self._job_env(env)
        self._thread.start()
        return self

    def _agent(self, host: str, env: dict[str, str]) -> Child:
        port = free_port()
        agent = Child(
            f"agent-{host}",
            [
                sys.executable,
                "-m",
                "stepwatch.cli",
                "agent",
                "--bootstrap-servers",
                self.settings.bootstrap_servers,
                "--host",
                host,
                "--collectors",
                "steps",
                "--tick",
                "0.5",
                "--socket",
                self.socket.replace("{host}", host),
                "--spool-dir",
                str(self.workdir / f"spool-{host}"),
                "--metrics-port",
                str(port),
            ],
            self.workdir / f"agent-{host}.log",
            metrics=f"127.0.0.1:{port}",
        )
        agent.start(env)
        return agent

    def _job_env(self, env: dict[str, str]) -> dict[str, str]:
        """The ranks' environment: one job identity, the Slurm job's when there is one."""
        out = {
            k: v
            for k, v in env.items()
            if not k.startswith("SLURM_")
            and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "STEPWATCH_JOB_ID")
        }
        out.update(STEPWATCH_AGENT_SOCKET=self.socket, STEPWATCH_JOB_ID=self.job_id)
        if self.follow is not None:
            out["SLURM_JOB_ID"] = self.job_id
        return out

    # ------------------------------------------------------------------ the job's runs
    def _run(self) -> None:
        try:
            hosts, first_step = self.hosts, 0
            while not self._stop.is_set():
                self._launch(hosts, first_step)
                if self._runs_on(hosts):
                    return  # the job ended (or the demo stops)
                self._kill()
                hosts = self._next_hosts(hosts)
                if not hosts:
                    return
                first_step = self.checkpoint_step()
        except Exception:  # the demo must say why it stopped, not die silently
            log.exception("demo: the DDP job's supervisor failed")
        finally:
            self.finished.set()

    def argv(self, hosts: tuple[str, ...]) -> list[str]:
        """The example's command line for a run on ``hosts`` (``--resume`` after the first)."""
        argv = [
            sys.executable,
            str(EXAMPLE),
            "--nproc",
            str(RANKS),
            "--steps",
            str(self.options.steps),
            "--pin",
            "--host-names",
            ",".join(hosts),
            "--job-id",
            self.job_id,
            "--checkpoint-every",
            str(CHECKPOINT_EVERY),
            "--checkpoint-dir",
            str(self.checkpoints),
        ]
        if self.incarnations:
            argv += ["--resume", str(self.checkpoints)]
        if self.slow_node in hosts:  # a fault belongs to its node
            rank = hosts.index(self.slow_node) * (RANKS // len(hosts)) + SLOW_LOCAL_RANK
            argv += [
                "--slow-rank",
                str(rank),
                "--slow-kind",
                "compute",
                "--slow-factor",
                str(SLOW_FACTOR),
                "--slow-from",
                str(SLOW_FROM),
            ]
        return argv

    def _launch(self, hosts: tuple[str, ...], first_step: int) -> None:
        argv = self.argv(hosts)
        with open(self.workdir / "ddp_train.log", "ab") as out:
            self.job = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, env=self._env, start_new_session=True
            )
        self.incarnations.append(
            Incarnation(len(self.incarnations), time.time(), hosts, first_step)
        )
        log.info(
            "demo: real DDP job started job_id=%s pid=%s run=%d first_step=%d nodes=%s",
            self.job_id,
            self.job.pid,
            len(self.incarnations),
            first_step,
            ",".join(hosts),
        )

    def _runs_on(self, hosts: tuple[str, ...]) -> bool:
        """Watch the run: True when it ended or the demo stops, False when its allocation went."""
        assert self.job is not None
        while self.job.poll() is None:
            if self._stop.wait(self.poll_seconds):
                return True
            if self.follow is not None and lost(self.follow(), hosts):
                log.info("demo: the DDP job lost its allocation: its processes stop")
                return False
        log.info("demo: the DDP job ended code=%s", self.job.returncode)
        return True

    def _next_hosts(self, hosts: tuple[str, ...]) -> tuple[str, ...]:
        """The nodes of the job's next allocation, once Slurm runs it again (() on stop)."""
        assert self.follow is not None
        alloc = next(next_running(self.follow, self._stop, self.poll_seconds), None)
        if alloc is None:
            return ()
        if len(alloc.nodes) != len(hosts):
            log.warning(
                "demo: new allocation has %d nodes, the DDP job needs %d: it stays stopped",
                len(alloc.nodes),
                len(hosts),
            )
            return ()
        return alloc.nodes

    def checkpoint_step(self) -> int:
        """The step the last complete checkpoint holds (0: none yet)."""
        try:
            return int(json.loads((self.checkpoints / "checkpoint.json").read_text())["step"])
        except (OSError, ValueError, KeyError, TypeError):
            return 0

    def _kill(self, timeout: float = 10.0) -> None:
        """Stop the run's whole process group (the spawner and its ranks) and reap it."""
        job = self.job
        if job is None or job.poll() is not None:
            return
        group = group_pids(job.pid)
        os.killpg(job.pid, 15)
        try:
            job.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(job.pid, 9)
            job.wait(5)
        reap(group - {job.pid}, timeout)

    # ------------------------------------------------------------------ the demo's view
    @property
    def sent(self) -> int:
        """Messages the agents had confirmed by Kafka (their /metrics; the last count
        once stopped)."""
        if not any(agent.alive for agent in self.agents):
            return self._sent
        total = 0
        for agent in self.agents:
            try:
                with urllib.request.urlopen(f"http://{agent.metrics}/metrics", timeout=1) as resp:
                    text = resp.read().decode()
            except OSError:
                continue
            total += int(
                sum(
                    float(line.rsplit(" ", 1)[1])
                    for line in text.splitlines()
                    if line.startswith("stepwatch_agent_messages_produced_total")
                )
            )
        self._sent = max(self._sent, total)
        return self._sent

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout + 5)
        self._kill(timeout)
        self.finished.set()
        self.sent  # noqa: B018 - read the agents' count while they still answer
        for agent in self.agents:  # SIGTERM: each agent flushes its spool to Kafka first
            agent.stop()
        final = [final_count(agent.log_path) for agent in self.agents]
        if final and all(n is not None for n in final):  # what they sent, flush included
            self._sent = max(self._sent, sum(n for n in final if n is not None))


# an agent's last log line: "agent stopped host=... messages=N ... undelivered_in_spool=K"
STOPPED = re.compile(r"agent stopped host=\S+ .*\bmessages=(\d+) .*\bundelivered_in_spool=(\d+)")


def final_count(log_path: Path) -> int | None:
    """The messages an agent delivered, from its log once it stopped (None: no such line)."""
    try:
        text = log_path.read_text(errors="replace")
    except OSError:
        return None
    found = STOPPED.findall(text)
    if not found:
        return None
    messages, undelivered = found[-1]
    return int(messages) - int(undelivered)


def group_pids(pgid: int) -> set[int]:
    """The live processes of process group ``pgid`` (from /proc)."""
    out = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 2 and fields[2] == str(pgid):
            out.add(int(stat.parent.name))
    return out


def reap(pids: set[int], timeout: float) -> None:
    """Wait for ``pids`` to end; the ranks whose spawner died first are the demo's to reap
    (it is their subreaper), or they stay zombies until it exits."""
    deadline = time.monotonic() + timeout
    left = set(pids)
    while left and time.monotonic() < deadline:
        for pid in list(left):
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:  # not ours: gone when /proc says so
                done = 0 if Path(f"/proc/{pid}").exists() else pid
            if done:
                left.discard(pid)
        if left:
            time.sleep(0.1)

"""Real PyTorch DDP jobs through the real pipeline: examples/ddp_train.py -> SDK ->
``stepwatch agent`` (one per emulated host) -> broker -> ``stepwatch stream``.

The job runs 4 ranks with gloo on CPU, reported as two hosts (``host-0``: ranks
0, 1; ``host-1``: ranks 2, 3; pinned to the first and the last core for the CPU
contention run), each host with its own agent and socket, as on a real cluster.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from stepwatch.contract import DetectionMessage, StepMessage, Topics, decode, encode
from stepwatch.daemons.broker import DevBroker
from stepwatch.daemons.process import free_port
from stepwatch.kafka import ensure_topics
from stepwatch.settings import Settings
from stepwatch.streams.core import DetectConfig, Engine
from stepwatch.streams.replay import replay
from tests.support import paths
from tests.support.stream_support import StreamWorker, read_topic, wait_for

ROOT = paths.ROOT
EXAMPLE = ROOT / "examples" / "ddp_train.py"
HOSTS = ("host-0", "host-1")
# a busy machine: bursts of CPU work of random length with idle gaps, on no core in particular
BURSTY_LOOP = """import random, sys, time
rng = random.Random(int(sys.argv[1]))
while True:
    until = time.monotonic() + rng.uniform(0.2, 2.5)
    while time.monotonic() < until:
        sum(range(10000))
    time.sleep(rng.uniform(0.2, 2.5))
"""
RANKS_OF = {"host-0": (0, 1), "host-1": (2, 3)}


@dataclass(frozen=True)
class Fault:
    """A slowdown the example applies (labels of a recorded run)."""

    kind: str  # compute | data | cpu | healthy
    rank: int | None = None
    factor: float = 1.0
    start: int = 0
    options: tuple[str, ...] = ()  # more example flags: --plain, --parallel fsdp

    @property
    def host(self) -> str | None:
        return None if self.rank is None else next(h for h, r in RANKS_OF.items() if self.rank in r)

    def args(self) -> list[str]:
        if self.rank is None:
            return list(self.options)
        return [
            *self.options,
            "--slow-rank",
            str(self.rank),
            "--slow-kind",
            self.kind,
            "--slow-factor",
            str(self.factor),
            "--slow-from",
            str(self.start),
        ]


@dataclass
class Agents:
    """One ``stepwatch agent`` per emulated host, steps collector only."""

    settings: Settings
    workdir: Path
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    collectors: dict[str, str] = field(default_factory=dict)  # host -> list; default "steps"

    def socket_template(self) -> str:
        return str(self.workdir / "agent-{host}.sock")

    def start(self) -> Agents:
        for host in HOSTS:
            log = open(self.workdir / f"agent-{host}.log", "wb")  # noqa: SIM115
            cmd = [
                sys.executable,
                "-m",
                "stepwatch.cli",
                "agent",
                "--bootstrap-servers",
                self.settings.bootstrap_servers,
                "--topic-prefix",
                self.settings.topic_prefix,
                "--partitions",
                str(self.settings.partitions),
                "--host",
                host,
                "--collectors",
                self.collectors.get(host, "steps"),
                "--tick",
                "0.5",
                "--socket",
                self.socket_template().replace("{host}", host),
                "--spool-dir",
                str(self.workdir / f"spool-{host}"),
                "--metrics-port",
                str(free_port()),
            ]
            self.procs[host] = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=log)
        for host in HOSTS:
            self.wait_log(host, "kafka ready")
        return self

    def log(self, host: str) -> str:
        return (self.workdir / f"agent-{host}.log").read_text(errors="replace")

    def wait_log(self, host: str, text: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if text in self.log(host):
                return
            assert self.procs[host].poll() is None, f"agent {host} exited:\n{self.log(host)}"
            time.sleep(0.1)
        raise AssertionError(f"agent {host}: {text!r} not seen:\n{self.log(host)}")

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


@contextmanager
def torch_pipeline(
    work: Path, worker_env: dict[str, str] | None = None
) -> Iterator[tuple[Settings, Agents, StreamWorker]]:
    """A broker, a stream worker (``worker_env`` over its defaults) and the two hosts'
    agents, ready, in ``work``."""
    with DevBroker(log_path=str(work / "broker.log")) as broker:
        settings = Settings.load(
            env={},
            bootstrap_servers=broker.bootstrap,
            topic_prefix="t",
            partitions=2,
            spool_dir=str(work / "spool"),
            agent_socket=str(work / "agent.sock"),
            metrics_port=0,
            stream_metrics_port=0,
            host="testhost",
        )
        ensure_topics(settings)
        worker = StreamWorker(settings, work, "w", env=worker_env or {}).start()
        agents = Agents(settings, work)
        try:
            agents.start()
            wait_for(
                "stream worker ready",
                lambda: worker.value("stepwatch_stream_ready") == 1,
                90,
                [worker],
            )
            yield settings, agents, worker
        finally:
            agents.stop()
            worker.stop()


def run_job(
    agents: Agents, job_id: str, fault: Fault, steps: int, workdir: Path, timeout: float = 240
) -> str:
    """Run the example to completion; return its output (stdout and stderr)."""
    # Batches of 768: steps of about 0.4 s on 2 cores, like a real job's, not 60 ms
    # ones where any scheduler hiccup spans several steps. The ranks are pinned (two
    # per core: host-0 on the first, host-1 on the last) only for CPU contention, whose
    # busy processes compete for host-1's core; otherwise the kernel spreads the
    # machine's other load over all four ranks, as dedicated cores would on a node.
    pin = ["--pin"] if fault.kind == "cpu" else []
    cmd = [
        sys.executable,
        str(EXAMPLE),
        "--nproc",
        "4",
        "--steps",
        str(steps),
        *pin,
        "--batch",
        "768",
        "--emulate-hosts",
        "2",
        "--job-id",
        job_id,
        *fault.args(),
    ]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH")))),
        "STEPWATCH_AGENT_SOCKET": agents.socket_template(),
    }
    env.pop("RANK", None)
    env.pop("WORLD_SIZE", None)
    out = workdir / f"{job_id}.log"
    with open(out, "wb") as log:
        proc = subprocess.run(
            cmd,
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            timeout=timeout,
            check=False,
        )
    text = out.read_text(errors="replace")
    assert proc.returncode == 0, f"training job failed ({proc.returncode}):\n{text[-4000:]}"
    return text


def detections(settings: Settings, job_id: str) -> list[dict[str, object]]:
    topic = Topics(settings.topic_prefix).detections
    found = [json.loads(v) for _, v in read_topic(settings, topic)]
    return [d for d in found if d.get("job_id") == job_id]


def step_messages(settings: Settings, job_id: str) -> list[StepMessage]:
    """The job's step messages as the agents published them, in event-time order."""
    topic = Topics(settings.topic_prefix).steps
    msgs = [decode(v) for _, v in read_topic(settings, topic, timeout=10)]
    mine = [m for m in msgs if isinstance(m, StepMessage) and m.job_id == job_id]
    return sorted(mine, key=lambda m: (m.ts, m.host, m.seq))


def replay_detections(msgs: list[StepMessage]) -> list[DetectionMessage]:
    """What the detection core finds in ``msgs``, replayed in-process (no pipeline)."""
    found: list[DetectionMessage] = []
    errors: list[object] = []
    replay(
        (encode(m) for m in msgs),
        Engine(DetectConfig()),
        found.append,
        lambda n, err, raw: errors.append((n, err)),
    )
    assert errors == [], errors
    return found


RULES = paths.ROOT / "alerts" / "src" / "stepwatch" / "alerts" / "rules"
UNITS = {"s": 1, "m": 60, "h": 3600}


def page_after(detection_type: str) -> float:
    """Seconds a detection of ``detection_type`` must stay open before the shipped alert
    rules page anyone (the least ``for:`` of the rules on its score), from the rule files."""
    found = []
    for path in sorted(RULES.glob("*.yml")):
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                expr = str(rule.get("expr", ""))
                if "stepwatch_detection_score" in expr and f'type="{detection_type}"' in expr:
                    spec = str(rule.get("for", "0s"))
                    found.append(float(spec[:-1]) * UNITS[spec[-1]])
    assert found, f"no alert rule on {detection_type} detections"
    return min(found)


def step_table(msgs: list[StepMessage]) -> str:
    """One line per step: each host's median forward+backward and comm_wait (ms)."""
    rows: dict[int, dict[str, list[tuple[float, float]]]] = {}
    for m in msgs:
        for r in m.steps:
            p = r.phases
            if p is None:
                continue
            work = (p.forward or 0.0) + (p.backward or 0.0)
            rows.setdefault(r.step, {}).setdefault(r.host, []).append((work, p.comm_wait or 0.0))
    lines = []
    for step in sorted(rows):
        cells = []
        for host, vals in sorted(rows[step].items()):
            work = sorted(v[0] for v in vals)[len(vals) // 2]
            wait = sorted(v[1] for v in vals)[len(vals) // 2]
            cells.append(f"{host}={work * 1e3:.0f}/{wait * 1e3:.0f}")
        lines.append(f"{step} " + " ".join(cells))
    return "\n".join(lines)


def phase_means(msgs: list[StepMessage], lo: int, hi: int) -> dict[int, dict[str, float]]:
    """Median phase seconds per rank over steps [lo, hi) (for the report)."""
    per: dict[int, dict[str, list[float]]] = {}
    for m in msgs:
        for r in m.steps:
            if not lo <= r.step < hi or r.phases is None:
                continue
            row = per.setdefault(r.rank, {})
            row.setdefault("step", []).append(r.end - r.start)
            for name in ("data", "forward", "backward", "comm_wait", "optimizer"):
                row.setdefault(name, []).append(getattr(r.phases, name) or 0.0)
    return {rank: {k: sorted(v)[len(v) // 2] for k, v in row.items()} for rank, row in per.items()}


@contextmanager
def background_load(count: int) -> Iterator[None]:
    """``count`` unpinned processes with bursts of CPU work: the machine's other users."""
    procs = [subprocess.Popen([sys.executable, "-c", BURSTY_LOOP, str(i)]) for i in range(count)]
    try:
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(5)

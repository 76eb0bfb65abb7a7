"""Attacks on the node agent's step socket (boundary 1), against the real agent and broker.

Each test runs ``stepwatch agent`` as a subprocess publishing to the real
(Tansu) broker, attacks its socket the way a local unprivileged user could,
and reads the broker's topics back: forged records must be absent, counted
in ``stepwatch_agent_datagrams_rejected_total{reason}``, and real steps sent
afterwards must arrive. The socket lives below a world-traversable directory,
so only the agent's own modes keep other users out.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from stepwatch.agents.sink import Sequencer
from stepwatch.agents.spool import Spool
from stepwatch.contract import StepMessage, StepRecord, Topics, decode, encode, message_key
from stepwatch.contract.wire import RankStep, encode_datagram
from stepwatch.daemons.process import free_port
from stepwatch.settings import Settings
from tests.integration.agents.test_kafka import metric, wait_for
from tests.support import paths

ROOT = paths.ROOT
HOST = "node-it"
LIMIT = 256 * 1024  # the agent's default agent_max_message_bytes
REJECTED = "stepwatch_agent_datagrams_rejected_total"


@dataclass
class AgentProc:
    proc: subprocess.Popen[bytes]
    socket: str
    port: int
    log: Path

    def metric(self, name: str) -> float:
        return metric(self.port, name)

    def stop(self) -> str:
        self.proc.send_signal(signal.SIGTERM)
        assert self.proc.wait(timeout=30) == 0, self.log.read_text()
        return self.log.read_text()


@pytest.fixture()
def public_dir() -> Iterator[Path]:
    """A directory every user can traverse (pytest's own are 0700)."""
    base = Path(tempfile.mkdtemp(prefix="stepwatch-attack-"))
    os.chmod(base, 0o755)
    yield base
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture()
def start_agent(settings: Settings, public_dir: Path) -> Iterator:
    started: list[AgentProc] = []

    def start(*extra: str, spool: Path | None = None) -> AgentProc:
        port = free_port()
        sock = str(public_dir / "run" / "agent.sock")
        log = public_dir / f"agent{len(started)}.log"
        cmd = [
            sys.executable,
            "-m",
            "stepwatch.cli",
            "agent",
            "--bootstrap-servers",
            settings.bootstrap_servers,
            "--topic-prefix",
            "t",
            "--partitions",
            "4",
            "--host",
            HOST,
            "--collectors",
            "steps",
            "--socket",
            sock,
            "--spool-dir",
            str(spool or public_dir / "spool"),
            "--tick",
            "0.5",
            "--metrics-port",
            str(port),
            *extra,
        ]
        env = {k: v for k, v in os.environ.items() if not k.startswith("STEPWATCH_")}
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                cmd,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=ROOT,
                env={**env, "PYTHONPATH": str(ROOT)},
            )
        agent = AgentProc(proc, sock, port, log)
        started.append(agent)
        wait_for(log, "kafka ready", proc)
        return agent

    yield start
    for agent in started:
        if agent.proc.poll() is None:
            agent.proc.kill()
            agent.proc.wait(5)


def step_datagram(job: str, n: int, rank: int = 0, host: str = "") -> bytes:
    now = time.time()
    rec = StepRecord(
        job_id=job, rank=rank, world_size=8, step=n, start=now - 0.1, end=now, host=host
    )
    return encode_datagram(RankStep(step=rec))


def sdk_child(path: str, env: dict[str, str], init_args: str, steps: int = 3) -> None:
    """A real training process: the real SDK, its own environment, a few steps."""
    # it lives on a second after its last send, as a rank does: the agent checks a sender
    # in /proc, and one that exited before its datagram was read is ``sender_gone``
    script = textwrap.dedent(f"""
        import time
        import stepwatch
        sw = stepwatch.init({init_args + ", " if init_args else ""}job_events=False, cpu_wait=False)
        for _ in range({steps}):
            with sw.step():
                pass
        sw.close()
        assert sw.sent == {steps}, sw.stats()
        time.sleep(1.0)
    """)
    base = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("STEPWATCH_", "SLURM_", "RANK", "TORCHELASTIC_"))
    }
    run = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        capture_output=True,
        env={**base, "PYTHONPATH": str(ROOT), "STEPWATCH_AGENT_SOCKET": path, **env},
        timeout=60,
        check=False,
    )
    assert run.returncode == 0, run.stderr.decode()


def all_messages(bootstrap: str, topic: str, idle: float = 2.0) -> list[tuple[int, StepMessage]]:
    """Every record of ``topic`` from the beginning, with its size, until ``idle`` s of nothing."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"it-{uuid.uuid4()}",
            "enable.auto.commit": False,
            "log_level": 0,
        }
    )
    try:
        meta = consumer.list_topics(timeout=10).topics
        consumer.assign(
            [TopicPartition(topic, p, OFFSET_BEGINNING) for p in meta[topic].partitions]
        )
        out: list[tuple[int, StepMessage]] = []
        last = time.monotonic()
        while time.monotonic() - last < idle:
            for msg in consumer.consume(num_messages=1000, timeout=0.3):
                if msg.error() is None:
                    value = msg.value() or b""
                    out.append((len(value), decode(value)))  # type: ignore[arg-type]
                    last = time.monotonic()
        return out
    finally:
        consumer.close()


def steps_on_broker(settings: Settings) -> list[tuple[int, StepRecord]]:
    got = all_messages(settings.bootstrap_servers, Topics("t").steps)
    return [(size, r) for size, m in got for r in m.steps]


def wait_metric(agent: AgentProc, name: str, want: float, timeout: float = 15) -> float:
    deadline = time.monotonic() + timeout
    value = -1.0
    while time.monotonic() < deadline:
        try:
            value = agent.metric(name)
        except AssertionError:
            value = 0.0
        if value >= want:
            return value
        time.sleep(0.1)
    return value


# ---------------------------------------------------------------------- (a) modes
@pytest.mark.timeout(90)
def test_a_socket_directory_0750_and_socket_not_world_writable(start_agent) -> None:
    agent = start_agent()
    sock, directory = Path(agent.socket).stat(), Path(agent.socket).parent.stat()
    assert stat.S_IMODE(directory.st_mode) == 0o750
    assert stat.S_IMODE(sock.st_mode) == 0o620
    assert not sock.st_mode & stat.S_IWOTH and not directory.st_mode & stat.S_IXOTH


# ---------------------------------------------------------------------- (b) (c) forgeries
@pytest.mark.timeout(120)
def test_b_forged_host_is_rejected_counted_and_never_published(
    start_agent, settings: Settings
) -> None:
    agent = start_agent()
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.sendto(step_datagram("job-b", 1, host="gpu-[001-100]"), agent.socket)
        s.sendto(step_datagram("job-b", 2, host="gpu-001"), agent.socket)
        s.sendto(step_datagram("job-b", 3), agent.socket)
    assert wait_metric(agent, f'{REJECTED}{{reason="host_mismatch"}}', 2) == 2
    agent.stop()
    records = [r for _, r in steps_on_broker(settings)]
    assert [(r.job_id, r.step, r.host) for r in records] == [("job-b", 3, HOST)]
    assert "gpu-[001-100]" in agent.log.read_text()  # logged once, with the sender's pid


@pytest.mark.timeout(120)
def test_c_forged_job_host_and_rank_through_the_real_sdk(start_agent, settings: Settings) -> None:
    agent = start_agent()
    in_job_41 = {"SLURM_JOB_ID": "41"}
    sdk_child(agent.socket, in_job_41, 'job_id="42"')  # claims a job it does not run
    sdk_child(agent.socket, in_job_41, 'host="gpu-[001-100]"')  # claims another host
    sdk_child(agent.socket, {**in_job_41, "RANK": "2", "WORLD_SIZE": "8"}, "rank=5")
    sdk_child(agent.socket, {**in_job_41, "RANK": "2", "WORLD_SIZE": "8"}, "")  # allowed
    for reason in ("job_mismatch", "host_mismatch", "rank_mismatch"):
        assert wait_metric(agent, f'{REJECTED}{{reason="{reason}"}}', 3) == 3, reason
    agent.stop()
    records = [r for _, r in steps_on_broker(settings)]
    assert sorted((r.job_id, r.rank, r.step, r.host) for r in records) == [
        ("41", 2, n, HOST) for n in range(3)
    ]


# ---------------------------------------------------------------------- (d) floods
FLOOD = """
import socket, sys, time
from stepwatch.contract import StepRecord
from stepwatch.contract.wire import RankStep, encode_datagram
now = time.time()
data = [encode_datagram(RankStep(step=StepRecord(job_id="flood", rank=i % 8, world_size=8,
        step=i, start=now - 0.1, end=now))) for i in range(20_000)]
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
t0 = time.monotonic()
for d in data:
    s.sendto(d, sys.argv[1])
print(f"sent=20000 seconds={time.monotonic() - t0:.3f}")
"""


def flood(path: str) -> str:
    run = subprocess.run(
        [sys.executable, "-c", FLOOD, path],
        cwd=ROOT,
        capture_output=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=120,
        check=False,
    )
    assert run.returncode == 0, run.stderr.decode()
    return run.stdout.decode()


@pytest.mark.timeout(240)
@pytest.mark.parametrize("limit", ["rate-limited", "no-rate-limit"])
def test_d_flood_of_20000_datagrams_neither_wedges_nor_hides_later_steps(
    start_agent, settings: Settings, public_dir: Path, limit: str
) -> None:
    extra = ("--sender-rate", "0", "--user-rate", "0") if limit == "no-rate-limit" else ()
    agent = start_agent(*extra)
    seconds = float(flood(agent.socket).split("seconds=")[1])
    sdk_child(agent.socket, {"STEPWATCH_JOB_ID": "real", "RANK": "0"}, "", steps=5)
    # rate-limited: only the burst (1000) and what the rate (500/s) refilled got in
    bound = 20_000 - 1000 - 500 * (seconds + 0.1) if limit == "rate-limited" else 1
    limited = wait_metric(agent, f'{REJECTED}{{reason="rate_limited"}}', bound, timeout=5)
    if limit == "rate-limited":
        assert limited >= bound
    assert wait_metric(agent, "stepwatch_agent_messages_produced_total", 1) >= 1
    assert agent.metric("stepwatch_agent_producer_resets_total") == 0  # never "Kafka down"
    text = agent.stop()
    assert "undelivered_in_spool=0" in text

    # a restart over the same spool recovers and delivers what comes next
    again = start_agent(*extra)
    sdk_child(again.socket, {"STEPWATCH_JOB_ID": "real", "RANK": "0"}, "start_step=5", steps=4)
    again.stop()
    got = steps_on_broker(settings)
    assert max(size for size, _ in got) <= LIMIT  # no message over the limit was built
    assert sorted(r.step for _, r in got if r.job_id == "real") == list(range(9))
    flooded = sum(1 for _, r in got if r.job_id == "flood")
    if limit == "no-rate-limit":
        assert flooded == 20_000  # all of it, in messages under the limit
    else:
        assert 1000 <= flooded <= 20_000 - limited
    assert not list((public_dir / "spool" / "dead").glob("*.json"))


@pytest.mark.timeout(180)
def test_d_poison_record_left_in_an_old_spool_is_passed_on_restart(
    start_agent, settings: Settings, public_dir: Path
) -> None:
    spool_dir = public_dir / "old-spool"
    seq = Sequencer("old00000")
    now = time.time()
    recs = [
        StepRecord(
            job_id="old", rank=i % 8, world_size=8, step=i, start=now - 1, end=now, host=HOST
        )
        for i in range(12_000)
    ]
    poison = seq.stamp(StepMessage(host=HOST, ts=now, job_id="old", steps=recs))
    assert len(encode(poison)) > 1_000_000  # what the old agent built from a flood
    spool = Spool(spool_dir, 512 * 1024 * 1024)
    spool.append([(Topics("t").steps, message_key(poison), encode(poison), 0)])
    spool.close()
    agent = start_agent(spool=spool_dir)
    sdk_child(agent.socket, {"STEPWATCH_JOB_ID": "after", "RANK": "0"}, "", steps=3)
    assert wait_metric(agent, 'stepwatch_agent_dead_letters_total{reason="too_large"}', 1) == 1
    text = agent.stop()
    assert "undelivered_in_spool=0" in text
    got = steps_on_broker(settings)
    assert sorted(r.step for _, r in got if r.job_id == "after") == [0, 1, 2]
    assert not [r for _, r in got if r.job_id == "old"]
    assert len(list((spool_dir / "dead").glob("*.json"))) == 1


# ---------------------------------------------------------------------- (e) other users
# The probe stays alive until its stdin closes, as a rank does: a sender that exits before
# the agent reads its datagram is rejected as ``sender_gone`` (see the sender gate), which
# on a loaded machine a send-and-exit probe sometimes was.
PROBE = """
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
try:
    s.sendto(bytes.fromhex(sys.argv[2]), sys.argv[1])
except PermissionError:
    print("refused", flush=True)
else:
    print("sent", flush=True)
sys.stdin.read()
"""
NOBODY = 65534


@pytest.mark.timeout(120)
@pytest.mark.skipif(os.geteuid() != 0, reason="switching to another user needs root")
def test_e_another_user_cannot_send_unless_in_the_socket_group(
    start_agent, settings: Settings
) -> None:
    python = shutil.which("python3", path="/usr/bin:/bin") or sys.executable
    agent = start_agent("--socket-group", "users")
    probes: list[subprocess.Popen[bytes]] = []

    def as_nobody(groups: list[int], payload: bytes) -> str:
        probe = subprocess.Popen(
            [python, "-c", PROBE, agent.socket, payload.hex()],
            user=NOBODY,
            group=NOBODY,
            extra_groups=groups,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd="/",
            env={"PATH": "/usr/bin:/bin"},
        )
        probes.append(probe)
        assert probe.stdout is not None
        said = probe.stdout.readline().decode().strip()
        assert said, probe.communicate(timeout=30)[1].decode()
        return said

    users = 100
    try:
        assert as_nobody([], step_datagram("job-e", 1)) == "refused"
        assert as_nobody([users], step_datagram("job-e", 2)) == "sent"
        assert wait_metric(agent, "stepwatch_agent_steps_received_total", 1) == 1
    finally:
        for probe in probes:
            _, err = probe.communicate(timeout=30)  # closes its stdin: it exits
            assert probe.returncode == 0, err.decode()
    agent.stop()
    assert [(r.job_id, r.step) for _, r in steps_on_broker(settings)] == [("job-e", 2)]

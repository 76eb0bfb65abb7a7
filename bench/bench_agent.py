"""Benchmark the node agent: its cost on a host, and the publisher's throughput.

1. Host cost. Against a development broker, for ``--seconds`` (default 60):
   the real agent (``stepwatch agent``, 1 Hz) with 8 replayed GPUs
   (``nvml-replay``), the RDMA ports of the sysfs fixture tree and 8 fake ranks
   sending one step per second each through the SDK and the agent's socket;
   measured side by side with two baselines in the same window: an idle Python
   process and the agent with no collectors. CPU is % of one core from
   ``/proc/<pid>/stat`` (utime+stime), memory is VmRSS. Goal: < 1 % and < 80 MB.
2. Publisher throughput: messages/s through spool + produce (+ delivery
   confirmed) for many simulated hosts, against a bare confluent-kafka producer
   with the same settings and the same encoded messages (baseline).

Run: ``python bench/bench_agent.py`` (``--seconds 20`` for a quick look).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from stepwatch.agents.sink import Sequencer
    from stepwatch.contract import Message

ROOT = Path(__file__).resolve().parents[1]

SYSFS = ROOT / "tests" / "fixtures" / "sysfs"
TICKS_PER_SECOND = os.sysconf("SC_CLK_TCK")


@dataclass
class Sample:
    cpu_seconds: float
    rss_mb: float
    at: float


def sample(pid: int) -> Sample:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / TICKS_PER_SECOND  # utime, stime
    rss = 0.0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1]) / 1024
    return Sample(cpu, rss, time.monotonic())


def available(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def host_collectors() -> list[str]:
    names = ["steps"]
    if available("stepwatch.agents.collectors.nvml_replay"):
        names.append("nvml-replay")
    if available("stepwatch.agents.collectors.rdma") and (SYSFS / "class" / "infiniband").is_dir():
        names.append("rdma")
    return names


def start_agent(
    name: str, bootstrap: str, work: Path, collectors: list[str]
) -> subprocess.Popen[bytes]:
    from stepwatch.daemons.process import free_port

    cmd = [
        sys.executable,
        "-m",
        "stepwatch.cli",
        "agent",
        "--bootstrap-servers",
        bootstrap,
        "--host",
        f"bench-{name}",
        "--collectors",
        ",".join(collectors) or "none",
        "--socket",
        str(work / f"{name}.sock"),
        "--spool-dir",
        str(work / f"spool-{name}"),
        "--sysfs-root",
        str(SYSFS),
        "--tick",
        "1",
        "--metrics-port",
        str(free_port()),
    ]
    log = open(work / f"{name}.log", "wb")  # noqa: SIM115
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=env)


def wait_ready(work: Path, names: list[str], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    for name in names:
        log = work / f"{name}.log"
        while "kafka ready" not in (log.read_text() if log.exists() else ""):
            if time.monotonic() > deadline:
                raise SystemExit(f"agent {name} not ready:\n{log.read_text()}")
            time.sleep(0.1)


def ranks_child(path: str, seconds: float, ranks: int = 8) -> None:
    """Child process: ``ranks`` SDK instances, one step per second each."""
    import stepwatch

    watches = [
        stepwatch.init(
            job_id="bench-job", rank=r, world_size=ranks, local_rank=r, agent_socket=path, env={}
        )
        for r in range(ranks)
    ]
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for sw in watches:
            with sw.step(samples=32, tokens=32 * 4096):
                with sw.phase("forward"):
                    pass
                with sw.phase("backward"):
                    pass
        time.sleep(1.0 - time.time() % 1.0)
    for sw in watches:
        sw.close()


def host_cost(seconds: float, warmup: float) -> list[tuple[str, Sample, Sample, str]]:
    from stepwatch.daemons.broker import DevBroker

    work = Path(tempfile.mkdtemp(prefix="bench-agent-"))
    collectors = host_collectors()
    total = seconds + warmup + 30
    with DevBroker() as broker:
        idle = subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({total})"])
        bare = start_agent("bare", broker.bootstrap, work, [])
        full = start_agent("full", broker.bootstrap, work, collectors)
        procs = {
            "idle python": idle,
            "agent, no collectors": bare,
            f"agent: {'+'.join(collectors)}, 8 ranks": full,
        }
        try:
            wait_ready(work, ["bare", "full"])
            ranks = subprocess.Popen(
                [
                    sys.executable,
                    __file__,
                    "--ranks-child",
                    str(work / "full.sock"),
                    str(seconds + warmup + 5),
                ],
                cwd=ROOT,
            )
            time.sleep(warmup)
            first = {name: sample(p.pid) for name, p in procs.items()}
            time.sleep(seconds)
            last = {name: sample(p.pid) for name, p in procs.items()}
            for p in (bare, full):
                p.send_signal(signal.SIGTERM)
            for p in (bare, full):
                p.wait(timeout=30)
            ranks.wait(timeout=30)
        finally:
            for p in procs.values():
                if p.poll() is None:
                    p.kill()
    notes = {name: _final_line(work / f"{name}.log") for name in ("bare", "full")}
    keys = list(procs)
    return [
        (keys[0], first[keys[0]], last[keys[0]], ""),
        (keys[1], first[keys[1]], last[keys[1]], notes["bare"]),
        (keys[2], first[keys[2]], last[keys[2]], notes["full"]),
    ]


def _final_line(log: Path) -> str:
    for line in reversed(log.read_text().splitlines()):
        if "agent stopped" in line:
            return line.split("msg=", 1)[1].strip('"')
    return "no clean stop in the log"


def throughput(n: int) -> tuple[float, float]:
    """(publisher msg/s, bare producer msg/s) for ``n`` messages from many hosts."""
    from confluent_kafka import Producer

    from stepwatch.agents.publisher import KafkaPublisher
    from stepwatch.agents.sink import Sequencer
    from stepwatch.contract import StepMessage, Topics, encode, message_key
    from stepwatch.daemons.broker import DevBroker
    from stepwatch.kafka import ensure_topics, producer_config
    from stepwatch.settings import Settings

    messages = _fleet_messages(n, Sequencer())
    with DevBroker() as broker:
        settings = Settings.load(
            env={},
            bootstrap_servers=broker.bootstrap,
            spool_dir=tempfile.mkdtemp(prefix="bench-spool-"),
        )
        ensure_topics(settings)
        pub = KafkaPublisher(settings)
        pub.send(messages[:100])  # connect and warm up
        pub.flush(30)
        t0 = time.perf_counter()
        for i in range(100, len(messages), 1000):
            pub.send(messages[i : i + 1000])
        left = pub.flush(120)
        rate = (len(messages) - 100 - left) / (time.perf_counter() - t0)
        pub.close()

        topics = Topics(settings.topic_prefix)
        encoded = [
            (topics.steps if isinstance(m, StepMessage) else topics.gpu, message_key(m), encode(m))
            for m in messages
        ]
        producer = Producer(producer_config(settings))
        producer.produce(*encoded[0][::2])
        producer.flush(30)
        t0 = time.perf_counter()
        for topic, key, value in encoded[100:]:
            while True:
                try:
                    producer.produce(topic, value, key, on_delivery=_noop)
                    break
                except BufferError:
                    producer.poll(0.01)
        producer.flush(120)
        bare = (len(encoded) - 100) / (time.perf_counter() - t0)
    return rate, bare


def _noop(err: object, msg: object) -> None:
    pass


def _fleet_messages(n: int, seq: Sequencer) -> list[Message]:
    """One tick of a big fleet, repeated: per host a StepMessage (8 ranks) and a GpuMessage."""
    from stepwatch.contract import GpuMessage, GpuReading, StepMessage, StepRecord

    now = time.time()
    out: list[Message] = []
    hosts = max(1, n // 2)
    for h in range(hosts):
        host = f"node{h % 2048:04d}"
        recs = [
            StepRecord(
                job_id="llama",
                rank=(h % 2048) * 8 + r,
                world_size=16384,
                step=h // 2048,
                start=now - 1,
                end=now,
                host=host,
                local_rank=r,
            )
            for r in range(8)
        ]
        out.append(seq.stamp(StepMessage(host=host, ts=now, job_id="llama", steps=recs)))
        gpus = [
            GpuReading(
                index=i,
                power_w=650.0,
                temp_gpu_c=61.0,
                sm_clock_mhz=1980.0,
                util_gpu_pct=100.0,
                fb_used_mib=70000.0,
            )
            for i in range(8)
        ]
        out.append(seq.stamp(GpuMessage(host=host, ts=now, job_id="llama", gpus=gpus)))
    return out[:n]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="measurement window")
    parser.add_argument("--warmup", type=float, default=5.0)
    parser.add_argument("--messages", type=int, default=200_000, help="throughput run size")
    parser.add_argument("--only", choices=("host", "throughput"), help="run one part only")
    parser.add_argument(
        "--ranks-child", nargs=2, metavar=("SOCKET", "SECONDS"), help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    if args.ranks_child:
        ranks_child(args.ranks_child[0], float(args.ranks_child[1]))
        return

    if args.only != "throughput":
        report_host_cost(args.seconds, args.warmup)
    if args.only != "host":
        report_throughput(args.messages)


def report_host_cost(seconds: float, warmup: float) -> None:
    print(f"host cost: {seconds:.0f} s window after {warmup:.0f} s warm-up, tick 1 s")
    rows = host_cost(seconds, warmup)
    base_cpu = None
    print(f"{'process':44} {'CPU % of 1 core':>16} {'RSS MB':>8}")
    for name, a, b, _ in rows:
        cpu = 100 * (b.cpu_seconds - a.cpu_seconds) / (b.at - a.at)
        base_cpu = cpu if base_cpu is None else base_cpu
        print(f"{name:44} {cpu:16.2f} {b.rss_mb:8.1f}")
    for name, _, _, note in rows[1:]:
        print(f"  {name}: {note}")
    full_cpu = (
        100 * (rows[2][2].cpu_seconds - rows[2][1].cpu_seconds) / (rows[2][2].at - rows[2][1].at)
    )
    print(
        f"goal: agent < 1 % of one core and < 80 MB RSS -> "
        f"{'met' if full_cpu < 1.0 and rows[2][2].rss_mb < 80 else 'NOT met'} "
        f"(idle Python baseline {base_cpu:.2f} %, {rows[0][2].rss_mb:.1f} MB)"
    )


def report_throughput(n: int) -> None:
    print(
        f"\npublisher throughput: {n} messages (StepMessage of 8 ranks / "
        f"GpuMessage of 8 GPUs, 2048 hosts)"
    )
    rate, bare = throughput(n)
    print(f"{'path':44} {'messages/s':>12}")
    print(f"{'KafkaPublisher (spool + produce + confirm)':44} {rate:12.0f}")
    print(f"{'bare confluent-kafka producer (baseline)':44} {bare:12.0f}")
    print(
        f"ratio publisher / bare producer: {rate / bare:.2f}; goal >= 50000 msg/s -> "
        f"{'met' if rate >= 50_000 else 'NOT met'}"
    )


if __name__ == "__main__":
    main()

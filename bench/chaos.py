"""Chaos audit: kill -9 every component at random moments, then check end to end
that nothing was lost, duplicated or opened twice.

The fleet: ``--agents`` node agents (``bench/chaos_agent.py``: a job of 2 nodes
x 4 GPUs each, with stragglers, through the real Sequencer -> spool -> Kafka
publisher path), two ``stepwatch stream`` workers in one group, the ClickHouse
sink (``stepwatch db sink``, embedded engine) and the development broker
(Tansu). A seeded schedule kills one component at a time with SIGKILL and
restarts it after a few seconds (a stream worker: once the survivor has taken
its partitions over, which is timed). Every component type is hit in the
first round; the rest are drawn at random.

**The broker forgets.** Tansu keeps everything in memory: a killed broker
takes with it the records it acknowledged that no consumer had read, the
consumer groups' offsets, the detections and the stream ledger's changelog. A
production cluster with replication does not lose acknowledged records, so
the harness plays the replicas: after restarting the broker it re-creates the
topics and re-produces what the dead broker held in its last
``--redrive-seconds`` (the agents' outbox records by event time, and the
detection, dead-letter and changelog records its tap had read). What the sink
had not stored of what is older than that window counts as lost. Consumers
restart from the earliest offset of the new, empty topics; re-driven records
they had already read arrive twice, as they would after any at-least-once
redelivery, and must be de-duplicated downstream like any other. Records
written in the instant between the tap's last read and the kill are not
re-driven (a replica would have them); with the tap polling every 0.5 s that
window is small, and any loss it causes shows in the audit.

**Audit** (after the agents stop, the pipeline drains and the sink stops):

* produced = the agents' outboxes (every message appended to a spool);
  each ``(kind, host, inst, seq)`` must be in its ClickHouse table with
  exactly its rows (a step message's records, a GPU message's GPUs, ...);
  counted without ``FINAL`` (what a plain query sees) and with it;
* every detection state change the workers emitted (the tap) is in the
  ``detections`` table once; no detection id is opened twice and no subject
  (job, type, rank, gpu, group, host) is opened again under a new id while
  open;
* no dead letter (topic or store table): every message in the run is good.

Run: ``python bench/chaos.py --seed 7`` (about 24 faults, ~6 min);
``--soak --seconds 1800`` for the soak (no faults; RSS of every service
every ``--rss-every`` seconds, per-third medians, slopes and a levels-off
verdict per service, and where the sink's memory is: ``chaos_rss.py``,
docs/streams.md "Soak").
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import harness
from chaos_audit import Tap, audit, print_report, read_outboxes
from chaos_rss import MIB, Row, Series, print_summaries, print_table, rss_split, soak_loop
from harness import CLI, Proc, Worker, metric, rss_bytes, scrape, sink, stream_worker, wait_until

from stepwatch.contract import Topics
from stepwatch.daemons.broker import DevBroker
from stepwatch.kafka import ensure_topics
from stepwatch.settings import Settings

PREFIX, PARTITIONS, GROUP = "chaos", 4, "chaos-stream"
CHANGELOG = f"{GROUP}-open-detections-changelog"
KINDS = ("agent", "worker", "sink", "broker")


@dataclass
class Fleet:
    """Every process of the run, and what the harness learned while running it."""

    workdir: Path
    broker: DevBroker
    workers: list[Worker]
    sink: Worker
    agents: list[Proc]
    tap: Tap | None = None
    faults: Counter[str] = field(default_factory=Counter)
    takeovers: list[float] = field(default_factory=list)
    redriven: int = 0
    log: list[str] = field(default_factory=list)
    events: list[tuple[float, str]] = field(default_factory=list)  # (wall time, fault kind)

    def note(self, text: str) -> None:
        line = f"{time.strftime('%H:%M:%S')} {text}"
        self.log.append(line)
        print(f"  {line}", flush=True)

    def procs(self) -> list[Proc]:
        return [w.proc for w in self.workers] + [self.sink.proc] + self.agents


def build(workdir: Path, agents: int, session_timeout: float) -> Fleet:
    broker = DevBroker(log_path=str(workdir / "broker.log")).start()
    bootstrap = broker.bootstrap
    workers = [
        stream_worker(
            n,
            workdir,
            bootstrap,
            PREFIX,
            PARTITIONS,
            GROUP,
            ["--session-timeout", str(session_timeout)],
        )
        for n in ("wa", "wb")
    ]
    start = time.time()
    fleet_agents = []
    for i in range(agents):
        job = f"cj{i}"
        argv = [
            *CLI[:1],
            str(harness.ROOT / "bench" / "chaos_agent.py"),
            "--bootstrap",
            bootstrap,
            "--prefix",
            PREFIX,
            "--partitions",
            str(PARTITIONS),
            "--spool",
            str(workdir / f"spool-{job}"),
            "--outbox",
            str(workdir / f"outbox-{job}.txt"),
            "--job",
            job,
            "--start",
            str(start),
            "--seed",
            str(100 + i),
        ]

        def agent_argv(a: list[str] = argv) -> list[str]:
            return a

        fleet_agents.append(Proc(f"agent-{job}", agent_argv, workdir / f"agent-{job}.log"))
    return Fleet(
        workdir, broker, workers, sink(workdir, bootstrap, PREFIX, PARTITIONS), fleet_agents
    )


def settings_of(fleet: Fleet) -> Settings:
    return Settings.load(
        env={}, bootstrap_servers=fleet.broker.bootstrap, topic_prefix=PREFIX, partitions=PARTITIONS
    )


def start(fleet: Fleet) -> None:
    ensure_topics(settings_of(fleet))
    for w in fleet.workers:
        w.proc.start()
    fleet.sink.proc.start()
    wait_until(
        "both workers ready",
        lambda: all(metric(scrape(w.port), "stepwatch_stream_ready") == 1 for w in fleet.workers),
        240,
        tuple(w.proc for w in fleet.workers),
    )
    ensure_topics(settings_of(fleet), [CHANGELOG])
    topics = Topics(PREFIX)
    fleet.tap = Tap(fleet.broker.bootstrap, [topics.detections, topics.dlq, CHANGELOG]).start()
    for a in fleet.agents:
        a.start()
    fleet.note("fleet started")


# ---------------------------------------------------------------- faults
def inject(fleet: Fleet, kind: str, rng: random.Random, redrive_s: float) -> None:
    fleet.faults[kind] += 1
    fleet.events.append((time.time(), kind))
    if kind == "agent":
        victim = rng.choice(fleet.agents)
        victim.kill9()
        down = rng.uniform(1, 6)
        fleet.note(f"kill -9 {victim.name}, down {down:.1f} s")
        time.sleep(down)
        victim.start()
    elif kind == "sink":
        fleet.sink.proc.kill9()
        down = rng.uniform(1, 6)
        fleet.note(f"kill -9 sink, down {down:.1f} s")
        time.sleep(down)
        fleet.sink.proc.start()
    elif kind == "worker":
        kill_worker(fleet, rng)
    else:
        kill_broker(fleet, rng, redrive_s)


def kill_worker(fleet: Fleet, rng: random.Random) -> None:
    victim, survivor = rng.sample(fleet.workers, 2)
    held = metric(scrape(survivor.port), "stepwatch_stream_assigned_partitions")
    victim.proc.kill9()
    if held >= PARTITIONS:  # the victim owned nothing (still rejoining): no takeover to time
        fleet.note(f"kill -9 {victim.proc.name} (owned no partitions)")
        time.sleep(rng.uniform(0, 3))
        victim.proc.start()
        return
    t0 = time.monotonic()
    fleet.note(f"kill -9 {victim.proc.name}")
    try:
        wait_until(
            f"{survivor.proc.name} takes all partitions",
            lambda: (
                metric(s := scrape(survivor.port), "stepwatch_stream_assigned_partitions")
                == PARTITIONS
                and metric(s, "stepwatch_stream_ready") == 1
            ),
            180,
            (survivor.proc,),
            poll=0.2,
        )
        took = time.monotonic() - t0
        fleet.takeovers.append(took)
        fleet.note(f"{survivor.proc.name} took over in {took:.1f} s")
    except (TimeoutError, RuntimeError) as err:
        fleet.note(f"no takeover: {str(err).splitlines()[0]}")
    time.sleep(rng.uniform(0, 3))
    victim.proc.start()


def kill_broker(fleet: Fleet, rng: random.Random, redrive_s: float) -> None:
    proc = fleet.broker._proc
    assert proc is not None
    proc.kill()
    proc.wait(10)
    killed = time.time()
    down = rng.uniform(1, 6)
    fleet.note(f"kill -9 broker, down {down:.1f} s")
    time.sleep(down)
    fleet.broker.start()
    ensure_topics(settings_of(fleet))
    ensure_topics(settings_of(fleet), [CHANGELOG])
    fleet.redriven += redrive(fleet, killed - redrive_s, killed)
    fleet.note(f"broker back; re-drove {fleet.redriven} records so far")


def redrive(fleet: Fleet, since: float, until: float) -> int:
    """Re-produce what the dead broker held (see the module docstring)."""
    from confluent_kafka import Producer

    from stepwatch.contract import Kind, message_key

    topics = Topics(PREFIX)
    producer = Producer(
        {
            "bootstrap.servers": fleet.broker.bootstrap,
            "log_level": 0,
            "linger.ms": 20,
            "partitioner": "murmur2_random",  # the contract's placement
        }
    )
    n = 0
    produced = read_outboxes(sorted(fleet.workdir.glob("outbox-*.txt")))
    from stepwatch.contract import decode

    for p in sorted(produced.values(), key=lambda p: p.ts):
        if since <= p.ts <= until:
            message = decode(p.value)
            producer.produce(
                topics.for_kind(Kind(p.kind)),
                p.value,
                key=message_key(message),
                timestamp=int(p.ts * 1000),
            )
            n += 1
            producer.poll(0)
    assert fleet.tap is not None
    latest: dict[tuple[int, bytes | None], bytes | None] = {}
    for t in fleet.tap.snapshot():
        if t.topic == CHANGELOG:
            latest[(t.partition, t.key)] = t.value  # compacted: the last value per key
        elif since <= t.seen <= until and t.value is not None:
            producer.produce(t.topic, t.value, key=t.key, partition=t.partition)
            n += 1
    for (part, key), value in latest.items():
        producer.produce(CHANGELOG, value, key=key, partition=part)
        n += 1
    producer.flush(30)
    return n


def schedule(rng: random.Random, faults: int, kinds: tuple[str, ...] = KINDS) -> list[str]:
    first = list(kinds)
    rng.shuffle(first)
    weights = [{"agent": 3, "worker": 3, "sink": 2, "broker": 1}[k] for k in kinds]
    rest = rng.choices(kinds, weights=weights, k=max(0, faults - len(first)))
    return (first + rest)[:faults]


# ---------------------------------------------------------------- run
def drain(fleet: Fleet, quiet: float = 8.0, limit: float = 180.0) -> None:
    """Wait until the sink has consumed nothing new for ``quiet`` seconds."""
    last, since = -1.0, time.monotonic()
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        now = metric(scrape(fleet.sink.port), "stepwatch_sink_messages_total")
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet:
            return
        time.sleep(1)
    fleet.note("drain: the sink was still consuming at the limit")


def finish(fleet: Fleet) -> None:
    for p in fleet.procs():
        if not p.alive:
            p.start()
    for a in fleet.agents:
        a.stop(30)  # SIGTERM: the agent flushes its spool
    drain(fleet)
    for w in fleet.workers:
        w.proc.stop(30)
    drain(fleet)
    fleet.sink.proc.stop(60)
    if fleet.tap is not None:
        fleet.tap.stop()


def rss_row(fleet: Fleet) -> Row:
    """RSS in bytes of every service: broker, each worker, the sink, each agent."""
    row: Row = {"broker": rss_bytes(fleet.broker._proc.pid if fleet.broker._proc else None)}
    for w in fleet.workers:
        row[w.proc.name] = rss_bytes(w.proc.pid)
    row["sink"] = rss_bytes(fleet.sink.proc.pid)
    for a in fleet.agents:
        row[a.name.removeprefix("agent-")] = rss_bytes(a.pid)
    return row


INSIDE = {  # the sink's /metrics -> a column of the "inside the sink" table (MiB or a count)
    ("stepwatch_sink_memory_bytes", "engine_tracked"): "tracked",
    ("stepwatch_sink_memory_bytes", "jemalloc_allocated"): "je_alloc",
    ("stepwatch_sink_memory_bytes", "jemalloc_active"): "je_active",
    ("stepwatch_sink_memory_bytes", "jemalloc_metadata"): "je_meta",
    ("stepwatch_sink_memory_bytes", "jemalloc_resident"): "je_resid",
    ("stepwatch_sink_memory_bytes", "jemalloc_retained"): "je_retain",
    ("stepwatch_sink_memory_bytes", "glibc_in_use"): "glibc_use",
    ("stepwatch_sink_memory_bytes", "glibc_free"): "glibc_free",
    ("stepwatch_sink_memory_bytes", "mark_cache"): "mark_cache",
    ("stepwatch_sink_memory_bytes", "primary_key_bytes"): "pk_mem",
    ("stepwatch_sink_store_parts", "active"): "parts",
    ("stepwatch_sink_store_parts", "outdated"): "outdated",
    ("stepwatch_sink_memory_objects", "python_blocks"): "py_kblocks",
    ("stepwatch_sink_memory_objects", "dedup_senders"): "senders",
}


def sink_inside(fleet: Fleet) -> Row:
    """Where the sink's memory is, from its /metrics (MiB; parts and senders counted)."""
    samples = scrape(fleet.sink.port, timeout=10.0)
    row: Row = {}
    for (name, part), column in INSIDE.items():
        value = sum(
            v for (n, lab), v in samples.items() if n == name and part in dict(lab).values()
        )
        scale = (
            1e3 if column == "py_kblocks" else 1 if name != "stepwatch_sink_memory_bytes" else MIB
        )
        row[column] = value / scale
    row["dedup_k"] = dedup_log_entries(fleet.workdir / "chdb") / 1e3
    row["rss"] = rss_bytes(fleet.sink.proc.pid) / MIB
    row.update(rss_split(fleet.sink.proc.pid))
    return row


def dedup_log_entries(store: Path) -> int:
    """Insert tokens the store's tables remember (``deduplication_logs``, one line each).

    Each table keeps its last ``non_replicated_deduplication_window`` (10,000)
    tokens in memory too, so this is a term of the sink's memory that grows
    until every table's window is full.
    """
    n = 0
    for log_file in store.glob("store/*/*/deduplication_logs/*.txt"):
        try:
            with open(log_file, "rb") as f:
                n += sum(1 for _ in f)
        except OSError:
            continue
    return n


def soak(fleet: Fleet, seconds: float, every: float) -> tuple[Series, Series]:
    return soak_loop(
        seconds,
        every,
        lambda: rss_row(fleet),
        lambda: sink_inside(fleet),
        time.monotonic,
        time.sleep,
    )


def print_rss(series: Series, inside: Series) -> None:
    print_table(series, "RSS over time (MiB)")
    print_summaries(series)
    print_table(
        inside,
        "inside the sink (MiB; parts, outdated, senders counted; py_kblocks: "
        "Python's allocated blocks / 1000; dedup_k: insert tokens remembered / 1000; "
        "anon, file: the RSS's anonymous and file-backed pages)",
        scale=1,
    )


def run(args: argparse.Namespace) -> int:
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="stepwatch-chaos-"))
    workdir.mkdir(parents=True, exist_ok=True)
    rng = random.Random(args.seed)
    fleet = build(workdir, args.agents, args.session_timeout)
    fleet.sink.proc.env.update(dict(kv.split("=", 1) for kv in args.sink_env))
    try:
        start(fleet)
        time.sleep(args.warmup)
        if args.soak:
            series, inside = soak(fleet, args.seconds, args.rss_every)
        else:
            for kind in schedule(rng, args.faults, tuple(args.kinds.split(","))):
                time.sleep(rng.uniform(args.gap_min, args.gap_max))
                inject(fleet, kind, rng, args.redrive_seconds)
        time.sleep(args.cooldown)
        finish(fleet)
        topics = Topics(PREFIX)
        report = audit(
            workdir / "chdb",
            read_outboxes(sorted(workdir.glob("outbox-*.txt"))),
            fleet.tap.snapshot() if fleet.tap else [],
            topics.detections,
            topics.dlq,
            fleet.events,
        )
    finally:
        for p in fleet.procs():
            p.kill9()
        if fleet.tap is not None:
            fleet.tap.stop()
        fleet.broker.stop()
    print(f"chaos audit seed={args.seed} agents={args.agents} workdir={workdir}")
    print(
        f"re-driven after broker loss {fleet.redriven} records "
        f"(window {args.redrive_seconds:.0f} s)"
    )
    print_report(report, fleet.faults, fleet.takeovers)
    if args.soak:
        print_rss(series, inside)
    bad = report.lost + report.duplicated + report.duplicate_opens + report.reopened
    return 1 if bad else 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--faults", type=int, default=24)
    p.add_argument("--agents", type=int, default=3)
    p.add_argument(
        "--kinds",
        default=",".join(KINDS),
        help="components to kill, comma-separated (default: all four)",
    )
    p.add_argument("--gap-min", type=float, default=2.0, help="seconds between faults, at least")
    p.add_argument("--gap-max", type=float, default=8.0, help="seconds between faults, at most")
    p.add_argument("--warmup", type=float, default=15.0)
    p.add_argument("--cooldown", type=float, default=10.0)
    p.add_argument("--redrive-seconds", type=float, default=120.0)
    p.add_argument("--session-timeout", type=float, default=6.0)
    p.add_argument("--soak", action="store_true", help="no faults; RSS of each component")
    p.add_argument("--seconds", type=float, default=1800.0, help="soak length")
    p.add_argument("--rss-every", type=float, default=60.0, help="soak: RSS sample period")
    p.add_argument(
        "--sink-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="soak experiments: an environment variable for the sink (repeatable), "
        "e.g. MALLOC_ARENA_MAX=2",
    )
    p.add_argument("--workdir", help="keep everything here (default: a temporary dir)")
    return p


if __name__ == "__main__":
    raise SystemExit(run(parser().parse_args()))

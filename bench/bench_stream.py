"""Benchmark the stream worker: records per second per core through the real path.

Pre-loads the four telemetry topics with simulator messages (several jobs,
8 GPUs and 8 NICs a node: a step message carries 8 step records, a GPU
message 8 GPU readings, a port message 8 port readings), then in one run:

1. **raw consume** (baseline): a bare confluent-kafka consumer assigned to
   every partition reads the same messages; CPU of this process.
2. **raw consume + decode**: the same, plus ``stepwatch.contract.decode``.
3. **processor only**: decode + dedup + detection core + metrics in-process,
   no Kafka (``StreamProcessor.process_batch``): the worker's Python floor,
   under the worker's GC settings (``tune_gc``), so that full collections do
   not also walk this benchmark's own copies of the data.
4. **worker**: ``stepwatch stream`` as a subprocess (Faust, aiokafka, the lean
   consumer, the engine, metrics), started on empty topics of their own and fed
   live: once it is ready and idle, the same messages are produced and it
   processes them as they arrive. Its CPU time comes from ``/proc/<pid>/stat``
   (all threads) between that moment and the scrape of its ``/metrics`` that
   shows every message processed. Checked: an idle worker uses ~7 ms of CPU per
   second and a scrape ~3 ms, about 1 % of the measured CPU at 2 scrapes/s.
   (Until this version it drained pre-loaded topics, measured from the first
   scrape that showed progress: the batch in flight then was left out, and the
   figure came out up to 20 % high, at random.)

An *event* is one record: a step record, a GPU reading, a port reading or a
discrete event. Kafka messages/s are printed too. Rates are per CPU-second
(= per core); the ratio compares each path with the raw consume of the same
run (rates swing between runs on a shared machine; ratios much less).
Goals: >= 150k events/s per worker core and a worker / raw-consume ratio of
>= 0.3 in the same run (issue 18; the previous goal was 100k).

``--floors`` adds two more runs of the worker, fed the same way, with part of
its hot path switched off (``bench/worker_floor.py``): **worker, core-off**
(the detection core a no-op: what the worker would do if detection cost
nothing) and **worker, layer** (no decoding either: the Kafka/Faust layer
alone). No change to the worker's code could take it above these rows. A last
line adds what decoding costs (the decode row less the raw consume) to the layer's
CPU: the ceiling of any worker on this layer that decodes its records in Python,
whatever it does after decoding.

``--garbage SHARE`` adds a run of the worker, fed the same way, with that share
of its records garbage mixed in evenly (truncated JSON, a wrong type, random
bytes, a valid message on another kind's topic, a host name that is not UTF-8,
in turn): its valid events per
CPU-second against the clean run's, and whether every garbage record came back
as a dead letter (``stepwatch_stream_dlq_messages_total``). Each dead letter is
a record the worker produces, and a batch is acknowledged only once the broker
has its outputs: this is what a flood of bad records costs.

``--against REV`` adds rounds (``--rounds``, default 3) of this tree's worker and
REV's (a git revision, checked out into a temporary worktree and run by
``bench/tree_cli.py``), fed the same way and alternated, each after a raw consume
of its own: the medians of both, and their quotient. This is how "the worker's
throughput is not below REV's" is measured (issue 17's clause, REV the code when it
was filed) without trusting rates from different sittings.

Run: ``python bench/bench_stream.py`` (``--jobs 4 --steps 150`` for a quick look).
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeAlias

if TYPE_CHECKING:
    from stepwatch.contract import Message
    from stepwatch.settings import Settings

ROOT = Path(__file__).resolve().parents[1]

TICKS = os.sysconf("SC_CLK_TCK")
GOAL_EVENTS = 150_000  # events per worker CPU-second
GOAL_RATIO = 0.3  # worker / raw consume, same run
# the worker's series the benchmark reads: name, labels (summed over), value
SERIES = re.compile(
    r"(stepwatch_stream_(?:messages_total|events_total|ready|dlq_messages_total))"
    r"(?:\{\S*\})? (\S+)"
)


@dataclass
class Row:
    name: str
    messages: int
    events: int
    cpu: float
    wall: float
    dead: int = 0  # dead letters the worker sent (the garbage run)

    def line(self, base: Row | None) -> str:
        ratio = f"{self.events / self.cpu / (base.events / base.cpu):6.3f}" if base else "     -"
        return (
            f"{self.name:<26} {self.messages:>9} {self.events:>10} {self.cpu:8.2f} "
            f"{self.wall:8.2f} {self.messages / self.cpu:>12,.0f} "
            f"{self.events / self.cpu:>12,.0f} {ratio}"
        )


def build(jobs: int, nodes: int, steps: int) -> list[Message]:
    from stepwatch.sim import Fault, FaultKind, Scenario, simulate

    start = time.time() - steps * 1.2 - 30
    scenarios = [
        Scenario(
            seed=i + 1,
            job_id=f"bench-{i}",
            nodes=nodes,
            gpus_per_node=8,
            nics_per_node=8,
            steps=steps,
            step_seconds=1.0,
            start_ts=start,
            hosts=tuple(f"b{i:02d}n{n:03d}" for n in range(nodes)),
            faults=(Fault(kind=FaultKind.SLOW_GPU, rank=3, start_step=steps // 3, severity=0.15),),
        )
        for i in range(jobs)
    ]
    return list(simulate(*scenarios))


def records_in(message: object) -> int:
    for attr in ("steps", "gpus", "ports"):
        if hasattr(message, attr):
            return len(getattr(message, attr))
    return 1


@dataclass(frozen=True)
class Garbage:
    """A record that is not a valid message of its topic (its dead letter is expected)."""

    kind: str  # the telemetry topic it is produced to
    key: bytes
    value: bytes


Item: TypeAlias = "Message | Garbage"


def with_garbage(messages: list[Message], share: float) -> list[Item]:
    """``messages`` with records no worker may accept mixed in evenly, ``share`` of the
    whole: truncated JSON, a wrong type, random bytes, a valid message on another kind's
    topic, a host name that is not UTF-8, in turn (each keyed like the message before
    it: the same partition)."""
    from stepwatch.contract import KIND_OF, encode, message_key

    if share <= 0:
        return list(messages)
    if share >= 1:
        raise SystemExit(f"bench: --garbage is a share of the records, below 1 (got {share})")
    rng = random.Random(7)
    every = (1 - share) / share  # valid messages per garbage record
    out: list[Item] = []
    due = every
    made = 0
    for i, m in enumerate(messages):
        out.append(m)
        while i + 1 >= due:
            due += every
            kind, key, value = KIND_OF[type(m)].value, message_key(m), encode(m)
            shape = made % 5
            made += 1
            if shape == 0:
                bad = value[: len(value) // 2]
            elif shape == 1:
                bad = b'{"kind":"%s","v":1,"ts":"soon"}' % kind.encode()
            elif shape == 2:
                bad = rng.randbytes(64)
            elif shape == 3:
                kind = "gpu" if kind != "gpu" else "port"
                bad = value
            else:  # one byte of the host name that is not UTF-8
                bad = value.replace(b'"host":"', b'"host":"\xff', 1)
            out.append(Garbage(kind, key, bad))
    return out


def preload(settings: Settings, messages: Sequence[Item]) -> list[tuple[str, bytes, bytes]]:
    """Produce the messages (a :class:`Garbage` as its bytes) to their topics."""
    from confluent_kafka import Producer

    from stepwatch.contract import KIND_OF, Topics, encode, message_key
    from stepwatch.kafka import ensure_topics, producer_config

    ensure_topics(settings)
    topics = Topics(settings.topic_prefix)
    producer = Producer(producer_config(settings))
    wire = []
    for i, m in enumerate(messages):
        if isinstance(m, Garbage):
            item = (topics.for_kind(m.kind), m.key, m.value)
        else:
            item = (topics.for_kind(KIND_OF[type(m)]), message_key(m), encode(m))
        wire.append(item)
        producer.produce(item[0], item[2], key=item[1])
        if i % 5000 == 0:
            producer.poll(0)
    if producer.flush(60):
        raise SystemExit("bench: messages not delivered to the broker")
    return wire


def raw_consume(settings: object, total: int, decode: bool) -> Row:
    from confluent_kafka import Consumer, TopicPartition

    from stepwatch.contract import Topics
    from stepwatch.contract import decode as decode_message

    topics = Topics(settings.topic_prefix)  # type: ignore[attr-defined]
    consumer = Consumer(
        {
            "bootstrap.servers": settings.bootstrap_servers,  # type: ignore[attr-defined]
            "group.id": f"bench-raw-{time.time()}",
            "enable.auto.commit": False,
        }
    )
    consumer.assign(
        [TopicPartition(t, p, 0) for t in topics.telemetry() for p in range(settings.partitions)]  # type: ignore[attr-defined]
    )
    n = events = 0
    cpu0, wall0 = time.process_time(), time.perf_counter()
    while n < total:
        for msg in consumer.consume(num_messages=10000, timeout=1.0):
            if msg.error():
                continue
            n += 1
            if decode:
                events += records_in(decode_message(msg.value() or b""))
    row = Row(
        "raw consume + decode" if decode else "raw consume (baseline)",
        n,
        events,
        time.process_time() - cpu0,
        time.perf_counter() - wall0,
    )
    consumer.close()
    return row


def processor_only(settings: object, wire: list[tuple[str, bytes, bytes]], events: int) -> Row:
    from stepwatch.contract import Topics
    from stepwatch.streams.worker.app import default_engine_factory, tune_gc
    from stepwatch.streams.worker.processor import RawRecord, Record, StreamProcessor

    proc = StreamProcessor(
        Topics(settings.topic_prefix),  # type: ignore[attr-defined]
        default_engine_factory(settings),  # type: ignore[arg-type]
    )
    recs: list[RawRecord] = [Record(t, hash(k) % 8, i, k, v) for i, (t, k, v) in enumerate(wire)]
    # the worker's GC settings (``stepwatch stream`` calls tune_gc at start-up); without
    # them every full collection here also walks the benchmark's own copies of the data
    threshold = gc.get_threshold()
    tune_gc()
    try:
        cpu0, wall0 = time.process_time(), time.perf_counter()
        for i in range(0, len(recs), 2000):
            proc.process_batch(recs[i : i + 2000])
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)
    return Row("processor only (no Kafka)", len(recs), events, cpu, wall)


def scrape(port: int) -> dict[str, float]:
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read()
    except OSError:
        return {}
    out: dict[str, float] = {}
    for line in text.decode().splitlines():
        m = SERIES.match(line)
        if m:
            out[m.group(1)] = out.get(m.group(1), 0.0) + float(m.group(2))
    return out


def cpu_of(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def worker(
    settings: Settings,
    messages: Sequence[Item],
    workdir: str,
    extra: list[str],
    floor: str = "",
    tree: Path | None = None,
) -> Row:
    """``stepwatch stream`` fed live: started on empty topics, measured from the moment
    it is ready and idle until it has processed every message produced after that.
    (Measuring a drain of pre-loaded topics from the first scrape that shows progress
    left out the CPU of the batch in flight at that scrape: up to 20 % too fast.)
    ``floor``: run it through ``worker_floor.py`` with that part switched off;
    ``tree``: run another checkout's worker (``tree_cli.py``)."""
    from stepwatch.daemons.process import free_port
    from stepwatch.kafka import ensure_topics
    from stepwatch.settings import Settings

    settings = Settings.load(
        env={},
        bootstrap_servers=settings.bootstrap_servers,
        topic_prefix=f"{settings.topic_prefix}w",
        partitions=settings.partitions,
    )
    ensure_topics(settings)
    total = len(messages)
    port = free_port()
    if tree is not None and floor:
        raise SystemExit("bench: a floor is this tree's worker with a part switched off")
    if tree is not None:
        launcher = [str(ROOT / "bench" / "tree_cli.py"), str(tree)]
    elif floor:
        launcher = [str(ROOT / "bench" / "worker_floor.py"), floor]
    else:
        launcher = ["-m", "stepwatch.cli"]
    cmd = [
        sys.executable,
        *launcher,
        "--log-level",
        "WARNING",
        "stream",
        "--bootstrap-servers",
        settings.bootstrap_servers,
        "--topic-prefix",
        settings.topic_prefix,
        "--partitions",
        str(settings.partitions),
        "--metrics-port",
        str(port),
        "--data-dir",
        os.path.join(workdir, "stream"),
        "--app-id",
        f"bench-{time.time()}",
        "--session-timeout",
        "6",
        *extra,
    ]
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=open(os.path.join(workdir, "worker.log"), "wb"),  # noqa: SIM115
    )

    def point() -> tuple[float, float, float, float, float, float]:
        m = scrape(port)
        return (
            m.get("stepwatch_stream_messages_total", 0),
            m.get("stepwatch_stream_events_total", 0),
            cpu_of(proc.pid),
            time.perf_counter(),
            m.get("stepwatch_stream_ready", 0),
            m.get("stepwatch_stream_dlq_messages_total", 0),
        )

    try:
        deadline = time.monotonic() + 120
        while point()[4] < 1:
            if time.monotonic() > deadline or proc.poll() is not None:
                raise SystemExit(f"bench: the worker did not get ready (see {workdir}/worker.log)")
            time.sleep(0.5)
        time.sleep(2.0)  # partitions assigned, start-up work done: idle
        first = point()
        preload(settings, messages)  # this process's CPU, not the worker's
        last = None
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and proc.poll() is None:
            now = point()
            if now[0] >= total:
                last = now
                break
            time.sleep(0.5)  # each scrape costs the worker CPU: not too often
        if last is None:
            raise SystemExit(f"bench: worker did not drain the topics (see {workdir}/worker.log)")
        return Row(
            f"worker, {floor}" if floor else "worker (stepwatch stream)",
            int(last[0] - first[0]),
            int(last[1] - first[1]),
            last[2] - first[2],
            last[3] - first[3],
            int(last[5] - first[5]),
        )
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


FLOORS = ("core-off", "layer")


def decode_floor(base: Row, decoded: Row, layer: Row) -> str:
    """The ceiling of any worker on this layer that decodes its records in Python: the
    layer's CPU plus what decoding added to the raw consume (no admission, duplicate
    filter, detection or metrics), against the raw consume."""
    cpu = layer.cpu + decoded.cpu - base.cpu
    rate, raw = base.events / cpu, base.events / base.cpu
    return (
        f"worker, layer + decode (a ceiling for any worker that decodes in Python): "
        f"{rate:,.0f} events/s per core, ratio {rate / raw:.3f} (goal {GOAL_RATIO}: "
        f"{'reachable' if rate / raw >= GOAL_RATIO else 'out of reach'} by a change "
        "after decoding)"
    )


def floor_row(
    settings: Settings, messages: list[Message], workdir: str, floor: str, events: int
) -> Row:
    """The worker with ``floor`` switched off, on topics of its own (the layer floor
    decodes nothing, so it cannot count events: the messages are the same ones)."""
    from stepwatch.settings import Settings

    own = Settings.load(
        env={},
        bootstrap_servers=settings.bootstrap_servers,
        topic_prefix=f"{settings.topic_prefix}{floor.replace('-', '')}",
        partitions=settings.partitions,
    )
    path = os.path.join(workdir, floor)
    os.makedirs(path, exist_ok=True)
    row = worker(own, messages, path, [], floor)
    row.events = events
    return row


def garbage_row(settings: Settings, messages: list[Message], workdir: str, share: float) -> Row:
    """The worker fed the same messages with garbage mixed in (:func:`with_garbage`), on
    topics of its own: every garbage record must come back as a dead letter."""
    from stepwatch.settings import Settings

    own = Settings.load(
        env={},
        bootstrap_servers=settings.bootstrap_servers,
        topic_prefix=f"{settings.topic_prefix}garbage",
        partitions=settings.partitions,
    )
    path = os.path.join(workdir, "garbage")
    os.makedirs(path, exist_ok=True)
    row = worker(own, with_garbage(messages, share), path, [])
    row.name = f"worker, {share:.0%} garbage"
    return row


def against_rows(
    settings: Settings,
    messages: list[Message],
    total: int,
    workdir: str,
    rev: str,
    rounds: int,
) -> list[tuple[Row, Row]]:
    """This tree's worker and ``rev``'s, fed the same way, alternated for ``rounds``
    rounds (which goes first swaps each round), each after a raw consume of the
    pre-loaded messages: its ratio's baseline, measured next to it. Pairs of
    (raw consume, worker); a worker row is named after its tree."""
    from bench_instr import checkout  # bench/, this script's folder

    from stepwatch.settings import Settings

    events = sum(records_in(m) for m in messages)
    out: list[tuple[Row, Row]] = []
    with checkout(rev, Path(workdir) / "against") as other:
        trees: list[tuple[str, Path | None]] = [("this tree", None), (rev, other)]
        for r in range(rounds):
            for i, (name, tree) in enumerate(trees if r % 2 == 0 else trees[::-1]):
                base = raw_consume(settings, total, decode=False)
                base.events = events
                own = Settings.load(
                    env={},
                    bootstrap_servers=settings.bootstrap_servers,
                    topic_prefix=f"{settings.topic_prefix}a{r}{i}",
                    partitions=settings.partitions,
                )
                path = os.path.join(workdir, f"against-{r}-{i}")
                os.makedirs(path)
                row = worker(own, messages, path, [], tree=tree)
                row.name = name
                out.append((base, row))
    return out


def print_against(pairs: list[tuple[Row, Row]], rev: str) -> None:
    """Each round's workers with their ratios, then the medians of both trees."""
    print(f"\nworkers alternated with {rev}'s, each after a raw consume of the same run:")
    print(f"{'tree':<26} {'events/cpu-s':>12} {'raw consume':>12} {'ratio':>6}")
    rates: dict[str, list[float]] = {}
    ratios: dict[str, list[float]] = {}
    for base, row in pairs:
        rate, raw = row.events / row.cpu, base.events / base.cpu
        rates.setdefault(row.name, []).append(rate)
        ratios.setdefault(row.name, []).append(rate / raw)
        print(f"{row.name:<26} {rate:>12,.0f} {raw:>12,.0f} {rate / raw:6.3f}")
    mid = {name: statistics.median(v) for name, v in rates.items()}
    mid_ratio = {name: statistics.median(v) for name, v in ratios.items()}
    for name in rates:
        print(
            f"{name}: median {mid[name]:,.0f} events/s per core, median ratio "
            f"{mid_ratio[name]:.3f} ({len(rates[name])} runs)"
        )
    print(
        f"this tree / {rev}: events per CPU-second {mid['this tree'] / mid[rev]:.3f}, "
        f"ratio to raw consume {mid_ratio['this tree'] / mid_ratio[rev]:.3f} "
        "(medians; > 1: this tree is faster)"
    )
    each = []  # per round: one run of each tree, next to each other
    for (_, a), (_, b) in zip(pairs[::2], pairs[1::2], strict=False):
        by = {a.name: a.events / a.cpu, b.name: b.events / b.cpu}
        if set(by) == {"this tree", rev}:
            each.append(by["this tree"] / by[rev])
    if each:
        print(
            f"per round (this tree / {rev}, events per CPU-second): "
            f"{', '.join(f'{x:.3f}' for x in each)}; median {statistics.median(each):.3f}, "
            f"this tree faster in {sum(x > 1 for x in each)} of {len(each)}"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=8)
    ap.add_argument("--nodes", type=int, default=8, help="nodes per job (8 GPUs each)")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--bootstrap-servers", default="", help="default: a development broker")
    ap.add_argument(
        "--stock-consumer",
        action="store_true",
        help="run the worker with Faust's stock consumer loop",
    )
    ap.add_argument(
        "--floors",
        action="store_true",
        help="also run the worker with the detection core, then all processing, switched off",
    )
    ap.add_argument(
        "--garbage",
        type=float,
        default=0.0,
        metavar="SHARE",
        help="also run the worker with this share (0..1) of its records garbage",
    )
    ap.add_argument(
        "--against",
        metavar="REV",
        help="also run REV's worker (a git revision), alternated with this tree's",
    )
    ap.add_argument(
        "--rounds", type=int, default=3, help="rounds of --against (a run of each tree)"
    )
    args = ap.parse_args()

    from stepwatch.daemons.broker import DevBroker
    from stepwatch.settings import Settings

    broker = None if args.bootstrap_servers else DevBroker().start()
    try:
        bootstrap = args.bootstrap_servers or (broker.bootstrap if broker else "")
        settings = Settings.load(
            env={},
            bootstrap_servers=bootstrap,
            topic_prefix=f"bench{int(time.time())}",
            partitions=args.partitions,
        )
        t0 = time.perf_counter()
        messages = build(args.jobs, args.nodes, args.steps)
        events = sum(records_in(m) for m in messages)
        kinds = Counter(type(m).__name__ for m in messages)
        print(
            f"simulated {len(messages)} messages, {events} events in "
            f"{time.perf_counter() - t0:.1f} s: {dict(kinds)}"
        )
        wire = preload(settings, messages)
        print(f"pre-loaded {len(wire)} messages into {settings.partitions} partitions x 4 topics")
        with tempfile.TemporaryDirectory(prefix="bench-stream-") as workdir:
            base = raw_consume(settings, len(wire), decode=False)
            base.events = events
            rows = [
                base,
                raw_consume(settings, len(wire), decode=True),
                processor_only(settings, wire, events),
                worker(
                    settings,
                    messages,
                    workdir,
                    ["--stock-consumer"] if args.stock_consumer else [],
                ),
            ]
            floors = (
                [floor_row(settings, messages, workdir, f, events) for f in FLOORS]
                if args.floors
                else []
            )
            if args.garbage > 0:
                floors.append(garbage_row(settings, messages, workdir, args.garbage))
            pairs = (
                against_rows(settings, messages, len(wire), workdir, args.against, args.rounds)
                if args.against
                else []
            )
        print(
            f"\n{'path':<26} {'messages':>9} {'events':>10} {'cpu_s':>8} {'wall_s':>8} "
            f"{'msgs/cpu-s':>12} {'events/cpu-s':>12} {'ratio':>6}"
        )
        for row in rows + floors:
            print(row.line(None if row is base else base))
        w = rows[-1]
        rate, raw = w.events / w.cpu, base.events / base.cpu
        print(
            f"\nworker: {rate:,.0f} events/s per core ({w.messages / w.cpu:,.0f} Kafka "
            f"messages/s per core); raw consume in this run: {raw:,.0f} events/s per core; "
            f"worker/raw-consume ratio {rate / raw:.3f}"
        )
        print(
            f"goals: >= {GOAL_EVENTS:,} events/s per core: "
            f"{'met' if rate >= GOAL_EVENTS else 'NOT met'}; "
            f"ratio >= {GOAL_RATIO}: {'met' if rate / raw >= GOAL_RATIO else 'NOT met'}"
        )
        for row in floors:
            r = row.events / row.cpu
            if "garbage" in row.name:
                bad = row.messages - len(messages)
                print(
                    f"{row.name}: {r:,.0f} valid events/s per core ({r / rate:.2f}x the "
                    f"clean run), {row.messages / row.cpu:,.0f} Kafka messages/s per core, "
                    f"wall {row.wall:.1f} s against {w.wall:.1f} s; dead letters "
                    f"{row.dead:,} of {bad:,} garbage records"
                    f"{'' if row.dead == bad else ' (NOT all)'}"
                )
                continue
            print(
                f"{row.name} (a ceiling for the worker): {r:,.0f} events/s per core, "
                f"ratio {r / raw:.3f} (goals: {GOAL_EVENTS:,}, {GOAL_RATIO})"
            )
        layer = next((row for row in floors if row.name == "worker, layer"), None)
        if layer is not None:
            print(decode_floor(base, rows[1], layer))
        if pairs:
            print_against(pairs, args.against)
    finally:
        if broker is not None:
            broker.stop()


if __name__ == "__main__":
    main()

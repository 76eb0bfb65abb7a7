"""``stepwatch simulate``: a synthetic fleet with injected faults, to a file or to Kafka."""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Iterable, Iterator
from typing import IO, TYPE_CHECKING, Any

from stepwatch.cli.common import add_kafka_flags, settings_from_args
from stepwatch.errors import ConfigError

if TYPE_CHECKING:
    from stepwatch.agents.sink import MessageSink
    from stepwatch.contract import Message
    from stepwatch.sim import Scenario

EXAMPLES = """\
examples:
  stepwatch simulate --nodes 4 --steps 300 \\
      --fault slow_gpu:rank=5:start=100:severity=0.1 --out events.jsonl --labels labels.json
  stepwatch simulate --nodes 2 --fault nic_congestion:host=node0001:start=50 --out - | head
  stepwatch simulate --realtime --bootstrap-servers localhost:9092 --fault job_hang:start=120

fault kinds: slow_gpu thermal_throttle power_throttle nic_congestion link_flap xid79 xid48
             dataloader_stall job_hang rank_crash slow_rank nan_loss
fault keys:  rank host gpu nic start end severity duration job
"""


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "simulate",
        help="generate realistic fleet telemetry with injected faults and ground truth",
        description=(
            "Simulate synchronous training jobs on H100 nodes (8 GPUs, 8 RDMA NICs each): "
            "per-step timing of every rank, GPU and NIC samples per host per tick, and "
            "events; inject faults and write the ground truth. Deterministic for a seed."
        ),
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    job = p.add_argument_group("job")
    job.add_argument("--nodes", type=int, default=4, help="nodes per job (default %(default)s)")
    job.add_argument("--gpus-per-node", type=int, default=8)
    job.add_argument("--nics-per-node", type=int, default=8)
    job.add_argument("--steps", type=int, default=300, help="training steps (default %(default)s)")
    job.add_argument("--step-seconds", type=float, default=1.0, help="nominal step time")
    job.add_argument("--pipeline-stages", type=int, default=1)
    job.add_argument("--jobs", type=int, default=1, help="number of jobs, on disjoint hosts")
    job.add_argument("--job-id", default="job-1", help="job id (several jobs: ID-1, ID-2, ...)")
    job.add_argument("--hosts", help="comma-separated host names (nodes x jobs of them)")
    job.add_argument("--seed", type=int, default=1, help="random seed (job i gets seed + i)")
    job.add_argument("--start-ts", type=float, help="start, UTC epoch seconds (default fixed)")
    job.add_argument(
        "--fault",
        action="append",
        default=[],
        metavar="SPEC",
        help="KIND[:key=value]..., repeatable (see below)",
    )
    job.add_argument("--jitter", type=float, help="lognormal sigma of compute noise (0.01)")
    job.add_argument("--warmup-steps", type=int)
    job.add_argument("--eval-every", type=int, help="steps between evaluations (0: none)")
    job.add_argument("--checkpoint-every", type=int, help="steps between checkpoints (0: none)")
    job.add_argument("--tick-seconds", type=float, help="agent tick (default 1.0)")
    job.add_argument("--no-gpu", action="store_true", help="no GPU samples")
    job.add_argument("--no-ports", action="store_true", help="no NIC port samples")
    out = p.add_argument_group("output")
    out.add_argument("--out", help="JSON Lines file, '-' for stdout (default when not to Kafka)")
    out.add_argument("--labels", help="write the ground truth (JSON) here")
    out.add_argument(
        "--kafka",
        action="store_true",
        help="publish to Kafka (implied by --bootstrap-servers, and by "
        "STEPWATCH_BOOTSTRAP_SERVERS when no --out is given)",
    )
    out.add_argument(
        "--realtime", action="store_true", help="start now and pace the output at wall-clock time"
    )
    out.add_argument("--speed", type=float, default=1.0, help="with --realtime: time factor")
    out.add_argument("--stats", action="store_true", help="print counts and rates to stderr")
    add_kafka_flags(p)
    p.set_defaults(func=run)


def build_scenarios(args: argparse.Namespace) -> tuple[Scenario, ...]:
    from stepwatch.sim import Scenario, parse_fault

    if args.jobs < 1:
        raise ConfigError("--jobs must be >= 1")
    hosts = [h.strip() for h in args.hosts.split(",")] if args.hosts else None
    if hosts is not None and len(hosts) != args.nodes * args.jobs:
        raise ConfigError(f"--hosts: {len(hosts)} names for {args.nodes} nodes x {args.jobs} jobs")
    ids = [args.job_id] if args.jobs == 1 else [f"{args.job_id}-{i + 1}" for i in range(args.jobs)]
    specs = [parse_fault(text) for text in args.fault]
    optional = {
        "jitter": args.jitter,
        "warmup_steps": args.warmup_steps,
        "eval_every": args.eval_every,
        "checkpoint_every": args.checkpoint_every,
        "tick_seconds": args.tick_seconds,
        "start_ts": args.start_ts,
    }
    scenarios = []
    for i, job_id in enumerate(ids):
        mine = [s.fault for s in specs if _job_matches(s.job, i, job_id)]
        job_hosts = (
            hosts[i * args.nodes : (i + 1) * args.nodes]
            if hosts
            else tuple(f"node{i * args.nodes + j:04d}" for j in range(args.nodes))
        )
        scenarios.append(
            Scenario(
                seed=args.seed + i,
                job_id=job_id,
                nodes=args.nodes,
                gpus_per_node=args.gpus_per_node,
                nics_per_node=args.nics_per_node,
                steps=args.steps,
                step_seconds=args.step_seconds,
                pipeline_stages=args.pipeline_stages,
                hosts=tuple(job_hosts),
                faults=tuple(mine),
                with_gpu=not args.no_gpu,
                with_ports=not args.no_ports,
                realtime=args.realtime,
                **{k: v for k, v in optional.items() if v is not None},
            )
        )
    unknown = [
        s.job
        for s in specs
        if s.job is not None and not any(_job_matches(s.job, i, j) for i, j in enumerate(ids))
    ]
    if unknown:
        raise ConfigError(f"--fault job={unknown[0]}: no such job (jobs: {', '.join(ids)})")
    return tuple(scenarios)


def _job_matches(selector: str | None, index: int, job_id: str) -> bool:
    if selector is None:
        return index == 0
    return selector == job_id or (selector.isdigit() and int(selector) == index)


def run(args: argparse.Namespace) -> int:
    from stepwatch.sim import ground_truth, resolve_all, simulate, write_jsonl, write_labels
    from stepwatch.sim.pacing import paced

    scenarios = resolve_all(build_scenarios(args))
    if args.labels:
        write_labels(args.labels, ground_truth(*scenarios))
    # Kafka when asked (--kafka), or when a broker is configured by flag or by
    # STEPWATCH_BOOTSTRAP_SERVERS (as in docker-compose), unless --out names a file.
    configured = bool(settings_from_args(args).bootstrap_servers)
    to_kafka = args.kafka or args.bootstrap_servers is not None or (configured and not args.out)
    messages: Iterable[Message] = simulate(*scenarios)
    if args.realtime:
        messages = paced(messages, args.speed, scenarios[0].start_ts)
    counter = Tally(messages)
    started = time.perf_counter()
    if to_kafka:
        _to_kafka(args, counter, args.out)
    else:
        path = args.out or "-"
        if path == "-":
            write_jsonl(sys.stdout.buffer, counter)
            sys.stdout.buffer.flush()
        else:
            write_jsonl(path, counter)
    if args.stats:
        counter.report(time.perf_counter() - started, sys.stderr)
    if args.out and args.out != "-":
        print(summary(args.out, counter, scenarios))
    return 0


def summary(path: str, tally: Tally, scenarios: Iterable[Scenario]) -> str:
    """One line on what a file now holds (stdout carries no data when --out names a file)."""
    jobs = list(scenarios)
    size = os.path.getsize(path)
    return (
        f"wrote {path}: {tally.messages} messages, {len(jobs)} job(s), "
        f"{sum(sc.world_size for sc in jobs)} ranks, {tally.span_seconds:.0f} s of event "
        f"time, {_size(size)}"
    )


def _size(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    value = float(n)
    for unit in ("KiB", "MiB", "GiB"):
        value /= 1024
        if value < 1024 or unit == "GiB":
            break
    return f"{value:.1f} {unit}"


class Tally:
    """Pass messages through, counting them (and the step records they carry)."""

    def __init__(self, messages: Iterable[Message]) -> None:
        self._messages = messages
        self.messages = 0
        self.records = 0
        self.first_ts: float | None = None
        self.last_ts: float | None = None

    def __iter__(self) -> Iterator[Message]:
        from stepwatch.contract import StepMessage

        for message in self._messages:
            self.messages += 1
            ts = message.ts
            self.first_ts = ts if self.first_ts is None else min(self.first_ts, ts)
            self.last_ts = ts if self.last_ts is None else max(self.last_ts, ts)
            if isinstance(message, StepMessage):
                self.records += len(message.steps)
            yield message

    @property
    def span_seconds(self) -> float:
        """Event time from the first message's timestamp to the last's."""
        if self.first_ts is None or self.last_ts is None:
            return 0.0
        return self.last_ts - self.first_ts

    def report(self, seconds: float, stream: IO[str]) -> None:
        rate = self.records / seconds if seconds > 0 else 0.0
        print(
            f"messages={self.messages} step_records={self.records} seconds={seconds:.2f} "
            f"step_records_per_second={rate:.0f} "
            f"messages_per_second={self.messages / max(seconds, 1e-9):.0f}",
            file=stream,
        )


def _to_kafka(args: argparse.Namespace, messages: Iterable[Message], out: str | None) -> None:
    import tempfile

    settings = settings_from_args(args)
    if not settings.bootstrap_servers:
        raise ConfigError(
            "simulate --kafka needs a broker: --bootstrap-servers or STEPWATCH_BOOTSTRAP_SERVERS"
        )
    tee = open(out, "wb") if out and out != "-" else None  # noqa: SIM115
    with tempfile.TemporaryDirectory(prefix="stepwatch-sim-spool-") as spool:
        sink = _kafka_sink(settings.replace(spool_dir=spool))
        try:
            _publish(sink, messages, tee)
        finally:
            left = sink.flush(60.0)
            sink.close(10.0)
            if tee is not None:
                tee.close()
    if left:
        raise ConfigError(f"{left} messages were not delivered to {settings.bootstrap_servers}")


def _publish(sink: MessageSink, messages: Iterable[Message], tee: IO[bytes] | None) -> None:
    from stepwatch.contract import encode
    from stepwatch.sim.pacing import batches

    for batch in batches(messages):
        sink.send(batch)
        if tee is not None:
            tee.writelines(encode(m) + b"\n" for m in batch)


def _kafka_sink(settings: Any) -> MessageSink:
    """The agent's spool-backed publisher (imported lazily: it needs confluent-kafka)."""
    from stepwatch.agents.publisher import KafkaPublisher

    return KafkaPublisher(settings)

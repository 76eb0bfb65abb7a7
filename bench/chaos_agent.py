"""One simulated node agent for the chaos audit: a job's telemetry through the
real agent path (Sequencer -> spool-backed KafkaPublisher), at wall-clock pace.

Each start is a new agent instance (a fresh ``inst``, sequence numbers from 0),
as a restarted node agent is. The scenario's clock is fixed by the harness, so
a restarted agent goes on from the current moment: what the ranks produced
while it was dead never existed for the pipeline (the ranks' datagrams had no
listener). Records left in the spool by the killed instance are sent by the new
one (same spool directory).

After every ``send`` (the spool append) the stamped messages are appended to
the *outbox*: the audit's list of what was produced (``kind host inst seq rows``
and the encoded message, for the harness's re-drive after a broker loss).

    python bench/chaos_agent.py --bootstrap H:P --prefix P --partitions N \
        --spool DIR --outbox FILE --job J --start TS [--nodes 2 --gpus 4]
"""

from __future__ import annotations

import argparse
import base64
import signal
import threading
import time

from stepwatch.agents.publisher import KafkaPublisher
from stepwatch.agents.sink import Sequencer
from stepwatch.contract import (
    KIND_OF,
    EventMessage,
    GpuMessage,
    Message,
    PortMessage,
    StepMessage,
    encode,
)
from stepwatch.settings import Settings
from stepwatch.sim import Fault, FaultKind, Scenario, simulate
from stepwatch.sim.pacing import batches, paced


def rows(message: Message) -> int:
    """Rows the store writes for ``message``."""
    if isinstance(message, StepMessage):
        return len(message.steps)
    if isinstance(message, GpuMessage):
        return len(message.gpus)
    if isinstance(message, PortMessage):
        return len(message.ports)
    return 1 if isinstance(message, EventMessage) else 0


def outbox_line(message: Message) -> bytes:
    kind = KIND_OF[type(message)].value
    return (
        f"{kind} {message.host} {message.inst} {message.seq} {rows(message)} ".encode()
        + base64.b64encode(encode(message))
        + b"\n"
    )


def scenario(args: argparse.Namespace) -> Scenario:
    slow = (
        Fault(kind=FaultKind.SLOW_GPU, rank=1, start_step=20, end_step=120, severity=0.3),
        Fault(kind=FaultKind.SLOW_GPU, rank=args.gpus + 1, start_step=150, severity=0.3),
    )
    return Scenario(
        seed=args.seed,
        job_id=args.job,
        nodes=args.nodes,
        gpus_per_node=args.gpus,
        nics_per_node=2,
        steps=args.steps,
        step_seconds=args.step_seconds,
        hosts=tuple(f"{args.job}-n{i}" for i in range(args.nodes)),
        start_ts=args.start,
        faults=slow,
        eval_every=0,
        checkpoint_every=0,
    )


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    for name in ("--bootstrap", "--prefix", "--spool", "--outbox", "--job"):
        p.add_argument(name, required=True)
    p.add_argument("--partitions", type=int, default=4)
    p.add_argument("--start", type=float, required=True)
    p.add_argument("--nodes", type=int, default=2)
    p.add_argument("--gpus", type=int, default=4)
    p.add_argument("--steps", type=int, default=100_000)
    p.add_argument("--step-seconds", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()
    settings = Settings.load(
        env={},
        bootstrap_servers=args.bootstrap,
        topic_prefix=args.prefix,
        partitions=args.partitions,
        spool_dir=args.spool,
    )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    publisher = KafkaPublisher(settings)
    sequencer = Sequencer()
    now = time.time()
    live = (m for m in simulate(scenario(args)) if m.ts >= now)
    with open(args.outbox, "ab") as outbox:
        for batch in batches(paced(live, 1.0, now, stop.wait)):
            if stop.is_set():
                break
            stamped = [sequencer.stamp(m) for m in batch]
            publisher.send(stamped)
            outbox.write(b"".join(outbox_line(m) for m in stamped))
            outbox.flush()
    publisher.close(10.0)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

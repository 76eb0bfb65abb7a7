"""Seeded multi-job runs with known faults, for the store's integration tests.

Three jobs on overlapping hosts (simulator, fixed seeds):

* ``gpu-03`` is 10 % slower (SLOW_GPU on the whole host) in jobA and jobB,
  healthy in jobC: the lemon node.
* jobA: NIC congestion on ``gpu-02`` mlx5_5 (steps 30-80).
* jobB: a link flap on ``gpu-06`` mlx5_2 at step 50.
* jobC: XID 79 on ``gpu-09`` GPU 4 at step 60: the rank dies, the job hangs.

Detections come from the detection core (``stepwatch.streams.core.Engine``, what the
stream workers run) over the same telemetry, stamped like a worker's output,
plus one hand-built detection that names only a rank.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from stepwatch.contract import KIND_OF, DetectionMessage, Message, Topics, encode, message_key
from stepwatch.sim import Fault, FaultKind, Scenario, simulate

T0 = 1767225600.0  # 2026-01-01T00:00:00Z
LEMON = "gpu-03"
STEPS = 120


def hosts(*numbers: int) -> tuple[str, ...]:
    return tuple(f"gpu-{n:02d}" for n in numbers)


def scenarios() -> list[Scenario]:
    slow = Fault(FaultKind.SLOW_GPU, host=LEMON, start_step=0, severity=0.10)
    return [
        Scenario(
            seed=1,
            job_id="jobA",
            nodes=4,
            steps=STEPS,
            hosts=hosts(1, 2, 3, 4),
            start_ts=T0,
            flops_per_token=6e9,
            faults=(
                slow,
                Fault(FaultKind.NIC_CONGESTION, host="gpu-02", nic=5, start_step=30, end_step=80),
            ),
        ),
        Scenario(
            seed=2,
            job_id="jobB",
            nodes=4,
            steps=STEPS,
            hosts=hosts(3, 5, 6, 7),
            start_ts=T0 + 3600,
            faults=(slow, Fault(FaultKind.LINK_FLAP, host="gpu-06", nic=2, start_step=50)),
        ),
        Scenario(
            seed=3,
            job_id="jobC",
            nodes=4,
            steps=STEPS,
            hosts=hosts(1, 3, 8, 9),
            start_ts=T0 + 7200,
            faults=(Fault(FaultKind.XID79, host="gpu-09", gpu=4, start_step=60),),
        ),
    ]


def detections(telemetry: list[Message]) -> list[DetectionMessage]:
    """The detection core's findings on the runs, as a stream worker publishes them.

    ``stepwatch.streams.core.Engine`` over the time-ordered telemetry (what the stream
    workers run), then one hand-built detection that names only a rank (header
    host ``stepwatch``), so the store's rank -> host placement is exercised too.
    """
    from stepwatch.streams.core import Engine

    engine = Engine()
    found: list[DetectionMessage] = []
    for m in telemetry:
        found.extend(engine.process(m))
    found.extend(engine.tick(telemetry[-1].ts + 600))
    found.append(
        DetectionMessage(
            host="stepwatch",
            ts=T0 + 3700,
            id="jobB-throughput-2",
            job_id="jobB",
            type="throughput",
            state="open",
            rank=2,
            cause="unknown",
            fault="unknown",
            step=40,
            summary="rank 2 below the job's throughput",
            inst="jobB-throughput-2",
            seq=0,
        )
    )
    return found  # each change carries its identity: inst = detection id, seq = change number


def messages() -> list[Message]:
    """Every message of the three runs plus the detections, in time order."""
    telemetry: list[Message] = sorted(
        (m for sc in scenarios() for m in simulate(sc)), key=lambda m: m.ts
    )
    return sorted([*telemetry, *detections(telemetry)], key=lambda m: m.ts)


def keyed(messages: list[Message], prefix: str) -> Iterator[tuple[str, bytes, bytes]]:
    """(topic, key, value) for each message, as the agents publish them."""
    topics = Topics(prefix)
    for m in messages:
        yield topics.for_kind(KIND_OF[type(m)]), message_key(m), encode(m)


def expected_rows(messages: list[Message]) -> dict[str, int]:
    """Rows each table must hold for these (valid) messages."""
    from stepwatch.contract import EventMessage, GpuMessage, PortMessage, StepMessage

    return {
        "step_events": sum(len(m.steps) for m in messages if isinstance(m, StepMessage)),
        "gpu_samples": sum(len(m.gpus) for m in messages if isinstance(m, GpuMessage)),
        "port_samples": sum(len(m.ports) for m in messages if isinstance(m, PortMessage)),
        "events": sum(1 for m in messages if isinstance(m, EventMessage)),
        "detections": sum(1 for m in messages if isinstance(m, DetectionMessage)),
    }


def produce(
    bootstrap: str, prefix: str, messages: list[Message], extra: Sequence[tuple[str, bytes]] = ()
) -> int:
    """Publish the messages (and raw ``(topic, value)`` extras) and wait for delivery."""
    from confluent_kafka import Producer

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 20,
            "enable.idempotence": True,
            "partitioner": "murmur2_random",  # the contract's placement
        }
    )
    n = 0
    for topic, key, value in keyed(messages, prefix):
        producer.produce(topic, value, key)
        n += 1
        if n % 5000 == 0:
            producer.poll(0)
    for topic, value in extra:
        producer.produce(topic, value, b"bad")
        n += 1
    assert producer.flush(30) == 0
    return n

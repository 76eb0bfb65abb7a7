"""Topics, keys and partitioning: part of the contract.

One topic per kind, all created with the same partition count, so that
partition *n* of every topic holds the same jobs (co-partitioned). Every
message about a job is keyed by its ``job_id``; host-level samples that belong
to no job are keyed by ``host``. Placed by murmur2 of the key (Kafka's default
partitioner in the Java client and aiokafka; librdkafka needs
``partitioner=murmur2_random``, which ``stepwatch.kafka.PRODUCER_DEFAULTS`` sets:
its own default, CRC32, places most keys elsewhere), everything about one job
lands in one partition number of every topic, and one worker processes the job
without repartitioning. The stream worker refuses a message whose key belongs on
another partition (``wrong_partition``; ``STEPWATCH_STREAM_CHECK_PARTITION``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from stepwatch.contract.records import Kind, Message

# Each topic's name after ``<prefix>.``: the one place topic names are spelled.
STEPS = "steps"
GPU = "gpu"
PORTS = "ports"
EVENTS = "events"
DETECTIONS = "detections"
DLQ = "dlq"
REMEDIATIONS = "remediations"
ALERTS = "alerts"


_KIND_OF_NAME = {
    STEPS: Kind.STEP,
    GPU: Kind.GPU,
    PORTS: Kind.PORT,
    EVENTS: Kind.EVENT,
    DETECTIONS: Kind.DETECTION,
}


def message_kinds(topics: Iterable[str]) -> dict[str, Kind]:
    """The kind each message topic among ``topics`` carries: a message of another kind on
    it is refused (``wrong_topic``) by the stream worker and the sink alike."""
    out: dict[str, Kind] = {}
    for topic in topics:
        kind = _KIND_OF_NAME.get(unprefixed(topic) or "")
        if kind is not None:
            out[topic] = kind
    return out


def unprefixed(topic: str) -> str | None:
    """A topic's name after its prefix (``"<prefix>.alerts"`` -> :data:`ALERTS`); None
    without one."""
    _, dot, name = topic.rpartition(".")
    return name if dot else None


@dataclass(frozen=True)
class Topics:
    prefix: str = "stepwatch"

    def _name(self, name: str) -> str:
        return f"{self.prefix}.{name}"

    @property
    def steps(self) -> str:
        return self._name(STEPS)

    @property
    def gpu(self) -> str:
        return self._name(GPU)

    @property
    def ports(self) -> str:
        return self._name(PORTS)

    @property
    def events(self) -> str:
        return self._name(EVENTS)

    @property
    def detections(self) -> str:
        return self._name(DETECTIONS)

    @property
    def dlq(self) -> str:
        return self._name(DLQ)

    @property
    def remediations(self) -> str:
        """The remediator's decisions (JSON, keyed by action id): the sink stores them."""
        return self._name(REMEDIATIONS)

    @property
    def alerts(self) -> str:
        """Alertmanager state changes (JSON, keyed by fingerprint): the sink stores them."""
        return self._name(ALERTS)

    def operations(self) -> tuple[str, ...]:
        """Topics of operations records (not contract messages): alerts and remediations."""
        return (self.alerts, self.remediations)

    def for_kind(self, kind: Kind | str) -> str:
        return {
            Kind.STEP: self.steps,
            Kind.GPU: self.gpu,
            Kind.PORT: self.ports,
            Kind.EVENT: self.events,
            Kind.DETECTION: self.detections,
        }[Kind(kind)]

    def telemetry(self) -> tuple[str, ...]:
        """The input topics of the stream processors."""
        return (self.steps, self.gpu, self.ports, self.events)

    def all(self) -> tuple[str, ...]:
        return (*self.telemetry(), self.detections, self.dlq, *self.operations())


def message_key(message: Message) -> bytes:
    """The Kafka key: the job id when the message belongs to a job, else the host."""
    job = getattr(message, "job_id", None)
    return (job or message.host).encode()

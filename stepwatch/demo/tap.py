"""A read-only tap on the pipeline's topics: what arrived, per kind and host.

It reads every partition of every topic from the beginning with ``assign``
(no consumer group, so it never steals partitions from the stream workers),
decodes with the contract and feeds a :class:`~stepwatch.audit.SeqAudit`.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from stepwatch.audit import SeqAudit
from stepwatch.contract import DetectionMessage, Topics, decode_unchecked
from stepwatch.errors import ContractError
from stepwatch.kafka import client_config
from stepwatch.settings import Settings

log = logging.getLogger(__name__)


@dataclass
class Tap:
    settings: Settings
    audit: SeqAudit = field(default_factory=SeqAudit)
    detections: list[DetectionMessage] = field(default_factory=list)
    dlq: int = 0
    rejected: Counter[str] = field(default_factory=Counter)
    _consumer: Any = None

    def start(self) -> None:
        from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

        config = client_config(
            self.settings,
            # earliest: a partition whose first fetch fails (a broker answering "out of range"
            # for an empty log) must not be reset to its end and skip what comes next
            {
                "group.id": "stepwatch-demo-tap",
                "enable.auto.commit": False,
                "log_level": 0,
                "auto.offset.reset": "earliest",
            },
        )
        self._consumer = Consumer(config)
        topics = Topics(self.settings.topic_prefix)
        names = (*topics.telemetry(), topics.detections, topics.dlq)
        self._consumer.assign(
            [
                TopicPartition(name, p, OFFSET_BEGINNING)
                for name in names
                for p in range(self.settings.partitions)
            ]
        )

    def poll(self, max_messages: int = 5000, timeout: float = 0.2) -> int:
        """Read what is available; return how many records were read."""
        records = self._consumer.consume(max_messages, timeout)
        dlq_topic = Topics(self.settings.topic_prefix).dlq
        for record in records:
            if record.error():
                continue
            if record.topic() == dlq_topic:
                self.dlq += 1
                continue
            try:
                message = decode_unchecked(record.value())
            except ContractError as err:
                self.rejected[err.reason] += 1
                continue
            if isinstance(message, DetectionMessage):
                self.detections.append(message)
            else:
                self.audit.add(message)
        return len(records)

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None

"""Shared by the remediation integration tests: the policy, the token, the audit topic reader."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from stepwatch.settings import Settings

TOKEN = "integration-token"
POLICY = """
mode: execute
rules:
  - match: {{alertname: StragglerPersistent, class: system, remediation: drain}}
    actions: [drain, requeue]
  - match: {{class: user}}
    actions: [notify]
guardrails:
  breaker: {{max_share: 0.5, window: 1h}}
  rate_limit: {{actions: 20, per: 1h}}
actuator: {{kind: slurm, slurm_conf: "{conf}"}}
notify: {{kind: webhook, url: "{notify}"}}
page: {{kind: webhook, url: "{page}"}}
"""


def audit_records(settings: Settings, n: int) -> list[dict[str, Any]]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": settings.bootstrap_servers,
            "group.id": "t",
            "enable.auto.commit": False,
        }
    )
    from stepwatch.contract import Topics

    topic = Topics(settings.topic_prefix).remediations
    parts = consumer.list_topics(topic, timeout=10).topics[topic].partitions
    consumer.assign([TopicPartition(topic, p, 0) for p in parts])
    out: list[dict[str, Any]] = []
    deadline = time.monotonic() + 20
    while len(out) < n and time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is not None and not msg.error():
            out.append(json.loads(cast(bytes, msg.value())))
    consumer.close()
    return out

"""The remediator: Alertmanager webhooks in, guarded scheduler actions out.

Flow: :mod:`.payload` parses the webhook, :mod:`.policy` maps each alert to
actions, :mod:`.guards` applies the guardrails over the persisted
:mod:`.state`, :mod:`.engine` decides and runs the :mod:`.actuators`, and every
decision goes to :mod:`.audit` (Kafka topic, ClickHouse, Prometheus metric).
:mod:`.server` is the HTTP face. See ``docs/remediation.md``.
"""

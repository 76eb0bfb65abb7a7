"""The remediator: Alertmanager webhooks in, guarded scheduler actions out.

Flow: :mod:`.payload` parses the webhook, :mod:`.policy` maps each alert to
actions, :mod:`.identity` refuses any node name or job id a scheduler would
expand, :mod:`.guards` applies the guardrails over the persisted
:mod:`.state` (cheap ones before any scheduler call, :mod:`.lookups` for the
rest), :mod:`.engine` decides and runs the :mod:`.actuators`,
:mod:`.notices` tells owners and pages, :mod:`.outcome` checks that an
executed action helped, and every decision goes to :mod:`.audit` (Kafka
topic, ClickHouse, Prometheus metric). :mod:`.server` is the HTTP face. See
``docs/remediation.md`` and ``docs/security.md`` (Boundary 3).
"""

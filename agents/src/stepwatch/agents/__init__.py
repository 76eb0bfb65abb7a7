"""The node agent: host collectors, the SDK socket, a spool-backed Kafka publisher.

``stepwatch agent`` runs :class:`stepwatch.agents.agent.Agent`; see ``docs/agent.md``.
Modules import their heavy dependencies (confluent-kafka, prometheus-client)
themselves, so importing this package is cheap.
"""

from stepwatch.extras import require

require("confluent_kafka", "prometheus_client", what="the node agent")

"""The stream worker service: a Faust app over the telemetry topics.

``stepwatch stream`` runs :mod:`stepwatch.streams.worker.app`; the Faust-free
logic it drives is :mod:`stepwatch.streams.worker.processor`. See ``docs/streams.md``.
"""

from stepwatch.extras import require

require("faust", "numpy", "confluent_kafka", "prometheus_client", what="the stream worker")

"""Launchers for the real daemons stepwatch works with (Prometheus, Alertmanager, Slurm,
the development Kafka broker).

Used by the demo, the integration tests and the benchmarks: each starts the real
binary on loopback ports, waits for readiness and stops it cleanly
(:func:`stepwatch.daemons.process.stop_process`, shared by all).
"""

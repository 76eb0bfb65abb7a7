"""``stepwatch stream``: run a stream worker (Faust) that finds stragglers and hangs."""

from __future__ import annotations

import argparse
import logging
from typing import Any

from stepwatch.cli.common import add_kafka_flags, add_web_flags, default_of, settings_from_args

log = logging.getLogger(__name__)

DESCRIPTION = """\
Consume the telemetry topics (<prefix>.steps, .gpu, .ports, .events) in a Faust
worker, run the detection core on every job of the partitions this worker owns,
and publish detections to <prefix>.detections (key = job id), bad input to
<prefix>.dlq, and Prometheus metrics on --metrics-port.

Scale out by starting more workers with the same --app-id (the Kafka consumer
group): they split the partitions; every job is analysed by exactly one worker.
SIGTERM (or Ctrl-C) stops the worker cleanly: offsets committed, producer
flushed, consumer closed. Open detections live in a Faust table, so a restarted
worker resolves or continues them instead of opening them again.
"""

EPILOG = """\
Kafka client settings are given as librdkafka keys (-X key=value or
STEPWATCH_KAFKA__<KEY>) and mapped to the worker's aiokafka client:
security.protocol, sasl.mechanism, sasl.username, sasl.password,
sasl.kerberos.service.name, ssl.ca.location, ssl.certificate.location,
ssl.key.location, ssl.key.password, ssl.endpoint.identification.algorithm,
client.id, group.id, group.instance.id, session.timeout.ms,
heartbeat.interval.ms, max.poll.interval.ms, request.timeout.ms,
auto.offset.reset, max.partition.fetch.bytes, compression.type, linger.ms,
acks, message.max.bytes. Other keys are ignored with a warning.
See docs/streams.md.
"""


def register(sub: Any) -> None:
    p = sub.add_parser(
        "stream",
        help="run a stream worker: detections, DLQ, /metrics",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_kafka_flags(p)
    p.add_argument(
        "--dev-broker",
        action="store_true",
        help="start the embedded development broker when no bootstrap servers "
        "are configured (otherwise that is an error)",
    )
    g = p.add_argument_group("worker (each flag: env STEPWATCH_<DEST>, config [stream] table)")
    g.add_argument(
        "--app-id",
        dest="stream_app_id",
        help="Faust app id = Kafka consumer group (default stepwatch-stream.<topic prefix>)",
    )
    g.add_argument(
        "--worker-name",
        dest="stream_worker_name",
        help="name in logs and dead letters (default host:pid)",
    )
    g.add_argument(
        "--metrics-port",
        dest="stream_metrics_port",
        type=int,
        help=f"Prometheus /metrics port (default {default_of('stream_metrics_port')}; 0 disables)",
    )
    add_web_flags(g)
    g.add_argument(
        "--web-port",
        dest="stream_web_port",
        type=int,
        help=f"Faust's own web server port (default {default_of('stream_web_port')}; 0: off)",
    )
    g.add_argument(
        "--data-dir",
        dest="stream_data_dir",
        help=f"Faust data directory (default {default_of('stream_data_dir')})",
    )
    g.add_argument(
        "--batch",
        dest="stream_batch",
        type=int,
        help=f"Kafka messages per processing batch (default {default_of('stream_batch')})",
    )
    g.add_argument(
        "--batch-within",
        dest="stream_batch_within",
        type=float,
        help=f"seconds to wait for a batch to fill (default {default_of('stream_batch_within')})",
    )
    g.add_argument(
        "--tick",
        dest="stream_tick_seconds",
        type=float,
        help="seconds between hang checks and metric refreshes "
        f"(default {default_of('stream_tick_seconds')})",
    )
    g.add_argument(
        "--standby-replicas",
        dest="stream_standby_replicas",
        type=int,
        help="standby copies of the open-detections table "
        f"(default {default_of('stream_standby_replicas')})",
    )
    g.add_argument(
        "--restore-grace-steps",
        dest="stream_restore_grace_steps",
        type=int,
        help="steps a job must advance before an inherited open detection the "
        "restarted core did not confirm is resolved "
        f"(default {default_of('stream_restore_grace_steps')})",
    )
    g.add_argument(
        "--session-timeout",
        dest="stream_session_timeout",
        type=float,
        help="consumer-group session timeout in seconds: a crashed worker's "
        f"partitions move after it (default {default_of('stream_session_timeout')}, "
        "Kafka's smallest allowed; heartbeat "
        "every 1/6 of it; docs/streams.md, Availability)",
    )
    g.add_argument(
        "--rebalance-timeout",
        dest="stream_rebalance_timeout",
        type=float,
        help="how long the coordinator waits for members to rejoin in a rebalance, "
        f"seconds (default {default_of('stream_rebalance_timeout')}; 0: Faust's 60)",
    )
    g.add_argument(
        "--faust-log-level",
        dest="stream_faust_log_level",
        help="log level of Faust, mode and aiokafka "
        f"(default {default_of('stream_faust_log_level')})",
    )
    g.add_argument(
        "--stock-consumer",
        dest="stream_stock_consumer",
        action="store_const",
        const=True,
        help="use Faust's stock consumer loop instead of the leaner one",
    )
    a = p.add_argument_group(
        "admission: records refused go to <prefix>.dlq with the reason "
        "(docs/security.md, Boundary 2)"
    )
    a.add_argument(
        "--future-seconds",
        dest="stream_future_seconds",
        type=float,
        help="refuse timestamps this far ahead of the worker's clock "
        f"(default {default_of('stream_future_seconds')}; 0: off)",
    )
    a.add_argument(
        "--max-age-seconds",
        dest="stream_max_age_seconds",
        type=float,
        help="refuse older messages for live detection "
        f"(default {default_of('stream_max_age_seconds')}; 0: off)",
    )
    a.add_argument(
        "--step-jump-min",
        dest="stream_step_jump_min",
        type=int,
        help="refuse a step beyond the job's highest by more than max(this, factor x "
        f"cadence x elapsed) (default {default_of('stream_step_jump_min')})",
    )
    a.add_argument(
        "--step-jump-factor",
        dest="stream_step_jump_factor",
        type=float,
        help=f"the factor of --step-jump-min (default {default_of('stream_step_jump_factor')})",
    )
    a.add_argument(
        "--max-world-size",
        dest="stream_max_world_size",
        type=int,
        help="refuse step records and job_start events claiming a larger world_size "
        f"(default {default_of('stream_max_world_size')}; 0: off)",
    )
    a.add_argument(
        "--max-ranks",
        dest="stream_max_ranks",
        type=int,
        help="the ranks (jobs' world sizes summed) this worker's detection holds; a new "
        "job past them is refused unless a quiet one gives its place up "
        f"(default {default_of('stream_max_ranks')}; 0: off)",
    )
    a.add_argument(
        "--max-hosts",
        dest="stream_max_hosts",
        type=int,
        help="the hosts whose samples this worker's detection holds; likewise "
        f"(default {default_of('stream_max_hosts')}; 0: off)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from stepwatch.daemons.broker import DEV_TOPIC_SETTINGS, DevBroker
    from stepwatch.errors import ConfigError

    settings = settings_from_args(args)
    broker: DevBroker | None = None
    if not settings.bootstrap_servers:
        if not args.dev_broker:
            raise ConfigError(
                "no Kafka bootstrap servers: give --bootstrap-servers or "
                "STEPWATCH_BOOTSTRAP_SERVERS, or --dev-broker for a local "
                "development broker"
            )
        broker = DevBroker().start()
        settings = settings.replace(bootstrap_servers=broker.bootstrap, **DEV_TOPIC_SETTINGS)
        log.info("development broker started bootstrap=%s", broker.bootstrap)
    try:
        return _run_worker(args, settings)
    finally:
        if broker is not None:
            broker.stop()


def _run_worker(args: argparse.Namespace, settings: Any) -> int:
    from faust.worker import Worker

    from stepwatch.kafka import ensure_topics
    from stepwatch.streams.worker.app import StreamOptions, create_app, tune_gc
    from stepwatch.streams.worker.metrics import serve

    for name in ("faust", "mode", "aiokafka"):
        logging.getLogger(name).setLevel(settings.stream_faust_log_level.upper())
    ensure_topics(settings)
    options = StreamOptions.from_settings(settings)
    service = create_app(settings, options)
    from stepwatch.metrics_http import Endpoint

    port = serve(
        service.metrics,
        Endpoint.from_settings(settings, settings.stream_metrics_port, args.web_listen_address),
    )
    log.info(
        "stream worker starting worker=%s group=%s bootstrap=%s metrics_port=%d",
        service.worker,
        service.app.conf.id,
        settings.bootstrap_servers,
        port,
    )
    worker = Worker(
        service.app,
        loglevel=logging.getLevelName(logging.getLogger().level),
        quiet=True,
        redirect_stdouts=False,
        override_logging=False,
    )
    worker.spinner = None  # no terminal control codes in the logs
    tune_gc()
    try:
        worker.execute_from_commandline()
    except SystemExit as done:
        code = done.code
        log.info("stream worker stopped worker=%s", service.worker)
        return code if isinstance(code, int) else 0
    return 0

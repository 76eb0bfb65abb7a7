"""``stepwatch db``: the historical store (ClickHouse / embedded chdb).

``db migrate`` applies the schema, ``db status`` shows it, ``db sink`` runs the
Kafka -> ClickHouse sink, ``db serve`` owns an embedded store and serves its
query endpoint for readers when no sink runs.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

from stepwatch.cli.common import (
    add_kafka_flags,
    add_web_flags,
    default_of,
    plain_doc,
    settings_from_args,
)
from stepwatch.settings import Settings

log = logging.getLogger(__name__)


def add_store_flags(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("store")
    g.add_argument(
        "--clickhouse-url",
        help="ClickHouse server, http(s)://host:port (env "
        "STEPWATCH_CLICKHOUSE_URL); empty: the embedded store at --store-path",
    )
    g.add_argument(
        "--clickhouse-user",
        help="server user (env STEPWATCH_CLICKHOUSE_USER); the "
        "password comes from STEPWATCH_CLICKHOUSE_PASSWORD",
    )
    g.add_argument(
        "--database",
        dest="clickhouse_database",
        help=f"database name (default {default_of('clickhouse_database')})",
    )
    g.add_argument(
        "--cluster",
        dest="clickhouse_cluster",
        metavar="NAME",
        help="a ClickHouse cluster (remote_servers name; env STEPWATCH_CLICKHOUSE_CLUSTER): "
        "migrations create replicated tables ON CLUSTER behind Distributed tables, "
        "and the sink writes through those (docs/store.md)",
    )
    g.add_argument(
        "--store-path",
        help=f"embedded store directory (default {default_of('store_path')}; "
        "readers fall back to the demo's var/demo/chdb when "
        f"{default_of('store_path')} does not exist)",
    )


def store_settings(args: argparse.Namespace, **more: Any) -> Settings:
    names = (
        "clickhouse_url",
        "clickhouse_user",
        "clickhouse_database",
        "clickhouse_cluster",
        "store_path",
    )
    return settings_from_args(args, **{n: getattr(args, n, None) for n in names}, **more)


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "db",
        help="the historical store: migrate, status, sink, serve",
        description=plain_doc(__doc__),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="db_command", metavar="ACTION")

    p = sub.add_parser("migrate", help="apply pending schema migrations (idempotent)")
    add_store_flags(p)
    p.add_argument(
        "--raw-ttl-days", type=int, help="retention of raw rows (env STEPWATCH_STORE_RAW_TTL_DAYS)"
    )
    p.set_defaults(func=run_migrate)

    p = sub.add_parser("status", help="migrations, tables, rows and bytes on disk")
    add_store_flags(p)
    p.set_defaults(func=run_status)

    p = sub.add_parser(
        "sink",
        help="consume the telemetry topics into the store",
        description="Kafka -> ClickHouse: batches per partition, inserts with deduplication "
        "tokens, commits offsets after the insert, dead-letters bad rows. Applies migrations "
        "at start; with the embedded store it also serves the query endpoint. SIGTERM: "
        "flush, commit, close.",
    )
    add_kafka_flags(p)
    add_store_flags(p)
    p.add_argument(
        "--group",
        dest="sink_group",
        help=f"consumer group (env STEPWATCH_SINK_GROUP, default {default_of('sink_group')})",
    )
    p.add_argument(
        "--batch-messages",
        dest="sink_batch_messages",
        type=int,
        help=f"records per partition batch (default {default_of('sink_batch_messages')})",
    )
    p.add_argument(
        "--batch-seconds",
        dest="sink_batch_seconds",
        type=float,
        help=f"longest a record waits (default {default_of('sink_batch_seconds')})",
    )
    p.add_argument(
        "--metrics-port",
        dest="sink_metrics_port",
        type=int,
        help="/metrics port (env STEPWATCH_SINK_METRICS_PORT, "
        f"default {default_of('sink_metrics_port')}; 0 disables)",
    )
    add_web_flags(p)
    p.add_argument("--no-serve", action="store_true", help="do not serve the query endpoint")
    p.add_argument(
        "--raw-ttl-days",
        type=int,
        help="retention of raw rows; older ones are dead letters (too_old)",
    )
    p.add_argument(
        "--detection-producers",
        dest="store_detection_producers",
        help="comma-separated stream worker names whose detections are stored; others "
        "are dead letters (env STEPWATCH_STORE_DETECTION_PRODUCERS; default: any)",
    )
    p.set_defaults(func=run_sink)

    p = sub.add_parser("serve", help="own the embedded store and serve its query endpoint")
    add_store_flags(p)
    p.add_argument("--port", type=int, default=0, help="loopback port (default: any free port)")
    p.add_argument("--allow-writes", action="store_true", help="accept writes through the endpoint")
    p.set_defaults(func=run_serve)
    parser.set_defaults(func=lambda args: parser.print_help() or 2)


def run_migrate(args: argparse.Namespace) -> int:
    from stepwatch.exporters.clickhouse.access import open_writer
    from stepwatch.exporters.clickhouse.migrations import Migrator

    settings = store_settings(args, store_raw_ttl_days=args.raw_ttl_days)
    store = open_writer(settings)
    try:
        migrator = Migrator(store, settings.store_raw_ttl_days, cluster=settings.clickhouse_cluster)
        applied = migrator.migrate()
    finally:
        store.close()
    names = ", ".join(f"{m.version:04d}_{m.name}" for m in applied) or "nothing to do"
    print(f"migrations applied: {names}")
    if migrator.ttl_changed:
        print(
            f"raw-row TTL set to {settings.store_raw_ttl_days} days on: "
            f"{', '.join(migrator.ttl_changed)}"
        )
    return 0


def run_status(args: argparse.Namespace) -> int:
    from stepwatch.exporters.clickhouse.access import live_endpoint, open_reader, reader_settings
    from stepwatch.exporters.clickhouse.migrations import Migrator
    from stepwatch.exporters.clickhouse.output import render

    settings = reader_settings(store_settings(args))
    owner = live_endpoint(settings)
    store = open_reader(settings)
    try:
        target = settings.clickhouse_url or settings.store_path
        print(f"store: {store.backend} {target} database={settings.clickhouse_database}")
        if owner is not None:
            print(f"owner: pid {owner.pid}, endpoint {owner.url}")
        if settings.clickhouse_cluster:
            print(
                f"cluster: {settings.clickhouse_cluster} (this node's tables; reads of the "
                "Distributed tables span every shard)"
            )
        for status in Migrator(store).status():
            state = "applied" if status.applied else "PENDING"
            changed = "" if status.checksum_ok else " (file changed since applied)"
            print(f"  {status.version:04d}_{status.name}: {state}{changed}")
        result = store.query(
            "SELECT t.name AS table, t.engine AS engine, p.rows AS rows, p.bytes AS bytes_on_disk, "
            "p.parts AS parts FROM system.tables AS t LEFT JOIN (SELECT table, sum(rows) AS rows, "
            "sum(bytes_on_disk) AS bytes, count() AS parts FROM system.parts "
            "WHERE active AND database = currentDatabase() GROUP BY table) "
            "AS p ON t.name = p.table "
            "WHERE t.database = currentDatabase() AND t.engine NOT LIKE '%View' ORDER BY t.name"
        )
        sys.stdout.write(render(result))
    finally:
        store.close()
    return 0


def run_sink(args: argparse.Namespace) -> int:
    from stepwatch.exporters.clickhouse.runner import run_sink as run
    from stepwatch.exporters.clickhouse.sink import SinkConfig

    settings = store_settings(args, store_raw_ttl_days=args.raw_ttl_days)
    config = SinkConfig.from_settings(settings)
    run(settings, config, serve=not args.no_serve, listen=args.web_listen_address)
    return 0


def run_serve(args: argparse.Namespace) -> int:
    import threading

    from stepwatch.errors import ConfigError
    from stepwatch.exporters.clickhouse.access import open_writer
    from stepwatch.exporters.clickhouse.migrations import Migrator
    from stepwatch.exporters.clickhouse.runner import on_signals, serve_store

    settings = store_settings(args)
    if settings.clickhouse_url:
        raise ConfigError("db serve is for the embedded store; a server serves itself")
    store = open_writer(settings)
    try:
        Migrator(store, settings.store_raw_ttl_days, cluster=settings.clickhouse_cluster).migrate()
        service = serve_store(settings, port=args.port, allow_writes=args.allow_writes)
        print(
            f"serving {settings.store_path} at {service.url} (endpoint file "
            f"{service.endpoint_file}); Ctrl-C or SIGTERM stops",
            flush=True,
        )
        done = threading.Event()
        on_signals(done.set)
        done.wait()
        service.stop()
    finally:
        store.close()
    return 0

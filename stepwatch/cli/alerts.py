"""``stepwatch alerts receive``: record Alertmanager's notifications in the store.

Alertmanager posts every notification (firing and resolved, webhook payload
version 4, ``Authorization: Bearer <token>``: the remediator's token) to
``http://HOST:9470/alerts``; the receiver publishes each alert on
``<prefix>.alerts`` and the store's sink (``stepwatch db sink``) writes it to
the ``alerts`` table, where ``stepwatch report`` and the ``job_timeline`` query
find it. Receiver config for Alertmanager: docs/alerts.md.
"""

from __future__ import annotations

import argparse
import signal
import threading
from typing import Any

from stepwatch.cli.common import add_kafka_flags, default_of, plain_doc


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "alerts",
        help="record Alertmanager notifications in the store",
        description=plain_doc(__doc__),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="alerts_command", metavar="ACTION")
    p = sub.add_parser(
        "receive",
        help="serve the Alertmanager webhook receiver (POST /alerts)",
        description=plain_doc(__doc__),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_kafka_flags(p)
    p.add_argument(
        "--port",
        dest="remediate_alerts_port",
        type=int,
        help="port (env STEPWATCH_REMEDIATE_ALERTS_PORT, "
        f"default {default_of('remediate_alerts_port')})",
    )
    p.add_argument(
        "--bind",
        dest="remediate_bind",
        help=f"address (env STEPWATCH_REMEDIATE_BIND, default {default_of('remediate_bind')})",
    )
    p.add_argument(
        "--token-file",
        dest="remediate_token_file",
        help="file holding the bearer token (env STEPWATCH_REMEDIATE_TOKEN_FILE)",
    )
    p.set_defaults(func=run_receive)
    parser.set_defaults(func=lambda args: parser.print_help() or 2)


def run_receive(args: argparse.Namespace) -> int:
    from stepwatch.alerts.receiver import build
    from stepwatch.cli.common import settings_from_args

    settings = settings_from_args(args)
    receiver, publisher = build(settings)
    stop = threading.Event()
    previous = {s: signal.signal(s, lambda *_: stop.set()) for s in (signal.SIGTERM, signal.SIGINT)}
    receiver.start()
    print(f"alert receiver ready url={receiver.url}/alerts topic={publisher.topic}", flush=True)
    try:
        stop.wait()
        return 0
    finally:
        receiver.stop()
        publisher.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)

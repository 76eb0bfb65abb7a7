"""``stepwatch broker``: run the development Kafka broker in the foreground."""

from __future__ import annotations

import argparse
import signal
import threading
from typing import Any

from stepwatch.cli.common import default_of

DESCRIPTION = """\
Run the development broker (Tansu, Kafka wire protocol, memory storage) on a
loopback port until SIGTERM or Ctrl-C, and print its bootstrap address. For
trying stepwatch on one machine; production points at a real Kafka cluster.
Its data lives in memory only: a restart starts empty.
"""


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "broker",
        help="run the development Kafka broker in the foreground",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--port", type=int, default=0, help="port to listen on (default: a free one)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default %(default)s)")
    p.add_argument(
        "--create-topics",
        action="store_true",
        help="create the stepwatch topics at start (--topic-prefix, --partitions)",
    )
    p.add_argument(
        "--topic-prefix", help=f"topic name prefix (default {default_of('topic_prefix')})"
    )
    p.add_argument(
        "--partitions",
        type=int,
        help=f"partitions for topics created (default {default_of('partitions')})",
    )
    p.add_argument("--log-file", help="write the broker's own log here (default: discarded)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from stepwatch.cli.common import settings_from_args
    from stepwatch.daemons.broker import DEV_TOPIC_SETTINGS, DevBroker

    stop = threading.Event()

    def _on_signal(signum: int, _frame: Any) -> None:
        stop.set()

    previous = {s: signal.signal(s, _on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    broker = DevBroker(port=args.port, host=args.host, log_path=args.log_file)
    try:
        broker.start()
        if args.create_topics:
            from stepwatch.kafka import ensure_topics

            args.bootstrap_servers = broker.bootstrap
            ensure_topics(settings_from_args(args).replace(**DEV_TOPIC_SETTINGS))
        print(f"broker ready bootstrap={broker.bootstrap}", flush=True)
        print(f"export STEPWATCH_BOOTSTRAP_SERVERS={broker.bootstrap}", flush=True)
        while not stop.wait(1.0):
            if not broker.running:
                print("stepwatch: error: the broker process exited", flush=True)
                return 1
        return 0
    finally:
        broker.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)

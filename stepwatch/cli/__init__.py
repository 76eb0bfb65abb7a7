"""The ``stepwatch`` command: one subcommand per module in this package.

Each module exposes ``register(subparsers)`` and keeps its heavy imports inside
the function it runs, so ``stepwatch --help`` stays fast and the SDK-only
install can still show help.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from stepwatch.errors import StepwatchError

# Order is the order shown in --help.
SUBCOMMANDS = (
    "demo",
    "broker",
    "agent",
    "simulate",
    "stream",
    "replay",
    "db",
    "sql",
    "query",
    "bench",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="stepwatch",
        description=(
            "Observability pipeline for distributed-training telemetry: node agents "
            "stream GPU, RDMA and per-step timing to Kafka; stream processors find "
            "stragglers, hangs and throughput loss and say why; results go to "
            "Prometheus and ClickHouse."
        ),
        epilog="Settings: explicit flag > STEPWATCH_* environment variable > default.",
    )
    parser.add_argument("--log-level", default=None, help="DEBUG, INFO, WARNING (env STEPWATCH_LOG_LEVEL)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMANDS:
        try:
            module = importlib.import_module(f"stepwatch.cli.{name}")
        except ModuleNotFoundError as err:
            if err.name == f"stepwatch.cli.{name}":
                continue  # subcommand not part of this build
            raise
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    from stepwatch import logs
    from stepwatch.settings import Settings

    logs.configure(args.log_level or Settings.load().log_level)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except StepwatchError as err:
        print(f"stepwatch: error: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

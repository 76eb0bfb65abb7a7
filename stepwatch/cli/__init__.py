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

from stepwatch import __version__
from stepwatch.errors import StepwatchError

# Order is the order shown in --help.
SUBCOMMANDS = (
    "demo",
    "config",
    "broker",
    "agent",
    "simulate",
    "stream",
    "replay",
    "db",
    "sql",
    "query",
    "report",
    "bench",
    "remediate",
    "alerts",
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
        epilog="Settings: explicit flag > STEPWATCH_* environment variable > config file "
        "(--config or STEPWATCH_CONFIG, TOML) > default; `stepwatch config` prints them.",
    )
    parser.add_argument("--version", action="version", version=f"stepwatch {__version__}")
    parser.add_argument(
        "--log-level", default=None, help="DEBUG, INFO, WARNING, ERROR (env STEPWATCH_LOG_LEVEL)"
    )
    parser.add_argument(
        "--config", default=None, metavar="FILE", help="TOML config file (env STEPWATCH_CONFIG)"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMANDS:
        importlib.import_module(f"stepwatch.cli.{name}").register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    from stepwatch import logs
    from stepwatch.extras import from_import_error
    from stepwatch.settings import Settings

    try:
        settings = Settings.load(config_file=args.config, log_level=args.log_level)
        logs.configure(settings.log_level)
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # output piped into head & co.
        sys.stderr.close()
        return 0
    except StepwatchError as err:
        print(f"stepwatch: error: {err}", file=sys.stderr)
        return 1
    except ModuleNotFoundError as err:
        missing = from_import_error(err)
        if missing is None:
            raise
        print(f"stepwatch: error: {args.command} {missing}", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

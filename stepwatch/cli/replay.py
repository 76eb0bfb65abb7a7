"""``stepwatch replay``: run the detection engine over a JSON Lines file of messages."""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import os
import sys
from collections.abc import Iterator
from typing import IO, Any

from stepwatch.cli.common import default_of
from stepwatch.errors import ConfigError, ContractError, StepwatchError

DESCRIPTION = """\
Replay telemetry offline: read contract messages (step, gpu, port, event; one JSON
object per line, the offline form of the topics, e.g. from `stepwatch simulate
--out`) and run the same detection engine the stream workers run, on event time.
Detections are written as JSON Lines (DetectionMessage: open, update, resolved).
A malformed line is reported with its line number and reason on stderr (and
written to --dlq) and skipped. A summary goes to stderr when detections go to
stdout, to stdout otherwise.

Exit status: 0 when at least one line was a valid message (or the input was
empty), 1 when every line was malformed (the input is not contract messages) or
a file cannot be read or written, 2 for a usage error.
"""

EXAMPLES = """\
examples:
  stepwatch simulate --nodes 4 --fault slow_gpu:rank=5:start=100 --out events.jsonl
  stepwatch replay events.jsonl --out detections.jsonl
  stepwatch replay events.jsonl.gz --out - --dlq bad.jsonl | jq -c 'select(.state=="open")'
See docs/detection.md for what each detection means.
"""


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "replay",
        help="run the detection engine over a JSON Lines file, offline",
        description=DESCRIPTION,
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("events", help="JSON Lines file of messages ('-' for stdin; .gz is read)")
    p.add_argument("--out", default="-", help="detections file (default '%(default)s': stdout)")
    p.add_argument(
        "--dlq", help="write malformed lines here as JSON Lines (line, reason, detail, payload)"
    )
    p.add_argument(
        "--hang-min-seconds",
        type=float,
        help="shortest silence called a hang "
        f"(env STEPWATCH_HANG_MIN_SECONDS, {default_of('hang_min_seconds')})",
    )
    p.add_argument(
        "--hang-step-multiple",
        type=float,
        help="silence of this many median steps is a hang "
        f"(env STEPWATCH_HANG_STEP_MULTIPLE, {default_of('hang_step_multiple')})",
    )
    p.add_argument(
        "--tick-seconds",
        type=float,
        default=1.0,
        help="tick the engine each time event time advances this much (default %(default)g)",
    )
    p.add_argument(
        "--end-seconds",
        type=float,
        default=5.0,
        help="at the end, tick this far past the last timestamp (default %(default)g)",
    )
    p.add_argument("--quiet", action="store_true", help="no per-line error reports on stderr")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from stepwatch.cli.progress import counting, status
    from stepwatch.contract import encode
    from stepwatch.settings import Settings
    from stepwatch.streams.core import DetectConfig, Engine
    from stepwatch.streams.replay import replay

    settings = Settings.load(
        hang_min_seconds=args.hang_min_seconds, hang_step_multiple=args.hang_step_multiple
    )
    engine = Engine(DetectConfig.from_settings(settings))
    with contextlib.ExitStack() as stack:
        source = stack.enter_context(_open_in(args.events))
        out = stack.enter_context(_open_out(args.out))
        dlq = stack.enter_context(_open_out(args.dlq)) if args.dlq else None

        def on_detection(d: Any) -> None:
            out.write(encode(d) + b"\n")

        def on_error(line: int, err: ContractError, raw: bytes) -> None:
            if not args.quiet:
                print(f"{args.events}:{line}: {err.reason}: {err.detail}", file=sys.stderr)
            if dlq is not None:
                record = {
                    "line": line,
                    "reason": err.reason,
                    "detail": err.detail,
                    "payload": raw.decode("utf-8", "replace").rstrip("\n"),
                }
                dlq.write(json.dumps(record).encode() + b"\n")

        name = "stdin" if args.events == "-" else os.path.basename(args.events)
        update = stack.enter_context(status(f"replaying {name}"))
        lines = counting(source, update, f"replaying {name}")
        try:
            summary = replay(
                lines,
                engine,
                on_detection,
                on_error,
                tick_seconds=args.tick_seconds,
                end_seconds=args.end_seconds,
            )
        except OSError as err:  # a truncated .gz, a vanished file, a full disk
            raise StepwatchError(f"replay of {args.events} failed: {err}") from err
    report = sys.stderr if args.out == "-" else sys.stdout
    for line in summary.lines_of_text():
        print(line, file=report)
    if summary.malformed and not summary.messages:
        print(
            f"stepwatch: error: all {summary.malformed} lines of {args.events} were malformed: "
            "no contract message to replay",
            file=sys.stderr,
        )
        return 1
    return 0


@contextlib.contextmanager
def _open_in(path: str) -> Iterator[IO[bytes]]:
    if path == "-":
        yield sys.stdin.buffer
        return
    try:
        # closed by the `with` below; opened first so that only opening maps to ConfigError
        stream: Any = (
            gzip.open(path, "rb")  # noqa: SIM115
            if path.endswith(".gz")
            else open(path, "rb")  # noqa: SIM115
        )
    except OSError as err:
        raise ConfigError(f"cannot read {path}: {err}") from err
    with stream:
        yield stream


@contextlib.contextmanager
def _open_out(path: str) -> Iterator[IO[bytes]]:
    if path == "-":
        yield sys.stdout.buffer
        sys.stdout.buffer.flush()
        return
    try:
        stream = open(path, "wb")  # noqa: SIM115 (closed by the `with` below)
    except OSError as err:
        raise StepwatchError(f"cannot write {path}: {err}") from err
    with stream:
        yield stream

"""``stepwatch demo``: the main job on embedded defaults.

Starts the embedded Kafka-protocol broker (unless ``--bootstrap-servers`` is
given), the stream workers and the ClickHouse sink as real subprocesses, and a
simulated fleet with an injected fault publishing through the agent path
(sequence numbers, on-disk spool, idempotent producer); then shows live what
arrives: messages by kind and host, the sequence audit, spool state and
detections.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

DEFAULT_FAULT = "slow_gpu:rank=13:start=40:severity=0.3"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="run the whole pipeline on embedded defaults, live",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bootstrap-servers", help="use this Kafka instead of the embedded broker")
    p.add_argument("--nodes", type=int, default=4, help="simulated nodes (x 8 GPUs x 8 NICs)")
    p.add_argument("--steps", type=int, default=600, help="training steps to simulate")
    p.add_argument("--step-seconds", type=float, default=1.0, help="nominal step time")
    p.add_argument("--fault", action="append", default=None,
                   help=f"fault to inject, KIND[:key=value]... (default {DEFAULT_FAULT}); 'none' for a healthy run")
    p.add_argument("--duration", type=float, default=0.0,
                   help="stop after this many seconds (default: run until the job ends or Ctrl-C)")
    p.add_argument("--workers", type=int, default=1, help="stream workers to start (0: none)")
    p.add_argument("--no-store", action="store_true", help="do not start the ClickHouse sink")
    p.add_argument("--workdir", default="var/demo", help="spool, logs and store of this run")
    p.add_argument("--plain", action="store_true", help="print a status block each interval instead of redrawing")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from stepwatch.demo.runner import Demo, DemoOptions

    faults = args.fault or [DEFAULT_FAULT]
    options = DemoOptions(
        bootstrap=args.bootstrap_servers or "",
        nodes=args.nodes,
        steps=args.steps,
        step_seconds=args.step_seconds,
        faults=tuple(f for f in faults if f != "none"),
        duration=args.duration,
        workers=args.workers,
        store=not args.no_store,
        workdir=Path(args.workdir),
        redraw=sys.stdout.isatty() and not args.plain,
    )
    demo = Demo(options)
    started = time.monotonic()
    try:
        demo.run()
    finally:
        summary = demo.shutdown()
    print(summary)
    print(f"demo ran {time.monotonic() - started:.0f} s; logs in {options.workdir}")
    return 0 if demo.ok else 1

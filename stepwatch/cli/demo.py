"""``stepwatch demo``: the main job on embedded defaults.

Starts the embedded Kafka-protocol broker (unless ``--bootstrap-servers`` is
given), the stream workers and the ClickHouse sink as real subprocesses, and a
simulated fleet with an injected fault publishing through the agent path
(sequence numbers, on-disk spool, idempotent producer); then shows live what
arrives: messages by kind and host, the sequence audit, spool state and
detections. With Prometheus, Alertmanager, the remediator and a local Slurm
cluster (8 job nodes and 2 spare), it shows the whole loop with the time of
each stage: healthy, found, paged, drained, requeued, running again (the
simulated job follows its Slurm allocation and restarts from its last
checkpoint on the new nodes), recovered.

With ``--torch`` the job is a real PyTorch DDP job (examples/ddp_train.py, 4
ranks, gloo on CPU) on the Slurm job's 2 nodes (2 spare): it checkpoints every
100 steps and, after the drain and requeue, is stopped and resumed from its last
checkpoint on the new nodes (its step numbers rewind to it).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

from stepwatch.cli.common import plain_doc
from stepwatch.errors import ConfigError

# A GPU straggler on the second node after a short healthy period: warm-up is
# 10 steps and the detector needs a baseline and k-of-n persistence, so with
# 1 s steps the first detection arrives within about a minute of the start.
JOB = "demo-job"
DEFAULT_FAULT = "slow_gpu:rank=13:start=20:severity=0.3"
STEPS, TORCH_STEPS = 600, 3000
NODES = 8
SIMULATOR_ONLY = ("nodes", "step_seconds", "fault")  # the --torch job is fixed


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "demo",
        help="run the whole pipeline on embedded defaults, live",
        description=plain_doc(__doc__),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--bootstrap-servers", help="use this Kafka instead of the embedded broker")
    p.add_argument(
        "--nodes",
        type=int,
        default=None,
        help=f"simulated nodes (x 8 GPUs x 8 NICs; default {NODES})",
    )
    p.add_argument(
        "--steps",
        type=int,
        default=None,
        help=f"training steps to run (default {STEPS}; with --torch {TORCH_STEPS}, "
        "about 5 minutes on 2 cores)",
    )
    p.add_argument(
        "--step-seconds", type=float, default=None, help="simulated step time (default 1.0 s)"
    )
    p.add_argument(
        "--fault",
        action="append",
        default=None,
        help=f"fault to inject, KIND[:key=value]... (default {DEFAULT_FAULT}); "
        "'none' for a healthy run",
    )
    p.add_argument(
        "--duration",
        type=float,
        default=None,
        help="stop after this many seconds (env STEPWATCH_DEMO_DURATION; default: run "
        "until the job ends or Ctrl-C)",
    )
    p.add_argument("--workers", type=int, default=1, help="stream workers to start (0: none)")
    p.add_argument("--no-store", action="store_true", help="do not start the ClickHouse sink")
    p.add_argument("--workdir", default="var/demo", help="spool, logs and store of this run")
    p.add_argument(
        "--plain",
        action="store_true",
        help="print one line per change and a status line every 10 s "
        "instead of redrawing (the default without a terminal)",
    )
    p.add_argument(
        "--no-report", action="store_true", help="do not write the post-mortem report at the end"
    )
    p.add_argument(
        "--no-alerting",
        action="store_true",
        help="no Prometheus, Alertmanager or remediator (detections only)",
    )
    p.add_argument(
        "--no-slurm",
        action="store_true",
        help="do not start a local Slurm cluster: the remediator runs in observe (dry-run) mode",
    )
    p.add_argument(
        "--torch",
        action="store_true",
        help="a real PyTorch DDP job (examples/ddp_train.py: 4 ranks, gloo on CPU, as "
        "2 nodes of the Slurm job; the second rank on the second node slowed from "
        "step 60; a checkpoint every 100 steps) instead of the simulator; it follows "
        "its Slurm job: stopped when the allocation goes, resumed from its last "
        "checkpoint on the new nodes",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from stepwatch.demo.runner import Demo, DemoOptions

    given = [f"--{o.replace('_', '-')}" for o in SIMULATOR_ONLY if getattr(args, o) is not None]
    if args.torch and given:
        raise ConfigError(
            f"{', '.join(given)}: options of the simulated job; the --torch job is fixed "
            "(4 ranks on 2 nodes, its second node's second rank slowed): leave them out"
        )
    faults = args.fault or [DEFAULT_FAULT]
    options = DemoOptions(
        bootstrap=args.bootstrap_servers or "",
        nodes=NODES if args.nodes is None else args.nodes,
        steps=args.steps or (TORCH_STEPS if args.torch else STEPS),
        step_seconds=1.0 if args.step_seconds is None else args.step_seconds,
        faults=tuple(f for f in faults if f != "none"),
        duration=_duration(args.duration),
        workers=args.workers,
        store=not args.no_store,
        workdir=Path(args.workdir),
        redraw=sys.stdout.isatty() and not args.plain,
        report=not args.no_report,
        alerting=not args.no_alerting,
        slurm=not args.no_slurm,
        torch=args.torch,
    )
    demo = Demo(options)
    started = time.monotonic()
    try:
        demo.run()
    except KeyboardInterrupt:
        print("\ninterrupted: stopping every process the demo started", file=sys.stderr)
    finally:
        summary = demo.shutdown()
    print(summary)
    print(_closing(demo, options.report))
    print(f"demo ran {time.monotonic() - started:.0f} s; logs in {demo.options.workdir}")
    if not demo.ok:
        print(f"demo failed: {'; '.join(demo.failures)} (exit status 1)")
    return 0 if demo.ok else 1


def _duration(given: float | None) -> float:
    """--duration > STEPWATCH_DEMO_DURATION > 0 (until the job ends)."""
    if given is not None:
        return given
    text = os.environ.get("STEPWATCH_DEMO_DURATION", "").strip()
    try:
        return float(text) if text else 0.0
    except ValueError as err:
        raise SystemExit(f"STEPWATCH_DEMO_DURATION={text!r} is not a number of seconds") from err


def _closing(demo: Any, report: bool) -> str:
    """Where things are; the post-mortem report is written once every process has stopped."""
    from stepwatch.demo.closing import closing_note

    store = demo.store_path
    path = None
    job = getattr(demo, "job_id", JOB)
    if store is not None and report:
        path = _report(store, demo.options.workdir / "report", job)
    return closing_note(store, job, path)


def _report(store: Path, out: Path, job: str = JOB) -> Path | None:
    from stepwatch.cli.report import write
    from stepwatch.errors import StepwatchError
    from stepwatch.settings import Settings

    try:
        return write(Settings.load(store_path=str(store)), job, out)
    except StepwatchError as err:  # no steps stored yet, matplotlib missing: say so, go on
        print(f"post-mortem report not written: {err}", file=sys.stderr)
        return None

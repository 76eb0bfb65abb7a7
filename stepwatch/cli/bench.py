"""``stepwatch bench``: run a benchmark shipped in the package (:mod:`stepwatch.quality`)."""

from __future__ import annotations

import argparse
from typing import Any

BENCHMARKS = {
    "detect": "detection quality against the scenarios' ground truth, and Engine.process speed",
}


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "bench",
        help="run a benchmark (detection quality, ...)",
        description="Run a benchmark. "
        "Figures are printed with same-run baselines; see each benchmark's --help.",
    )
    sub = p.add_subparsers(dest="benchmark", metavar="BENCHMARK")
    d = sub.add_parser(
        "detect",
        help=BENCHMARKS["detect"],
        description=(
            "Two seeded scenario families, reported separately: 'sim' "
            "(stepwatch.sim: every fault kind at 5/10/30 percent, 8 to 1024 ranks) "
            "and 'wild' (stepwatch.quality.wild, written independently: "
            "Student-t/Pareto noise, irregular pauses, DDP wait-inside-backward, "
            "unequal pipeline stages, host data stalls, congested NICs; "
            "parameters drawn per seed): precision, recall, F1, duplicates, "
            "time to detect, cause attribution, detections per healthy "
            "job-hour; Engine.process records/s."
        ),
    )
    d.add_argument("--quick", action="store_true", help="the small suite (under a minute)")
    d.add_argument("--seed", type=int, default=7, help="suite seed (default %(default)s)")
    d.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    d.add_argument("--no-micro", action="store_true", help="skip the Engine.process timing")
    d.add_argument("--verbose", action="store_true", help="list every miss and false detection")
    d.add_argument(
        "--family",
        choices=("sim", "wild", "drift", "all", "none"),
        default="all",
        help="which scenario family (default: %(default)s; none: only --recorded)",
    )
    d.add_argument(
        "--recorded",
        metavar="DIR",
        action="append",
        default=[],
        help="also score labelled recordings of real jobs in DIR, e.g. "
        "tests/fixtures/torch (JSON Lines + labels.json; repeatable)",
    )
    d.set_defaults(func=run_detect)
    p.set_defaults(func=lambda args: p.print_help() or 2)


def run_detect(args: argparse.Namespace) -> int:
    from stepwatch.cli.progress import status
    from stepwatch.quality.run import families_of, run

    with status("bench detect: running the suites"):
        return int(
            run(
                quick=args.quick,
                seed=args.seed,
                json_path=args.json,
                micro=not args.no_micro,
                verbose=args.verbose,
                families=families_of(args.family, args.recorded),
            )
        )

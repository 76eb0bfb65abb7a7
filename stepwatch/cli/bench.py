"""``stepwatch bench``: run a benchmark from the bench/ folder of a source checkout."""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

from stepwatch.errors import ConfigError

# name -> (script in bench/, one-line help)
BENCHMARKS = {
    "detect": ("detect_quality.py",
               "detection quality against the simulator's ground truth, and Engine.process speed"),
}


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "bench", help="run a benchmark (detection quality, ...)",
        description="Run a benchmark script from bench/ (needs a source checkout). "
        "Figures are printed with same-run baselines; see each benchmark's --help.",
    )
    sub = p.add_subparsers(dest="benchmark", metavar="BENCHMARK")
    d = sub.add_parser("detect", help=BENCHMARKS["detect"][1],
                       description=(
                           "Seeded suite of simulated jobs (healthy runs with heavy noise and "
                           "pauses; every fault kind at 5/10/30 % severity; 8 to 1024 ranks, "
                           "data and pipeline parallel): precision, recall, F1, time to detect, "
                           "cause attribution, false detections per 1000 healthy job-hours, "
                           "overall and for severities >= 10 %; Engine.process records/s."))
    d.add_argument("--quick", action="store_true", help="the small suite (under a minute)")
    d.add_argument("--seed", type=int, default=7, help="suite seed (default 7)")
    d.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    d.add_argument("--no-micro", action="store_true", help="skip the Engine.process timing")
    d.add_argument("--verbose", action="store_true", help="list every miss and false detection")
    d.set_defaults(func=run_detect)
    p.set_defaults(func=lambda args: p.print_help() or 2)


def run_detect(args: argparse.Namespace) -> int:
    module = load("detect")
    return int(module.run(quick=args.quick, seed=args.seed, json_path=args.json,
                          micro=not args.no_micro, verbose=args.verbose))


def load(name: str) -> ModuleType:
    """Import bench/<script> of the checkout this package runs from."""
    script = Path(__file__).resolve().parents[2] / "bench" / BENCHMARKS[name][0]
    if not script.is_file():
        raise ConfigError(f"benchmark {name!r} needs a source checkout: {script.name} not found "
                          "next to the stepwatch package")
    spec = importlib.util.spec_from_file_location(f"_bench_{name}", script)
    if spec is None or spec.loader is None:
        raise ConfigError(f"cannot load {script.name}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module

"""Run every benchmark in quick form and print their figures, one after another.

Each benchmark prints its own figures next to a baseline measured in the same
run. ``python bench/run_all.py --full`` runs the full sizes (tens of minutes).
"""

from __future__ import annotations

import argparse
import pathlib
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent

QUICK: list[list[str]] = [
    ["bench_sdk.py", "--steps", "3000"],
    ["bench_collectors.py", "--ticks", "300"],
    ["bench_sim.py", "--nodes", "32", "--steps", "300"],
    ["bench_agent.py", "--seconds", "20", "--messages", "50000"],
    ["detect_quality.py", "--quick"],
    ["bench_stream.py"],
    ["bench_store.py"],
]
FULL: list[list[str]] = [
    ["bench_sdk.py"],
    ["bench_collectors.py"],
    ["bench_sim.py"],
    ["bench_agent.py"],
    ["detect_quality.py"],
    ["bench_stream.py"],
    ["bench_store.py", "--full"],
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--full", action="store_true", help="full sizes")
    parser.add_argument("only", nargs="*", help="benchmark file names to run (default: all)")
    args = parser.parse_args()
    failed = 0
    for argv in FULL if args.full else QUICK:
        if args.only and argv[0] not in args.only:
            continue
        script = HERE / argv[0]
        if not script.exists():
            print(f"== {argv[0]}: not present, skipped")
            continue
        print(f"== {' '.join(argv)}", flush=True)
        failed += subprocess.run([sys.executable, str(script), *argv[1:]]).returncode != 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

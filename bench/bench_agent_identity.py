"""Benchmark the agent's reading of a sender's environment (one identity-cache miss).

``/proc/<pid>/environ`` is read for the few variables the identity needs
(:func:`stepwatch.agents.collectors.procfs._parse_environ`: one search each). The
baseline, measured in the same run, is the way it was read before: every variable
into a dict. Sizes: a plain environment (60 variables) and a sender's deliberately
huge one (20,000 variables, about 400 KiB; the agent reads at most 256 KiB of it).

Run: ``python bench/bench_agent_identity.py [--repeat 200]``.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from stepwatch.agents.collectors.procfs import MAX_READ, _parse_environ


def every_variable(raw: bytes) -> dict[str, str]:
    """The baseline: each ``KEY=value`` of the environment in a dict."""
    out: dict[str, str] = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            out[key.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
    return out


def environ(variables: int) -> bytes:
    items = [f"FILLER_{i}=/opt/some/path/{i}" for i in range(variables)]
    items += ["SLURM_JOB_ID=41", "RANK=3", "CUDA_VISIBLE_DEVICES=0,1"]
    return b"\0".join(i.encode() for i in items)[:MAX_READ]  # what the agent reads


def per_call_ms(fn: Callable[[bytes], object], raw: bytes, repeat: int) -> float:
    start = time.perf_counter()
    for _ in range(repeat):
        fn(raw)
    return (time.perf_counter() - start) / repeat * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=200)
    args = parser.parse_args()
    print(f"{'environment':<24}{'bytes':>9}{'every var ms':>14}{'identity ms':>13}{'ratio':>8}")
    for variables in (60, 20_000):
        raw = environ(variables)
        base = per_call_ms(every_variable, raw, args.repeat)
        new = per_call_ms(_parse_environ, raw, args.repeat)
        print(f"{variables:>6} variables{'':<8}{len(raw):>9}{base:>14.3f}{new:>13.3f}"
              f"{base / new:>8.1f}")  # fmt: skip


if __name__ == "__main__":
    main()

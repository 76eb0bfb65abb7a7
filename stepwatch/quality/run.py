"""Detection quality of the core against the simulator's ground truth.

A seeded suite of simulated jobs (stepwatch.sim): healthy runs with heavy noise
and periodic evaluation/checkpoint pauses; every fault kind, slowdowns at 5 %,
10 % and 30 %; job shapes from 8 to 1024 ranks, data parallel and pipeline
stages with unequal compute. Each job's messages go through a fresh
:class:`stepwatch.streams.core.Engine` exactly as the replay drives it (tick at the
largest timestamp seen, every second of event time); its detections are matched
to the labels. Printed: precision, recall, F1, time-to-detect (steps and
seconds, median and p95), cause-attribution accuracy and false detections per
1000 healthy job-hours, overall and for severities >= 10 %, a per-kind table,
and a micro-benchmark of Engine.process (records/s) against msgspec decoding
of the same messages measured in the same run.

    python -m stepwatch.quality.run [--quick] [--seed 7] [--json out.json]
    stepwatch bench detect [--quick]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from stepwatch.quality import drift_suite, recorded, wild_suite
from stepwatch.quality.score import CaseResult, _fmt, report_lines, score
from stepwatch.quality.suite import BenchCase, suite
from stepwatch.sim import simulate
from stepwatch.streams.core import DetectConfig, Engine


def run_case(case: BenchCase, cfg: DetectConfig) -> CaseResult:
    """Drive one fresh engine over the case's messages, as the replay does."""
    engine = Engine(cfg)
    detections = []
    last_tick = 0.0
    messages = records = 0
    t0 = time.perf_counter()
    for message in case.messages():
        messages += 1
        records += len(getattr(message, "steps", ()))
        detections.extend(engine.process(message))
        if message.ts - last_tick >= 1.0:
            last_tick = message.ts
            detections.extend(engine.tick(message.ts))
    detections.extend(engine.tick(engine.now))
    elapsed = time.perf_counter() - t0
    suspects = sum(s.suspects_total for s in engine.stats())
    return CaseResult(case, case.labels(), detections, messages, records, elapsed, suspects)


def micro_benchmark(repeat: int = 3) -> list[dict[str, Any]]:
    """records/s through Engine.process for three job sizes, vs decoding the same bytes."""
    from stepwatch.contract import StepMessage, decode_unchecked, encode
    from stepwatch.sim import Scenario

    out = []
    for nodes, stages, steps in ((1, 1, 400), (8, 2, 200), (128, 8, 40)):
        sc = Scenario(
            seed=11,
            nodes=nodes,
            pipeline_stages=stages,
            steps=steps,
            with_gpu=False,
            with_ports=False,
        )
        msgs = [m for m in simulate(sc) if isinstance(m, StepMessage)]
        wire = [encode(m) for m in msgs]
        n = sum(len(m.steps) for m in msgs)
        best_engine = best_decode = float("inf")
        for _ in range(repeat):
            engine = Engine()
            t = time.perf_counter()
            for m in msgs:
                engine.process(m)
            best_engine = min(best_engine, time.perf_counter() - t)
            t = time.perf_counter()
            for b in wire:
                decode_unchecked(b)
            best_decode = min(best_decode, time.perf_counter() - t)
        out.append(
            {
                "ranks": sc.world_size,
                "stages": stages,
                "records": n,
                "engine_records_per_s": round(n / best_engine),
                "engine_us_per_record": round(1e6 * best_engine / n, 2),
                "decode_records_per_s": round(n / best_decode),
                "engine_over_decode": round(best_engine / best_decode, 2),
            }
        )
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help="the small suite (about a minute)")
    p.add_argument("--seed", type=int, default=7, help="suite seed (default 7)")
    p.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    p.add_argument("--no-micro", action="store_true", help="skip the Engine.process timing")
    p.add_argument("--verbose", action="store_true", help="list every miss and false detection")
    p.add_argument(
        "--family",
        choices=(*FAMILIES, "all", "none"),
        default="all",
        help="scenario family: sim (stepwatch.sim), wild (stepwatch.quality.wild, "
        "written independently), drift (stepwatch.quality.drift: autocorrelated "
        "drift, heavy tails, ragged batches), all (default) or none",
    )
    p.add_argument(
        "--recorded",
        metavar="DIR",
        action="append",
        default=[],
        help="also score the labelled recordings of real jobs in DIR "
        "(see stepwatch.quality.recorded; repeatable)",
    )
    args = p.parse_args(argv)
    return run(
        quick=args.quick,
        seed=args.seed,
        json_path=args.json,
        micro=not args.no_micro,
        verbose=args.verbose,
        families=families_of(args.family, args.recorded),
    )


def families_of(family: str, recorded: Sequence[str]) -> tuple[str, ...]:
    """The families to run: generated ones, then ``recorded:<dir>`` ones."""
    chosen = FAMILIES if family == "all" else () if family == "none" else (family,)
    return (*chosen, *(f"recorded:{d}" for d in recorded))


FAMILIES = ("sim", "wild", "drift")


def cases_of(family: str, *, quick: bool, seed: int) -> list[BenchCase]:
    if family == "sim":
        return list(suite(quick=quick, seed=seed))
    if family.startswith("recorded:"):
        return list(recorded.cases(family.removeprefix("recorded:")))
    if family == "drift":
        return list(drift_suite.suite(quick=quick, seed=seed))
    return list(wild_suite.suite(quick=quick, seed=seed))


def run_family(family: str, *, quick: bool, seed: int, cfg: DetectConfig) -> dict[str, Any]:
    cases = cases_of(family, quick=quick, seed=seed)
    t0 = time.perf_counter()
    results = [run_case(case, cfg) for case in cases]
    figures = score(results)
    figures["suite"] = {
        "family": family,
        "mode": "quick" if quick else "full",
        "seed": seed,
        "cases": len(cases),
        "seconds": round(time.perf_counter() - t0, 1),
    }
    return figures


def run(
    *,
    quick: bool = False,
    seed: int = 7,
    json_path: str | None = None,
    micro: bool = True,
    verbose: bool = False,
    cfg: DetectConfig | None = None,
    families: Sequence[str] = FAMILIES,
) -> int:
    cfg = cfg or DetectConfig()
    out: dict[str, Any] = {}
    for family in families:
        figures = out[family] = run_family(family, quick=quick, seed=seed, cfg=cfg)
        print(f"=== family {family!r} ===")
        for line in report_lines(figures, verbose=verbose):
            print(line)
        print()
    for line in family_table(out):
        print(line)
    if micro:
        out["micro"] = micro_benchmark()
        for line in report_lines({"micro": out["micro"]}, micro_only=True):
            print(line)
    if json_path:
        Path(json_path).write_text(json.dumps(out, indent=2, default=str) + "\n")
    return 0


def family_table(out: dict[str, Any]) -> list[str]:
    """One row per family: the issue's figures on slowdowns >= 10 % and healthy runs."""
    cols = (
        "precision",
        "recall",
        "f1",
        "duplicates",
        "ttd_steps_median",
        "ttd_steps_p95",
        "ttd_seconds_median",
        "ttd_seconds_p95",
        "attribution",
        "detections_per_healthy_job_hour",
        "suspects_per_healthy_job_hour",
        "onset_within_3",
        "network_localized",
    )
    lines = [
        "per family (slowdowns >= 10 % and healthy runs; stops included in 'all faults'):",
        f"{'family':<10}{'subset':<12}{'labels':>7}" + "".join(f"{c[:12]:>13}" for c in cols),
    ]
    for family, f in out.items():
        name = "recorded" if family.startswith("recorded:") else family
        for subset, key in (("all faults", "overall"), ("slow>=10%", "slowdowns_ge_10pct")):
            row = f[key]
            lines.append(
                f"{name:<10}{subset:<12}{row['labels']:>7}"
                + "".join(f"{_fmt(row[c]):>13}" for c in cols)
            )
    return lines


if __name__ == "__main__":
    sys.exit(main())

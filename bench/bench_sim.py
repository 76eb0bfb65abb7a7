"""Simulator throughput: step records per second, next to a scalar baseline from the same run.

* ``steps``: ``simulate()`` of one job (``--nodes`` x 8 ranks, ``--steps``), step
  records only, iterated (no encoding) and written as JSON Lines to /dev/null.
* ``full``: the same job with a GPU and a port sample per host per tick.
* ``baseline``: the same step model written the scalar way: ``random`` draws per
  rank in Python loops, a ``StepRecord`` built with keywords per rank, records
  batched per host (no GPU or port samples, no ordering, no sequence numbers),
  over ``--baseline-steps`` steps. The ratio compares it with ``steps only,
  iterate``, which does that and more.

    python bench/bench_sim.py [--nodes 128] [--steps 1000] [--baseline-steps 100]
"""

from __future__ import annotations

import argparse
import os
import random
import time

from stepwatch.contract import Phases, StepMessage, StepRecord
from stepwatch.sim import Scenario, simulate, write_jsonl


def iterate(sc: Scenario) -> tuple[int, float]:
    t0 = time.perf_counter()
    records = sum(len(m.steps) for m in simulate(sc) if isinstance(m, StepMessage))
    return records, time.perf_counter() - t0


def encode_all(sc: Scenario) -> float:
    t0 = time.perf_counter()
    with open(os.devnull, "wb") as sink:
        write_jsonl(sink, simulate(sc))
    return time.perf_counter() - t0


def baseline(nodes: int, steps: int) -> tuple[int, float]:
    """The same step model, scalar: per-rank ``random`` draws and keyword structs in Python
    loops, records rounded and batched into one StepMessage per host per step."""
    rng = random.Random(1)
    world = nodes * 8
    t, records = 1.0e9, 0
    t0 = time.perf_counter()
    for s in range(steps):
        work = []
        for _ in range(world):
            mult = rng.lognormvariate(0, 0.01)
            if rng.random() < 0.002:
                mult *= 1.015 + 0.03 * rng.paretovariate(1.5)
            gc = 0.15 * rng.lognormvariate(0, 0.4) if rng.random() < 0.002 else 0.0
            data = 0.01 * rng.lognormvariate(0, 0.5)
            work.append((data, 0.30 * mult + gc, 0.55 * mult, 0.06 * mult))
        end = t + max(sum(w) for w in work) + 0.08
        by_host: dict[int, list[StepRecord]] = {}
        for r, (data, fwd, bwd, opt) in enumerate(work):
            skew = abs(rng.gauss(0, 2e-4))
            wait = end + skew - t - data - fwd - bwd - opt
            record = StepRecord(
                job_id="job",
                rank=r,
                world_size=world,
                step=s,
                start=round(t, 6),
                end=round(end + skew, 6),
                host=f"node{r // 8:04d}",
                local_rank=r % 8,
                gpu=r % 8,
                group="all",
                samples=8,
                tokens=32768,
                timing="cuda",
                phases=Phases(
                    data=round(data, 6),
                    forward=round(fwd, 6),
                    backward=round(bwd, 6),
                    optimizer=round(opt, 6),
                    comm_wait=round(wait, 6),
                    extra={},
                ),
            )
            by_host.setdefault(r // 8, []).append(record)
            records += 1
        for h, batch in by_host.items():
            StepMessage(host=f"node{h:04d}", ts=end + 0.5, job_id="job", steps=batch)
        t = end
    return records, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=128)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--baseline-steps", type=int, default=100)
    args = ap.parse_args()
    steps_only = Scenario(nodes=args.nodes, steps=args.steps, with_gpu=False, with_ports=False)
    full = steps_only.replace(with_gpu=True, with_ports=True)
    n, secs = iterate(steps_only)
    enc = encode_all(steps_only)
    nf, full_secs = iterate(full)
    nb, base_secs = baseline(args.nodes, args.baseline_steps)
    rate, base_rate = n / secs, nb / base_secs
    print(f"job: {args.nodes * 8} ranks x {args.steps} steps = {n} step records")
    print(f"steps only, iterate      {rate:>10,.0f} records/s  ({secs:.2f} s)")
    print(f"steps only, JSON Lines   {n / enc:>10,.0f} records/s  ({enc:.2f} s)")
    print(f"with GPU + port samples  {nf / full_secs:>10,.0f} records/s  ({full_secs:.2f} s)")
    print(f"baseline (scalar loop)   {base_rate:>10,.0f} records/s  ({nb} records)")
    print(f"ratio vectorised / baseline: {rate / base_rate:.1f}x")


if __name__ == "__main__":
    main()

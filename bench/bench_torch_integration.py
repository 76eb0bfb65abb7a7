"""Cost of the torch integration on the training thread, against a same-run baseline.

1. The step hook (``WaitSplitter``): per step, split a 4-phase step at one
   launch mark, next to the same SDK step without the hook.
2. A real one-process gloo DDP model (several buckets): median step time with
   DDP's built-in all-reduce, with DDP's own Python ``allreduce_hook`` (the
   price of any comm hook) and with ``instrument_ddp``, interleaved in blocks
   in the same run, and the ratios. The absolute figures depend on the machine; the ratio is
   what to read.

    python bench/bench_torch_integration.py [--steps 3000] [--ddp-steps 300]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from time import perf_counter_ns

import stepwatch
from stepwatch.integrations.torch.split import WaitSplitter


def sdk_steps(n: int, hook: bool) -> float:
    """Median µs per SDK step of 4 empty phases, with or without the split hook."""
    sw = stepwatch.init(
        "bench",
        rank=0,
        world_size=1,
        timing="wall",
        job_events=False,
        agent_socket="/nonexistent/stepwatch-bench.sock",
    )
    splitter = WaitSplitter()
    if hook:
        sw.add_step_hook(splitter)
    times = []
    for _ in range(n):
        t0 = perf_counter_ns()
        with sw.step() as s:
            with s.phase("data"):
                pass
            with s.phase("forward"):
                pass
            with s.phase("backward"):
                splitter.launched(perf_counter_ns(), None)
            with s.phase("optimizer"):
                pass
        times.append(perf_counter_ns() - t0)
    sw.close()
    return statistics.median(times) / 1e3


def ddp_steps(n: int) -> tuple[float, float, float]:
    """Median ms per real DDP step: built-in all-reduce, DDP's Python ``allreduce_hook``
    (what any comm hook costs), and ``instrument_ddp`` (blocks interleaved)."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from stepwatch.daemons.process import free_port
    from stepwatch.integrations.torch import instrument_ddp

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    sw = stepwatch.init(
        "bench",
        rank=0,
        world_size=1,
        job_events=False,
        agent_socket="/nonexistent/stepwatch-bench.sock",
    )
    net = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(6)])
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    models = [DDP(net, bucket_cap_mb=0.3) for _ in range(3)]
    models[1].register_comm_hook(None, allreduce_hook)
    instrument_ddp(models[2], sw)
    x = torch.randn(32, 256)
    out: list[list[float]] = [[], [], []]
    for block in range(3 * max(1, n // 50)):
        which = block % 3
        model = models[which]
        for _ in range(50):
            t0 = time.perf_counter()
            with sw.step() as s:
                with s.phase("forward"):
                    loss = model(x).sum()
                with s.phase("backward"):
                    loss.backward()
            out[which].append((time.perf_counter() - t0) * 1e3)
    sw.close()
    dist.destroy_process_group()
    return statistics.median(out[0]), statistics.median(out[1]), statistics.median(out[2])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--ddp-steps", type=int, default=300)
    args = p.parse_args()
    base, hooked = sdk_steps(args.steps, False), sdk_steps(args.steps, True)
    print(
        f"SDK step, 4 phases:       {base:7.2f} µs   with split hook: {hooked:7.2f} µs   "
        f"hook cost: {hooked - base:+.2f} µs/step"
    )
    try:
        import torch  # noqa: F401
    except ImportError:
        print("torch not installed: DDP part skipped (pip install 'stepwatch[torch]')")
        return
    builtin, hook, timed = ddp_steps(args.ddp_steps)
    print(
        f"DDP step (1 rank, gloo):  built-in all-reduce {builtin:7.3f} ms   "
        f"Python allreduce_hook {hook:7.3f} ms   instrument_ddp {timed:7.3f} ms"
    )
    print(
        f"  ratio instrument_ddp / allreduce_hook: {timed / hook:.3f}   "
        f"/ built-in: {timed / builtin:.3f}"
    )


if __name__ == "__main__":
    main()

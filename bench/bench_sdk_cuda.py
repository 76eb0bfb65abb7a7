"""The step SDK on a real CUDA training loop: what it costs, and whether its
CUDA-event phase times are right (needs a GPU; prints why not without one).

One process trains an MLP on the GPU in blocks of steps, interleaving three
variants in the same run: no SDK, the SDK with wall timing, and the SDK with
CUDA-event timing (``timing="cuda"``). A block ends with one device sync, as a
real loop reads its loss now and then; the figure is wall ms per step over the
block (median of the blocks). The SDK sends to a listening Unix socket whose
reader decodes every datagram, so the cost includes the send path.

Correctness: the ``forward`` phase the SDK reports with CUDA timing is compared
with the same forward timed by a pair of CUDA events of our own (synchronized),
and with what wall timing reports (kernel launches only, on an async device).

    python bench/bench_sdk_cuda.py [--blocks 8] [--steps 40] [--width 4096]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

import stepwatch
from stepwatch.contract.wire import RankStep, decode_datagram


class Reader:
    """A listening agent socket that keeps every step record's phases."""

    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(path)
        self.sock.settimeout(0.2)
        self.steps: list[Any] = []
        self.stop = False
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        while not self.stop:
            try:
                data = self.sock.recv(1 << 17)
            except TimeoutError:
                continue
            item = decode_datagram(data)
            if isinstance(item, RankStep):
                self.steps.append(item.step)

    def close(self) -> None:
        self.stop = True
        self.thread.join()
        self.sock.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--blocks", type=int, default=8, help="blocks per variant")
    p.add_argument("--steps", type=int, default=40, help="steps per block")
    p.add_argument("--width", type=int, default=4096)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--batch", type=int, default=4096)
    args = p.parse_args()
    try:
        import torch
    except ImportError:
        print("torch is not installed: nothing measured")
        return
    if not torch.cuda.is_available():
        print("no CUDA device: nothing measured")
        return
    dev = torch.device("cuda", 0)
    layers: list[torch.nn.Module] = []
    for _ in range(args.layers):
        layers += [torch.nn.Linear(args.width, args.width), torch.nn.GELU()]
    model = torch.nn.Sequential(*layers).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    x = torch.randn(args.batch, args.width, device=dev)
    folder = tempfile.mkdtemp(prefix="sw-cuda-")
    path = os.path.join(folder, "agent.sock")
    reader = Reader(path)
    sws = {
        timing: stepwatch.init(
            f"bench-{timing}",
            rank=0,
            world_size=1,
            timing=timing,
            job_events=False,
            agent_socket=path,
        )
        for timing in ("wall", "cuda")
    }
    print(
        f"device: {torch.cuda.get_device_name(0)}; torch {torch.__version__}; "
        f"sdk timing: {', '.join(f'{k}={v.timing}' for k, v in sws.items())}"
    )

    ref_forward: list[float] = []

    def one_step(sw: Any, reference: bool) -> None:
        step = sw.step(samples=args.batch) if sw is not None else nullcontext()
        with step as s:
            phase: Callable[[str], Any] = s.phase if s is not None else (lambda _n: nullcontext())
            with phase("data"):
                xb = x * 1.0
            if reference:
                a = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
                b = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
                a.record()
            with phase("forward"):
                loss = model(xb).float().pow(2).mean()
            if reference:
                b.record()
            with phase("backward"):
                loss.backward()
            with phase("optimizer"):
                opt.step()
                opt.zero_grad(set_to_none=True)
        if reference:
            b.synchronize()
            ref_forward.append(a.elapsed_time(b))

    for _ in range(10):  # warm-up: cuBLAS handles, allocator
        one_step(None, False)
    torch.cuda.synchronize()
    variants: dict[str, Any] = {"no SDK": None, "SDK wall": sws["wall"], "SDK cuda": sws["cuda"]}
    per_step: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(args.blocks):
        for name, sw in variants.items():
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(args.steps):
                one_step(sw, False)
            torch.cuda.synchronize()
            per_step[name].append((time.perf_counter() - t0) * 1e3 / args.steps)
    for _ in range(args.steps):  # the reference forward, synchronized, outside the timing
        one_step(None, True)
    for sw in sws.values():
        sw.close()
    time.sleep(0.5)
    reader.close()

    base = statistics.median(per_step["no SDK"])
    print(
        f"{args.blocks} blocks x {args.steps} steps per variant, MLP {args.layers}x{args.width}, "
        f"batch {args.batch}"
    )
    for name, vals in per_step.items():
        med = statistics.median(vals)
        print(
            f"  {name:9s} {med:8.3f} ms/step  (min {min(vals):.3f}, max {max(vals):.3f})"
            f"  ratio to no SDK {med / base:.4f}"
        )
    fwd: dict[str, list[float]] = {"wall": [], "cuda": []}
    for rec in reader.steps:
        if rec.phases is not None and rec.phases.forward is not None:
            fwd[rec.timing].append(rec.phases.forward * 1e3)
    print(
        f"records received: wall {len(fwd['wall'])}, cuda {len(fwd['cuda'])} "
        f"(sent {args.blocks * args.steps} each)"
    )
    ref = statistics.median(ref_forward)
    for timing, vals in fwd.items():
        if vals:
            print(
                f"  forward as the SDK reports it, timing={timing}: median "
                f"{statistics.median(vals):.3f} ms   (CUDA-event reference {ref:.3f} ms, "
                f"ratio {statistics.median(vals) / ref:.3f})"
            )


if __name__ == "__main__":
    main()

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

``--part nccl``: the torch integrations on NCCL, one rank per GPU.
``examples/ddp_train.py`` runs with as many ranks as GPUs, once with DDP +
``instrument_ddp`` and once with FSDP2 + ``instrument_fsdp``, against the same
listening socket; printed: the step records received, their timing source and
each phase's median. Exits 1 when a run failed, or a record is missing, not
CUDA-timed, or (DDP) has no ``comm_wait``.

    python bench/bench_sdk_cuda.py [--part cost|nccl|all] [--blocks 8] [--steps 40]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import stepwatch
from stepwatch.contract.wire import RankStep, decode_datagram

ROOT = Path(__file__).resolve().parents[1]
PHASES = ("data", "forward", "backward", "comm_wait", "optimizer")


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


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--part", choices=("cost", "nccl", "all"), default="all")
    p.add_argument("--blocks", type=int, default=8, help="blocks per variant")
    p.add_argument("--steps", type=int, default=40, help="steps per block")
    p.add_argument("--width", type=int, default=4096)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--batch", type=int, default=4096)
    p.add_argument("--nccl-steps", type=int, default=60, help="steps of each NCCL job")
    args = p.parse_args()
    try:
        import torch
    except ImportError:
        print("torch is not installed: nothing measured")
        return 0
    if not torch.cuda.is_available():
        print("no CUDA device: nothing measured")
        return 0
    if args.part in ("cost", "all"):
        sdk_cost(args)
    if args.part in ("nccl", "all"):
        gpus = torch.cuda.device_count()
        with tempfile.TemporaryDirectory(prefix="sw-nccl-") as folder:
            ok = [on_nccl(p, args.nccl_steps, gpus, folder) for p in ("ddp", "fsdp")]
        return 0 if all(ok) else 1
    return 0


def sdk_cost(args: argparse.Namespace) -> None:
    """The three variants interleaved, and the forward each timing reports."""
    import torch

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


def on_nccl(parallel: str, steps: int, gpus: int, folder: str) -> bool:
    """One NCCL job of the example (``ddp`` or ``fsdp``): what the SDK sent, and whether
    every step came, CUDA-timed (and, for DDP, with its comm_wait)."""
    path = os.path.join(folder, f"{parallel}.sock")
    reader = Reader(path)
    cmd = [sys.executable, str(ROOT / "examples" / "ddp_train.py"), "--nproc", str(gpus)]
    cmd += ["--steps", str(steps), "--parallel", parallel, "--job-id", f"nccl-{parallel}"]
    cmd += ["--width", "2048", "--layers", "8", "--batch", "8192"]
    env = {**os.environ, "STEPWATCH_AGENT_SOCKET": path}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    time.sleep(0.5)
    reader.close()
    if proc.returncode != 0:
        print(f"{parallel}: the job failed rc={proc.returncode}\n{proc.stderr[-3000:]}")
        return False
    records = reader.steps
    timing = sorted({r.timing for r in records})
    print(f"{parallel}: {len(records)} step records of {steps * gpus}, timing={timing}")
    medians = {}
    for name in PHASES:
        vals = [getattr(r.phases, name) for r in records if r.phases is not None]
        vals = [v for v in vals if v is not None]
        medians[name] = round(statistics.median(vals) * 1e3, 3) if vals else None
    print(f"  phase medians (ms): {medians}")
    ok = len(records) == steps * gpus and timing == ["cuda"]
    if parallel == "ddp":
        ok = ok and medians["comm_wait"] is not None
    print(f"  {'ok' if ok else 'NOT ok'}")
    return ok


if __name__ == "__main__":
    sys.exit(main())

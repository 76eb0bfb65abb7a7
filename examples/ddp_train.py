"""A small real PyTorch DDP training job instrumented with stepwatch.

CPU (gloo), 4 ranks, started by the script itself::

    python examples/ddp_train.py --nproc 4 --steps 200

or by torchrun, on CPU or GPUs (the backend follows the device: NCCL on CUDA when
each rank has a GPU of its own, gloo when ranks share one; ``--backend`` overrides)::

    torchrun --nproc-per-node 4 --rdzv-id my-job examples/ddp_train.py --steps 200

Slow one rank down from a given step, to watch stepwatch find it::

    python examples/ddp_train.py --slow-rank 2 --slow-kind compute --slow-factor 2.5 --slow-from 60

* ``compute``: that rank's forward pass does ``F`` times the work (real extra compute);
* ``data``: its data loader takes an extra ``(F - 1)`` x its own forward time per batch;
* ``cpu``: ``max(1, round(F - 1))`` busy processes compete for its CPU cores
  (pinned to them with ``taskset`` where it exists).

Checkpoint every 25 steps and restart from the last one, as a requeued job does
(the step numbers the SDK reports go back to the checkpoint's, and rank 0 sends
a ``checkpoint_load`` and a ``restart`` event)::

    python examples/ddp_train.py --checkpoint-dir ckpt --steps 200
    python examples/ddp_train.py --resume ckpt --steps 200

A job shaped like a real one: batches from a ``torch.utils.data.DataLoader``
with worker processes, an evaluation pass every few steps (all ranks, outside
any training step), checkpoints::

    python examples/ddp_train.py --loader-workers 2 --eval-every 40 --checkpoint-dir ckpt

The stepwatch part is five lines: ``stepwatch.init()``, ``instrument_ddp``, the
step and its phases. Everything else is an ordinary DDP loop.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import stepwatch
from stepwatch.integrations.torch import instrument_ddp, instrument_fsdp

BUSY_LOOP = "import time\nwhile True:\n    sum(range(10000))\n"
CHECKPOINT = "checkpoint.pt"  # model, optimizer and the next step; renamed into place
LATEST = "checkpoint.json"  # {"step": N}: what the last complete checkpoint holds


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--parallel",
        choices=("ddp", "fsdp"),
        default="ddp",
        help="DistributedDataParallel, or FSDP2 (fully_shard per layer)",
    )
    p.add_argument(
        "--plain",
        action="store_true",
        help="phases only, without the DDP/FSDP integration (the comm wait then "
        "stays inside backward)",
    )
    p.add_argument(
        "--nproc", type=int, default=4, help="ranks to spawn without torchrun (default 4)"
    )
    p.add_argument(
        "--backend",
        choices=("auto", "nccl", "gloo"),
        default="auto",
        help="on CUDA: NCCL when each local rank has a GPU of its own, else gloo "
        "(several ranks share a GPU); on CPU always gloo",
    )
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--width", type=int, default=768, help="hidden width of the MLP")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--slow-rank", type=int, default=None)
    p.add_argument("--slow-kind", choices=("compute", "data", "cpu"), default="compute")
    p.add_argument("--slow-factor", type=float, default=2.0)
    p.add_argument("--slow-from", type=int, default=60, help="first slowed step")
    p.add_argument("--job-id", default=None, help="default: torchrun's / Slurm's, else ddp-<time>")
    p.add_argument(
        "--pin",
        action="store_true",
        help="CPU only: pin rank r to core r * cores // world (realistic contention)",
    )
    p.add_argument(
        "--emulate-hosts",
        type=int,
        default=0,
        help="report the ranks as N hosts (host-0 ...), each with its own agent "
        "socket when STEPWATCH_AGENT_SOCKET contains {host}",
    )
    p.add_argument(
        "--host-names",
        default="",
        help="names of the emulated hosts, comma-separated (e.g. a Slurm job's "
        "nodes; sets --emulate-hosts to their number)",
    )
    p.add_argument(
        "--checkpoint-dir",
        default="",
        help="rank 0 saves model, optimizer and step here every --checkpoint-every "
        "steps (default: the --resume folder, if any)",
    )
    p.add_argument("--checkpoint-every", type=int, default=25)
    p.add_argument(
        "--slow-checkpoint",
        type=float,
        default=0.0,
        help="emulate slow checkpoint storage: each save takes at least this many seconds",
    )
    p.add_argument(
        "--checkpoint-unreported",
        action="store_true",
        help="save without sw.checkpoint around it, as a framework that does not report "
        "its saves (the stream worker then knows of no save in progress)",
    )
    p.add_argument(
        "--loader-workers",
        type=int,
        default=0,
        help="read batches through a DataLoader with this many worker processes",
    )
    p.add_argument(
        "--eval-every",
        type=int,
        default=0,
        help="an evaluation pass (no gradients, all ranks) every N steps",
    )
    p.add_argument("--eval-batches", type=int, default=8, help="batches per evaluation pass")
    p.add_argument(
        "--resume",
        default="",
        help="continue from the last checkpoint in this folder (from step 0 when "
        "there is none yet)",
    )
    args = p.parse_args(argv)
    if args.host_names:
        args.emulate_hosts = len(args.host_names.split(","))
    args.checkpoint_dir = args.checkpoint_dir or args.resume
    if args.checkpoint_dir and args.parallel != "ddp":
        p.error("--checkpoint-dir and --resume need --parallel ddp")
    return args


class Batches(torch.utils.data.IterableDataset):  # type: ignore[type-arg]
    """Synthetic regression batches; ``delay`` seconds of extra loading per batch (set by
    the data fault, applied in the training loop's data phase: a stalled reader)."""

    def __init__(self, batch: int, width: int, seed: int) -> None:
        self.seed = seed
        self.batch, self.width = batch, width
        self.delay = 0.0

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        info = torch.utils.data.get_worker_info()
        gen = torch.Generator().manual_seed(self.seed + (0 if info is None else 7919 * info.id))
        while True:
            x = torch.randn(self.batch, self.width, generator=gen)
            yield x, x.sum(dim=1, keepdim=True).tanh()


def batches_of(data: Batches, workers: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The batches, read in ``workers`` DataLoader worker processes (in-process with 0)."""
    if workers <= 0:
        return iter(data)
    loader = torch.utils.data.DataLoader(
        data, batch_size=None, num_workers=workers, prefetch_factor=2, persistent_workers=True
    )
    return iter(loader)


def evaluate(
    model: nn.Module,
    data: Iterator[tuple[torch.Tensor, torch.Tensor]],
    batches: int,
    device: torch.device,
) -> float:
    """An evaluation pass: forward only, the loss averaged over the ranks."""
    total = torch.zeros(1, device=device)
    with torch.no_grad():
        for _ in range(batches):
            x, y = (t.to(device) for t in next(data))
            total += nn.functional.mse_loss(model(x), y)
    dist.all_reduce(total)
    return float(total) / (batches * dist.get_world_size())


def make_model(width: int, layers: int) -> nn.Module:
    blocks: list[nn.Module] = []
    for _ in range(layers):
        blocks += [nn.Linear(width, width), nn.GELU()]
    return nn.Sequential(*blocks, nn.Linear(width, 1))


def wrap(model: nn.Module, parallel: str) -> nn.Module:
    if parallel == "ddp":
        return DDP(model)
    from torch.distributed.fsdp import fully_shard

    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    return model


def extra_forward(model: nn.Module, x: torch.Tensor, extra: float) -> None:
    """``extra`` more forward passes' worth of real compute, outside autograd, on a
    local copy of the model (the wrapped one would start collectives of its own)."""
    with torch.no_grad():
        whole, part = int(extra), extra - int(extra)
        for _ in range(whole):
            model(x)
        if part > 0:
            model(x[: max(1, int(len(x) * part))])


def compete(cores: set[int], count: int) -> list[subprocess.Popen[bytes]]:
    """Busy processes pinned to ``cores`` (taskset where present)."""
    cpus = ",".join(str(c) for c in sorted(cores))
    prefix = ["taskset", "-c", cpus] if shutil.which("taskset") else []
    procs = [subprocess.Popen([*prefix, sys.executable, "-c", BUSY_LOOP]) for _ in range(count)]
    if not prefix:
        for proc in procs:
            os.sched_setaffinity(proc.pid, cores)
    return procs


def backend_for(requested: str, gpus: int, ranks_here: int) -> str:
    """The process group's backend: NCCL refuses two ranks on one GPU, so ``auto`` is
    NCCL only when each of this node's ranks has a GPU of its own; gloo otherwise (it
    all-reduces CUDA tensors through the host, and is the only choice without a GPU)."""
    if gpus <= 0:
        return "gloo"
    if requested != "auto":
        return requested
    return "nccl" if ranks_here <= gpus else "gloo"


def setup_rank(args: argparse.Namespace, rank: int, world: int) -> torch.device:
    if torch.cuda.is_available():
        gpus = torch.cuda.device_count()
        local = int(os.environ.get("LOCAL_RANK", rank)) % gpus
        torch.cuda.set_device(local)
        here = int(os.environ.get("LOCAL_WORLD_SIZE", world))
        backend = backend_for(args.backend, gpus, here)
        device = torch.device("cuda", local)
    else:
        device, backend = torch.device("cpu"), "gloo"
        torch.set_num_threads(1)
        cores = sorted(os.sched_getaffinity(0))
        if args.pin and len(cores) > 1:
            os.sched_setaffinity(0, {cores[rank * len(cores) // world]})
    if args.emulate_hosts > 0:
        per_host = -(-world // args.emulate_hosts)
        names = args.host_names.split(",") if args.host_names else []
        host = names[rank // per_host] if names else f"host-{rank // per_host}"
        os.environ.update(
            STEPWATCH_HOST=host,
            LOCAL_RANK=str(rank % per_host),
            LOCAL_WORLD_SIZE=str(per_host),
            GROUP_RANK=str(rank // per_host),
        )
        sock = os.environ.get("STEPWATCH_AGENT_SOCKET", "")
        if "{host}" in sock:
            os.environ["STEPWATCH_AGENT_SOCKET"] = sock.replace("{host}", host)
    dist.init_process_group(backend, rank=rank, world_size=world)
    return device


def save_checkpoint(folder: str, model: nn.Module, opt: torch.optim.Optimizer, step: int) -> Path:
    """Model, optimizer and the next step to run, written whole or not at all (rename)."""
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    net = model.module if isinstance(model, DDP) else model
    tmp = out / f".{CHECKPOINT}.tmp"
    torch.save({"model": net.state_dict(), "optimizer": opt.state_dict(), "step": step}, tmp)
    os.replace(tmp, out / CHECKPOINT)
    (out / f".{LATEST}.tmp").write_text(json.dumps({"step": step}) + "\n")
    os.replace(out / f".{LATEST}.tmp", out / LATEST)
    return out / CHECKPOINT


def load_checkpoint(folder: str, device: torch.device) -> dict[str, Any] | None:
    """The last checkpoint in ``folder``, or None when there is none yet."""
    path = Path(folder) / CHECKPOINT
    if not folder or not path.is_file():
        return None
    return dict(torch.load(path, map_location=device, weights_only=True))


def train(args: argparse.Namespace, rank: int, world: int) -> None:
    device = setup_rank(args, rank, world)
    torch.manual_seed(0)
    t0 = time.perf_counter()
    ckpt = load_checkpoint(args.resume, device)
    loaded_s = time.perf_counter() - t0
    net = make_model(args.width, args.layers).to(device)
    if ckpt is not None:
        net.load_state_dict(ckpt["model"])
    model = wrap(net, args.parallel)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    start = int(ckpt["step"]) if ckpt is not None else 0
    if ckpt is not None:
        opt.load_state_dict(ckpt["optimizer"])
    data = Batches(args.batch, args.width, seed=rank + 1_000_003 * start)  # a resumed run: new data
    local_copy = make_model(args.width, args.layers).to(device)  # for --slow-kind compute

    # identity from torchrun / Slurm / env; after a restart the steps go on from the checkpoint's
    sw = stepwatch.init(job_id=args.job_id, start_step=start)
    if ckpt is not None and rank == 0:
        path = str(Path(args.resume) / CHECKPOINT)
        sw.checkpoint("load", duration=loaded_s, path=path, step=start)
        sw.event(
            "restart",
            f"restarted from the checkpoint at step {start}",
            step=start,
            nodes=args.host_names,
        )
        print(f"resumed from {path} at step {start}", flush=True)
    if args.plain:
        pass
    elif args.parallel == "ddp":
        instrument_ddp(model, sw)  # backward -> backward + comm_wait
    else:
        instrument_fsdp(model, sw)  # all-gather waits -> comm_wait

    slow = args.slow_rank == rank
    forward_times: list[float] = []
    competitors: list[subprocess.Popen[bytes]] = []
    batches = batches_of(data, args.loader_workers)
    progress = Progress(rank, args.steps)
    try:
        for step in range(start, args.steps):
            if slow and step == max(args.slow_from, start):
                competitors = start_fault(args, data, forward_times)
            with sw.step(samples=args.batch) as s:
                with s.phase("data"):
                    if data.delay > 0:
                        time.sleep(data.delay)  # a stalled reader: storage, decode, augmentation
                    x, y = (t.to(device, non_blocking=True) for t in next(batches))
                # the slowed rank measures its forward before the fault (to size a data
                # stall); on CUDA that needs the kernels finished, not only launched
                sync = slow and step < args.slow_from and device.type == "cuda"
                if sync:
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                with s.phase("forward"):
                    loss = nn.functional.mse_loss(model(x), y)
                    if slow and args.slow_kind == "compute" and step >= args.slow_from:
                        extra_forward(local_copy, x, args.slow_factor - 1.0)
                if sync:
                    torch.cuda.synchronize()
                forward_times.append(time.perf_counter() - t0)
                with s.phase("backward"):
                    loss.backward()
                with s.phase("optimizer"):
                    opt.step()
                    opt.zero_grad(set_to_none=True)
                s.loss = loss.detach()  # read off the training thread
            done = step + 1
            progress.step(done)
            if args.eval_every and done % args.eval_every == 0 and done < args.steps:
                evaluate(model, batches, args.eval_batches, device)  # between steps: a pause
            if (
                rank == 0
                and args.checkpoint_dir
                and done % args.checkpoint_every == 0
                and done < args.steps
            ):
                with (
                    contextlib.nullcontext()
                    if args.checkpoint_unreported
                    else sw.checkpoint("save", path=args.checkpoint_dir, step=done)
                ):
                    began = time.monotonic()
                    save_checkpoint(args.checkpoint_dir, model, opt, done)
                    time.sleep(max(0.0, args.slow_checkpoint - (time.monotonic() - began)))
    finally:
        for proc in competitors:
            proc.kill()
            proc.wait()
        sw.close()
        dist.destroy_process_group()


class Progress:
    """Rank 0 prints where training is, every 10 s and at the end (the run is not silent)."""

    def __init__(self, rank: int, steps: int, every_s: float = 10.0) -> None:
        self.on = rank == 0
        self.steps = steps
        self.every_s = every_s
        self.last = self.began = time.monotonic()

    def step(self, done: int) -> None:
        now = time.monotonic()
        if self.on and (now - self.last >= self.every_s or done == self.steps):
            self.last = now
            print(f"step {done}/{self.steps} ({now - self.began:.0f} s)", flush=True)


def start_fault(
    args: argparse.Namespace, data: Batches, forward_times: list[float]
) -> list[subprocess.Popen[bytes]]:
    if args.slow_kind == "data":
        recent = sorted(forward_times[-20:]) or [0.01]
        data.delay = (args.slow_factor - 1.0) * recent[len(recent) // 2]
    elif args.slow_kind == "cpu":
        return compete(os.sched_getaffinity(0), max(1, round(args.slow_factor - 1.0)))
    return []


def spawned(rank: int, args: argparse.Namespace, world: int) -> None:
    os.environ.update(
        RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world)
    )
    train(args, rank, world)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # torchrun (or srun + env)
        train(args, int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]))
        return
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(free_port()))
    if args.job_id is None:
        args.job_id = os.environ.get("STEPWATCH_JOB_ID") or f"ddp-{int(time.time())}"
    # in the ranks' environment from their start: the node agent ties a process to its
    # job by it (torchrun's run id and Slurm's job id do this for their ranks), and
    # only then watches it for an end without job_end (docs/agent.md)
    os.environ["STEPWATCH_JOB_ID"] = args.job_id
    mp.spawn(spawned, args=(args, args.nproc), nprocs=args.nproc, join=True)


if __name__ == "__main__":
    main()

"""The torch integrations on NCCL, one rank per GPU (run on a GPU host).

    python scripts/gpu_nccl_check.py [--steps 60]

Runs ``examples/ddp_train.py`` with as many ranks as GPUs (NCCL), once with
DDP + ``instrument_ddp`` and once with FSDP2 + ``instrument_fsdp``, against a
listening socket standing in for the agent, and prints what the SDK sent: the
number of step records, their timing source and the median of each phase.
Exits 1 when a run failed or a record is missing, not CUDA-timed, or (for
DDP) has no ``comm_wait``.
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
from pathlib import Path

from stepwatch.contract.wire import RankStep, decode_datagram

ROOT = Path(__file__).resolve().parents[1]
PHASES = ("data", "forward", "backward", "comm_wait", "optimizer")


def listen(path: str, out: list[RankStep], stop: threading.Event) -> threading.Thread:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(0.2)

    def run() -> None:
        while not stop.is_set():
            try:
                item = decode_datagram(sock.recv(1 << 17))
            except TimeoutError:
                continue
            if isinstance(item, RankStep):
                out.append(item)
        sock.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def run(parallel: str, steps: int, gpus: int, folder: str) -> bool:
    path = os.path.join(folder, f"{parallel}.sock")
    got: list[RankStep] = []
    stop = threading.Event()
    thread = listen(path, got, stop)
    cmd = [sys.executable, str(ROOT / "examples" / "ddp_train.py"), "--nproc", str(gpus)]
    cmd += ["--steps", str(steps), "--parallel", parallel, "--job-id", f"nccl-{parallel}"]
    cmd += ["--width", "2048", "--layers", "8", "--batch", "8192"]
    env = {**os.environ, "STEPWATCH_AGENT_SOCKET": path}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    stop.set()
    thread.join()
    if proc.returncode != 0:
        print(f"{parallel}: the job failed rc={proc.returncode}\n{proc.stderr[-3000:]}")
        return False
    records = [g.step for g in got]
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


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=60)
    args = p.parse_args()
    import torch

    gpus = torch.cuda.device_count()
    if gpus == 0:
        print("no CUDA device: nothing checked")
        return 0
    with tempfile.TemporaryDirectory(prefix="sw-nccl-") as folder:
        results = [run(parallel, args.steps, gpus, folder) for parallel in ("ddp", "fsdp")]
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())

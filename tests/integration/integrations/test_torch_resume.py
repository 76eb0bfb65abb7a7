"""examples/ddp_train.py checkpoints and resumes: a real 2-rank DDP job (gloo on CPU), twice.

The ranks' datagrams go to a socket this test binds in place of an agent, so
the step numbers and events are what the SDK sent.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.support import paths

pytest.importorskip("torch")

from stepwatch.contract.wire import RankEvent, RankStep, decode_datagram

pytestmark = pytest.mark.serial  # timing-sensitive: run alone (scripts/test.sh)

EXAMPLE = paths.ROOT / "examples" / "ddp_train.py"
SMALL = [
    "--nproc",
    "2",
    "--width",
    "32",
    "--layers",
    "1",
    "--batch",
    "8",
    "--job-id",
    "7",
    "--checkpoint-every",
    "4",
]


def run(tmp: Path, *args: str) -> tuple[list[RankStep], list[RankEvent]]:
    """Run the example with ``args``; the datagrams its ranks sent."""
    path = tmp / "agent.sock"
    path.unlink(missing_ok=True)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(0.2)
    got: list[bytes] = []
    done = threading.Event()

    def drain() -> None:
        while not done.is_set():
            try:
                got.append(sock.recv(65536))
            except TimeoutError:
                continue

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STEPWATCH_", "SLURM_"))}
    env.update(STEPWATCH_AGENT_SOCKET=str(path), STEPWATCH_TIMING="wall")
    try:
        proc = subprocess.run(
            [sys.executable, str(EXAMPLE), *SMALL, *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=150,
            check=False,
        )
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    finally:
        done.set()
        reader.join(2)
        sock.close()
    items = [decode_datagram(d) for d in got]
    return (
        [i for i in items if isinstance(i, RankStep)],
        [i for i in items if isinstance(i, RankEvent)],
    )


@pytest.mark.timeout(300)
def test_the_example_resumes_from_its_last_checkpoint(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    steps, events = run(tmp_path, "--steps", "6", "--checkpoint-dir", str(ckpt))
    assert sorted({s.step.step for s in steps}) == list(range(6))
    saves = [e for e in events if e.type == "checkpoint_save"]
    assert [e.attrs.get("step") for e in saves] == [4]  # every 4 steps, not at the very end
    assert json.loads((ckpt / "checkpoint.json").read_text()) == {"step": 4}
    assert not list(ckpt.glob(".*.tmp"))  # written whole, then renamed

    steps, events = run(tmp_path, "--steps", "10", "--resume", str(ckpt))
    assert sorted({s.step.step for s in steps}) == list(range(4, 10))  # back to the checkpoint's
    assert {s.step.rank for s in steps} == {0, 1}
    restart = [e for e in events if e.type == "restart"]
    assert len(restart) == 1 and restart[0].attrs["step"] == 4 and restart[0].rank == 0
    assert [e.attrs.get("step") for e in events if e.type == "checkpoint_load"] == [4]
    assert json.loads((ckpt / "checkpoint.json").read_text()) == {"step": 8}

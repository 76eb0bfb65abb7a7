"""One agent per spool directory: a second process is refused with a clear error.

Red team: a second `stepwatch agent` on the first one's spool directory (its steps
socket refused, every other collector running) appended to the same segment,
resent the first agent's records and overwrote its ack file: in 20 s, 42 of 94
and 46 of 86 GPU messages arrived twice, and both agents ended with a negative
pending count (-40, -46).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from stepwatch.agents.spool import LOCK_FILE, Spool
from stepwatch.errors import SpoolError

pytestmark = pytest.mark.unit

HOLDER = r"""
import sys
from stepwatch.agents.spool import Spool
spool = Spool(sys.argv[1], 2**20)
print("held", flush=True)
sys.stdin.read()  # until the test closes our stdin
spool.close()
"""


def hold(directory: Path) -> subprocess.Popen[str]:
    """Another process (another agent) with the spool open."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(directory)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def release(proc: subprocess.Popen[str]) -> None:
    assert proc.stdin is not None
    proc.stdin.close()
    assert proc.wait(timeout=30) == 0


def test_a_second_process_on_a_spool_in_use_is_refused_and_writes_nothing(tmp_path: Path) -> None:
    spool_dir = tmp_path / "spool"
    first = hold(spool_dir)
    try:
        before = sorted(p.name for p in spool_dir.iterdir())
        with pytest.raises(SpoolError, match=rf"in use by another agent \(pid {first.pid}\)"):
            Spool(spool_dir, 2**20)
        assert sorted(p.name for p in spool_dir.iterdir()) == before
    finally:
        release(first)
    again = Spool(spool_dir, 2**20)  # the holder is gone: free again
    again.close()


def test_a_killed_agents_lock_is_no_obstacle(tmp_path: Path) -> None:
    spool_dir = tmp_path / "spool"
    first = hold(spool_dir)
    first.kill()  # kill -9: the kernel drops its lock, the lock file stays
    first.wait(timeout=30)
    assert (spool_dir / LOCK_FILE).exists()
    spool = Spool(spool_dir, 2**20)
    spool.append([("t", b"k", b"v", 0)])
    assert spool.pending() == 1
    spool.close()


def test_closing_releases_the_spool_for_the_next_process(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool", 2**20)
    spool.close()
    release(hold(tmp_path / "spool"))

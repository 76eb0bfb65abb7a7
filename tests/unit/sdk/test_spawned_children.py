"""A script's top-level ``stepwatch.init()`` in children that import its main module.

With the ``spawn`` or ``forkserver`` start method (a DataLoader's
``multiprocessing_context="spawn"``, a ``Pool``; Python 3.14's default on Linux)
every child imports the parent's main module as ``__mp_main__``, so a
module-level ``sw = stepwatch.init()`` ran again in each worker, under the
rank's identity. Before, a real run (rank 0, DataLoader with 2 spawned workers,
3 epochs) published 7 ``job_start`` and 7 ``job_end`` events (``finished``,
code 0) for one job: every worker announced the job and ended it while it ran.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from stepwatch.contract.records import EventType
from tests.support.sdk_agent import FakeAgent

SCRIPT = """
import multiprocessing, sys, time
import stepwatch

sw = stepwatch.init("job-mp", rank=0, world_size=1, agent_socket=sys.argv[1], cpu_wait=False)

def work(n):
    time.sleep(0.3)  # a worker that lives a while (a forkserver child ends with os._exit)

if __name__ == "__main__":
    ctx = multiprocessing.get_context(sys.argv[2])
    children = [ctx.Process(target=work, args=(n,)) for n in range(2)]
    for child in children:
        child.start()
    for child in children:
        child.join(30)
        assert child.exitcode == 0, child.exitcode
    with sw.step():
        pass
    sw.close()
    print(sw.stats()["sent"])
"""


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_a_top_level_init_in_a_spawned_child_announces_nothing(
    agent: FakeAgent, method: str, tmp_path: Path
) -> None:
    script = tmp_path / "train.py"  # spawn imports the main module from its file
    script.write_text(SCRIPT)
    out = subprocess.run(
        [sys.executable, str(script), agent.path, method],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).resolve().parents[3],
    )
    assert out.returncode == 0, out.stderr
    steps, events = agent.split(timeout=1.0)
    kinds = [e.type for e in events]
    assert kinds.count(EventType.JOB_START) == 1, kinds
    assert kinds.count(EventType.JOB_END) == 1, kinds
    assert len(steps) == 1

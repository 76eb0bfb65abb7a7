"""Benchmark the agent's step socket with its trust checks (docs/agent.md, "Measured cost").

One child process sends ``--records`` step datagrams as fast as a blocking
``sendto`` allows to a real :class:`StepsCollector` (rate limits off, job
verification on: credentials, a /proc identity per sender, a pidfd pin).
Reported: datagrams/s the reader thread absorbs, the tick's cost per record
(decode, checks, messages split under 256 KiB), and the messages built.
Run it against an older checkout (``PYTHONPATH=<old tree>``) for a baseline:
the constructor there has no ``gate``.

Run: ``python bench/bench_agent_socket.py [--records 30000] [--repeat 3]``.
"""

from __future__ import annotations

import argparse
import inspect
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

from stepwatch.agents.collectors.base import HostContext
from stepwatch.agents.collectors.steps import StepsCollector

SENDER = """
import socket, sys, time
from stepwatch.contract import StepRecord
from stepwatch.contract.wire import RankStep, encode_datagram
now = time.time()
data = [encode_datagram(RankStep(step=StepRecord(job_id="j", rank=i % 8, world_size=8, step=i,
        start=now - 0.1, end=now))) for i in range(int(sys.argv[2]))]
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
t0 = time.monotonic()
for x in data:
    s.sendto(x, sys.argv[1])
print(time.monotonic() - t0)
"""


def once(records: int) -> str:
    path = os.path.join(tempfile.mkdtemp(), "run", "agent.sock")
    kw: dict[str, Any] = {}
    if "gate" in inspect.signature(StepsCollector).parameters:
        from stepwatch.agents.collectors.senders import SenderGate, SenderPolicy

        kw["gate"] = SenderGate(SenderPolicy(sender_rate=0, user_rate=0))
    collector = StepsCollector(path, **kw)
    try:
        run = subprocess.run(
            [sys.executable, "-c", SENDER, path, str(records)],
            capture_output=True,
            text=True,
            check=True,
        )
        seconds = float(run.stdout)
        deadline = time.monotonic() + 10
        while len(collector._buf) < records and time.monotonic() < deadline:
            time.sleep(0.01)
        t0 = time.perf_counter()
        out = collector.collect(HostContext("h", time.time(), {}))
        tick = time.perf_counter() - t0
    finally:
        collector.close()
    got = sum(len(getattr(m, "steps", ())) for m in out)
    return (
        f"received={got} reader_datagrams_per_s={records / seconds:,.0f} "
        f"tick_us_per_record={tick / max(got, 1) * 1e6:.1f} messages={len(out)}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=30_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    for _ in range(args.repeat):
        print(once(args.records), flush=True)


if __name__ == "__main__":
    main()

"""``stepwatch demo`` with its services replaced by one dummy child: the supervision only.

``python -m tests.integration.demo.supervised ARGS...`` runs the real CLI (``stepwatch
demo ARGS``: the workdir, the state file, the live loop, the summary, the exit status)
with the demo's ``_start`` replaced: no broker, no workers, no fleet; one service,
``dummy-0``, a Python process that sleeps, in its own session as every demo service.
It runs in a process of its own because the demo makes itself a subreaper and stops
every process below it at the end (a pytest process's included).
"""

from __future__ import annotations

import os
import sys
import threading
import time

from stepwatch.audit import SeqAudit
from stepwatch.cli import main
from stepwatch.demo.runner import Demo
from stepwatch.demo.services import Child

DUMMY = "dummy-0"


class Tap:
    def __init__(self) -> None:
        self.audit = SeqAudit()
        self.detections: list[object] = []
        self.dlq = 0

    def poll(self) -> int:
        time.sleep(0.05)
        return 0

    def close(self) -> None:
        pass


class Fleet:
    sent = 0
    incarnations: list[object] = []

    def __init__(self) -> None:
        self.finished = threading.Event()

    def stop(self) -> None:
        self.finished.set()


class Publisher:
    def flush(self, timeout: float) -> int:
        return 0

    def close(self, timeout: float) -> None:
        pass


def _start(self: Demo) -> None:
    """Replaces ``Demo._start``: one dummy service, no broker, no job."""
    child = Child(
        DUMMY,
        [sys.executable, "-c", "import time; time.sleep(300)"],
        self.options.workdir / f"{DUMMY}.log",
    )
    child.start(dict(os.environ))
    self.children = [child]
    self.tap = Tap()  # type: ignore[assignment]
    self.fleet, self.publisher = Fleet(), Publisher()


if __name__ == "__main__":
    Demo._start = _start  # type: ignore[method-assign]
    sys.exit(main(["demo", "--plain", "--no-alerting", "--no-report", *sys.argv[1:]]))

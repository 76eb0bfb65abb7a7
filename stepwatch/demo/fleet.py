"""Drive the simulated fleet through the real agent path at wall-clock pace.

Messages from :func:`stepwatch.sim.simulate` are grouped per tick, stamped by a
:class:`~agents.sink.Sequencer` (per host and kind, as each node agent does)
and handed to the spool-backed Kafka publisher, exactly like a node agent's
tick. Runs in a background thread; ``stop`` ends it early.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator

from agents.sink import MessageSink, Sequencer
from stepwatch.contract import Message
from stepwatch.sim import Scenario, resolve_all, simulate

log = logging.getLogger(__name__)


class FleetDriver:
    def __init__(self, scenarios: list[Scenario], sink: MessageSink) -> None:
        self.scenarios = list(resolve_all(scenarios))
        self.sink = sink
        self.sequencer = Sequencer()
        self.sent = 0
        self.finished = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stepwatch-demo-fleet", daemon=True)

    def start(self) -> FleetDriver:
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._thread.join(timeout)

    def _run(self) -> None:
        try:
            for batch in _ticks(simulate(*self.scenarios)):
                delay = batch[0].ts - time.time()
                if delay > 0 and self._stop.wait(delay):
                    return
                if self._stop.is_set():
                    return
                self.sink.send([self.sequencer.stamp(m) for m in batch])
                self.sent += len(batch)
        except Exception:  # the demo must say why it stopped, not die silently
            log.exception("fleet simulation failed")
        finally:
            self.finished.set()


def _ticks(messages: Iterator[Message], width: float = 0.25) -> Iterator[list[Message]]:
    """Group time-ordered messages into batches at most ``width`` seconds wide."""
    batch: list[Message] = []
    for message in messages:
        if batch and message.ts - batch[0].ts > width:
            yield batch
            batch = []
        batch.append(message)
    if batch:
        yield batch

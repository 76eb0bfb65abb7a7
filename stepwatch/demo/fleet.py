"""Drive the simulated fleet through the real agent path at wall-clock pace.

Messages from :func:`stepwatch.sim.simulate` are grouped per tick, stamped by a
:class:`~stepwatch.agents.sink.Sequencer` (per host and kind, as each node agent does)
and handed to the spool-backed Kafka publisher, exactly like a node agent's
tick. The simulator already numbers its messages; the driver stamps them
again with its own instance id, as each run of a real agent does, so runs
against a long-lived Kafka never look like duplicates of each other. Runs in a
background thread; ``stop`` ends it early.
"""

from __future__ import annotations

import logging
import threading

from stepwatch.agents.sink import MessageSink, Sequencer
from stepwatch.sim import Scenario, resolve_all, simulate
from stepwatch.sim.pacing import batches, paced

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
        start = min(s.start_ts for s in self.scenarios)
        try:
            for batch in batches(paced(simulate(*self.scenarios), 1.0, start, self._stop.wait)):
                if self._stop.is_set():
                    return
                self.sink.send([self.sequencer.stamp(m) for m in batch])
                self.sent += len(batch)
        except Exception:  # the demo must say why it stopped, not die silently
            log.exception("fleet simulation failed")
        finally:
            self.finished.set()

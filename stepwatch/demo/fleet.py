"""Drive the simulated fleet through the real agent path at wall-clock pace.

Messages from :func:`stepwatch.sim.simulate` are grouped per tick, stamped by a
:class:`~stepwatch.agents.sink.Sequencer` (per host and kind, as each node agent does)
and handed to the spool-backed Kafka publisher, exactly like a node agent's
tick. The simulator already numbers its messages; the driver stamps them
again with its own instance id, as each run of a real agent does, so runs
against a long-lived Kafka never look like duplicates of each other. Runs in a
background thread; ``stop`` ends it early.

With ``follow`` (a callable that reads the job's allocation from the
scheduler) the simulated job follows its scheduler job: it stops as soon as
its allocation goes away (a drained node, a requeue), waits until the
scheduler runs it again, and restarts from its last checkpoint on the new
nodes. A fault belongs to its node: it moves with the job only when that node
is still in the new allocation.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time

from stepwatch.agents.sink import MessageSink, Sequencer
from stepwatch.contract import EventMessage, EventType, Message
from stepwatch.demo.allocation import Follow, Incarnation, lost, next_running
from stepwatch.sim import Scenario, resolve_all, simulate
from stepwatch.sim.pacing import batches, paced
from stepwatch.sim.ports import Carry
from stepwatch.sim.targets import resolve_targets

log = logging.getLogger(__name__)
__all__ = ["FleetDriver", "Follow", "Incarnation", "restart"]


class FleetDriver:
    def __init__(
        self,
        scenarios: list[Scenario],
        sink: MessageSink,
        follow: Follow | None = None,
        poll_seconds: float = 1.0,
    ) -> None:
        self.scenarios = list(resolve_all(scenarios))
        self.sink = sink
        self.follow = follow
        self.poll_seconds = poll_seconds
        self.sequencer = Sequencer()
        self.sent = 0
        self.checkpoint_step = -1  # the last step a saved checkpoint holds
        self.incarnations: list[Incarnation] = []
        self.stopped_at: float | None = None  # wall clock the job lost its allocation
        self._carry: Carry = {}  # the hosts' NIC counters, across restarts
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
            scenarios = self.scenarios
            while scenarios and not self._stop.is_set():
                self._note(scenarios[0])
                if self._play(scenarios):
                    return  # the job ran to its end
                scenarios = self._restarted(scenarios[0])
        except Exception:  # the demo must say why it stopped, not die silently
            log.exception("fleet simulation failed")
        finally:
            self.finished.set()

    def _note(self, sc: Scenario) -> None:
        self.incarnations.append(
            Incarnation(sc.incarnation, time.time(), sc.host_names, sc.first_step)
        )
        self.stopped_at = None

    def _play(self, scenarios: list[Scenario]) -> bool:
        """Send the scenarios' messages at wall-clock pace; False when the allocation went away."""
        start = min(s.start_ts for s in scenarios)
        hosts = scenarios[0].host_names
        next_check = time.monotonic() + self.poll_seconds
        for batch in batches(
            paced(simulate(*scenarios, carry=self._carry), 1.0, start, self._stop.wait)
        ):
            if self._stop.is_set():
                return True
            self.sink.send([self.sequencer.stamp(m) for m in batch])
            self.sent += len(batch)
            self._checkpoints(batch)
            if self.follow is not None and time.monotonic() >= next_check:
                next_check = time.monotonic() + self.poll_seconds
                if self._lost(hosts):
                    return False
        return True

    def _checkpoints(self, batch: list[Message]) -> None:
        for m in batch:
            if isinstance(m, EventMessage) and m.type == EventType.CHECKPOINT_SAVE:
                step = m.attrs.get("step")
                if isinstance(step, int):
                    self.checkpoint_step = max(self.checkpoint_step, step)

    def _lost(self, hosts: tuple[str, ...]) -> bool:
        assert self.follow is not None
        now = self.follow()
        if not lost(now, hosts):
            return False
        self.stopped_at = time.time()
        log.info(
            "fleet: allocation lost state=%s nodes=%s: the job stops",
            now.state,
            ",".join(now.nodes),
        )
        return True

    def _restarted(self, sc: Scenario) -> list[Scenario]:
        """Wait for the scheduler to run the job again; the restarted scenario ([] on stop)."""
        assert self.follow is not None
        alloc = next(next_running(self.follow, self._stop, self.poll_seconds), None)
        if alloc is None:
            return []
        if len(alloc.nodes) != sc.nodes:
            log.warning(
                "fleet: new allocation has %d nodes, the job needs %d: it stays stopped",
                len(alloc.nodes),
                sc.nodes,
            )
            return []
        restarted = restart(sc, alloc.nodes, self.checkpoint_step + 1)
        log.info(
            "fleet: restarted incarnation=%d first_step=%d nodes=%s",
            restarted.incarnation,
            restarted.first_step,
            ",".join(alloc.nodes),
        )
        return [restarted]


def restart(sc: Scenario, nodes: tuple[str, ...], first_step: int) -> Scenario:
    """``sc`` restarted now on ``nodes`` from ``first_step``: faults stay with their nodes."""
    faults = []
    for target in resolve_targets(sc):
        fault, start = target.fault, max(target.fault.start_step, first_step)
        if target.host is None or target.host not in nodes:
            continue  # a new node is a healthy node
        if fault.end_step is None or fault.end_step > start:
            faults.append(
                dataclasses.replace(
                    fault, rank=None, host=target.host, gpu=target.gpu, start_step=start
                )
            )
    return sc.replace(
        hosts=nodes,
        faults=tuple(faults),
        start_ts=time.time(),
        realtime=False,
        first_step=min(first_step, sc.steps - 1),
        incarnation=sc.incarnation + 1,
        seed=sc.seed + 1,
    )

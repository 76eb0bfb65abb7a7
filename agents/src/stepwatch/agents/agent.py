"""The node agent loop: poll every collector each tick, sequence, hand to the sink.

Ticks are aligned to wall-clock multiples of ``Settings.tick_seconds`` (all
hosts sample at the same instants) and scheduled on the monotonic clock; both
clocks are injectable. A collector that raises is caught, counted and logged
once; the loop itself never stops for a bad reading. On stop (SIGTERM/SIGINT
in the CLI) the agent runs a final tick, flushes, persists the spool position
and closes everything.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from stepwatch.agents.collectors.base import Collector, CollectorHealth, HealthState, HostContext
from stepwatch.agents.collectors.senders import SenderGate, SenderPolicy, VerifyJob, parse_aliases
from stepwatch.agents.collectors.steps import StepsCollector
from stepwatch.agents.host_series import STALE_TICKS, HostSeries, SeriesView
from stepwatch.agents.sink import MessageSink, Sequencer
from stepwatch.contract import KIND_OF, GpuMessage, Message, PortMessage
from stepwatch.contract.fit import fit_message
from stepwatch.errors import ConfigError
from stepwatch.logs import LogOnce
from stepwatch.settings import Settings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AgentSnapshot:
    """What the agent's /metrics shows, read at scrape time."""

    host: str
    inst: str
    ready: bool
    ticks: int
    overruns: int
    last_tick_seconds: float
    health: dict[str, CollectorHealth]
    collector_errors: dict[str, int]  # exceptions caught around collect()
    messages: dict[str, int]  # handed to the sink, by kind
    sink_errors: int
    sink: Any = None  # PublisherStats when the sink has stats()
    steps_received: int = 0
    datagrams_rejected: dict[str, int] = field(default_factory=dict)
    rank_processes_watched: int = 0  # the exit watch (collectors/exits.py)
    rank_exits: int = 0
    rank_watch_skipped: int = 0
    exit_events_listening: bool = False
    series: SeriesView = field(default_factory=SeriesView)  # per-GPU/port series, XID counts
    values_left_out: dict[str, int] = field(default_factory=dict)  # by field (contract/fit.py)


class Agent:
    """One host's agent; see the module docstring."""

    def __init__(
        self,
        settings: Settings,
        collectors: Sequence[Collector],
        sink: MessageSink,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        sequencer: Sequencer | None = None,
    ) -> None:
        self.settings = settings
        self.host = settings.host
        self.sink = sink
        # the steps collector first: it learns GPU ownership the others use in the same tick
        self.collectors = sorted(collectors, key=lambda c: not isinstance(c, StepsCollector))
        self.steps = next((c for c in self.collectors if isinstance(c, StepsCollector)), None)
        self.sequencer = sequencer or Sequencer()
        self._clock, self._wall = clock, wall
        self._log = LogOnce(log)
        self.ready = False
        self.ticks = 0
        self.overruns = 0
        self.last_tick_seconds = 0.0
        self._errors: Counter[str] = Counter()
        self.values_left_out: Counter[str] = Counter()  # by field: beyond the contract
        self._messages: Counter[str] = Counter()
        self._sink_errors = 0
        self.series = HostSeries(STALE_TICKS * settings.tick_seconds + 1.0, clock)

    # ------------------------------------------------------------------ one tick
    def tick(self) -> int:
        """Poll every collector once and send what they return; returns the message count."""
        started = self._clock()
        now = self._wall()
        ctx = HostContext(self.host, now, self.steps.job_of_gpu() if self.steps else {})
        out: list[Message] = []
        for collector in self.collectors:
            out.extend(self._poll(collector, ctx))
            if collector is self.steps:
                ctx = HostContext(self.host, now, collector.job_of_gpu())
        jobs = set(ctx.job_of_gpu.values())
        job = jobs.pop() if len(jobs) == 1 else None
        stamped = [self.sequencer.stamp(_attribute(self._fit(m), self.host, job)) for m in out]
        self._messages.update(KIND_OF[type(m)].value for m in stamped)
        self._observe(stamped)
        try:
            self.sink.send(stamped)
        except Exception as err:  # the sink must not stop the loop either
            self._sink_errors += 1
            self._log(
                "sink",
                "sink failed, messages lost count=%d err=%r",
                len(stamped),
                err,
                level=logging.ERROR,
            )
        self.ticks += 1
        self.last_tick_seconds = self._clock() - started
        return len(stamped)

    def _fit(self, message: Message) -> Message:
        """The message without the values the contract refuses (the consumers refused the
        whole message: every GPU of the host for one ECC count a device got wrong)."""
        fitted, left_out = fit_message(message)
        for name in left_out:
            self.values_left_out[name] += 1
            self._log(
                "unfit:" + name,
                "a reading's value is beyond the contract and left out field=%s "
                "(later ones are counted: stepwatch_agent_values_left_out_total)",
                name,
                level=logging.WARNING,
            )
        return fitted

    def _observe(self, messages: list[Message]) -> None:
        try:
            self.series.observe(messages)
        except Exception as err:  # metrics must not stop the loop
            self._log("series", "host series update failed err=%r", err, level=logging.ERROR)

    def _poll(self, collector: Collector, ctx: HostContext) -> list[Message]:
        try:
            return list(collector.collect(ctx))
        except Exception as err:
            self._errors[collector.name] += 1
            self._log(
                "collect:" + collector.name,
                "collector failed collector=%s err=%r",
                collector.name,
                err,
                level=logging.ERROR,
            )
            return []

    # ------------------------------------------------------------------ the loop
    def run(
        self,
        stop: threading.Event,
        *,
        shutdown_timeout: float = 10.0,
        wait: Callable[[float], bool] | None = None,
    ) -> None:
        """Tick until ``stop`` is set, then shut down cleanly (final tick, flush, close)."""
        wait = wait or stop.wait
        period = self.settings.tick_seconds
        deadline = self._first_deadline(period)
        self.ready = True
        log.info(
            "agent ready host=%s inst=%s collectors=%s tick_seconds=%s socket=%s bootstrap=%s",
            self.host,
            self.sequencer.inst,
            ",".join(c.name for c in self.collectors) or "-",
            period,
            self.steps.path if self.steps else "-",
            self.settings.bootstrap_servers or "-",
        )
        try:
            while not stop.is_set():
                delay = deadline - self._clock()
                if delay > 0 and wait(delay):
                    break
                self.tick()
                deadline += period
                behind = self._clock() - deadline
                if behind > 0:  # a slow tick: skip the missed ones, stay aligned
                    missed = math.floor(behind / period) + 1
                    self.overruns += missed
                    deadline += missed * period
        finally:
            self.shutdown(shutdown_timeout)

    def _first_deadline(self, period: float) -> float:
        wall = self._wall()
        next_wall = (math.floor(wall / period) + 1) * period
        return self._clock() + (next_wall - wall)

    def shutdown(self, timeout: float = 10.0) -> None:
        """Final tick, flush the sink, persist the spool, close collectors."""
        self.ready = False
        log.info("agent stopping host=%s: final tick and flush", self.host)
        self._stop_intake()
        self.tick()
        left = self.sink.flush(timeout)
        self.sink.close(timeout=0 if left else timeout)
        for collector in self.collectors:
            try:
                collector.close()
            except Exception as err:
                self._log(
                    "close:" + collector.name,
                    "collector close failed collector=%s err=%r",
                    collector.name,
                    err,
                )
        log.info(
            "agent stopped host=%s ticks=%d messages=%d steps_received=%d undelivered_in_spool=%d",
            self.host,
            self.ticks,
            sum(self._messages.values()),
            self.steps.steps_received if self.steps else 0,
            left,
        )

    def _stop_intake(self) -> None:
        """Close the ranks' door before the final tick: what they queued is spooled,
        what they send later is counted on their side (``no_agent``), not lost unseen."""
        if self.steps is None:
            return
        try:
            taken = self.steps.stop_intake()
        except Exception as err:  # shutdown goes on whatever happens
            self._log("intake", "steps socket stop failed err=%r", err, level=logging.ERROR)
            return
        log.info("steps socket closed for shutdown queued_datagrams_read=%d", taken)

    # ------------------------------------------------------------------ state
    def snapshot(self) -> AgentSnapshot:
        health: dict[str, CollectorHealth] = {}
        for c in self.collectors:
            try:
                health[c.name] = c.health()
            except Exception as err:
                health[c.name] = CollectorHealth(HealthState.DOWN, 0, repr(err))
        stats = getattr(self.sink, "stats", None)
        return AgentSnapshot(
            host=self.host,
            inst=self.sequencer.inst,
            ready=self.ready,
            ticks=self.ticks,
            overruns=self.overruns,
            last_tick_seconds=self.last_tick_seconds,
            health=health,
            collector_errors={c.name: self._errors[c.name] for c in self.collectors},
            messages=dict(self._messages),
            sink_errors=self._sink_errors,
            sink=stats() if callable(stats) else None,
            steps_received=self.steps.steps_received if self.steps else 0,
            datagrams_rejected=dict(self.steps.rejected) if self.steps else {},
            rank_processes_watched=self.steps.exits.watched if self.steps else 0,
            rank_exits=self.steps.exits.told if self.steps else 0,
            rank_watch_skipped=self.steps.exits.skipped if self.steps else 0,
            exit_events_listening=self.steps.exits.listening if self.steps else False,
            series=self.series.view(),
            values_left_out=dict(self.values_left_out),
        )


def _attribute(message: Message, host: str, job: str | None) -> Message:
    """Fill the host when missing; key host samples by the job when one job owns the host."""
    if not message.host:
        message = msgspec.structs.replace(message, host=host)
    if job and isinstance(message, GpuMessage | PortMessage) and message.job_id is None:
        message = msgspec.structs.replace(message, job_id=job)
    return message


# ---------------------------------------------------------------------- building
class Unavailable:
    """Stands in for a collector that could not be built: reports DOWN, returns nothing."""

    def __init__(self, name: str, error: str) -> None:
        self.name = name
        self._error = error

    def collect(self, ctx: HostContext) -> list[Message]:
        return []

    def health(self) -> CollectorHealth:
        return CollectorHealth(HealthState.DOWN, 1, self._error)

    def close(self) -> None:
        pass


def collector_names(spec: str) -> list[str]:
    names: list[str] = []
    for raw in spec.replace(" ", "").lower().split(","):
        if raw and raw != "none" and raw not in names:
            names.append(raw)
    return names


def steps_collector(settings: Settings) -> StepsCollector:
    """The agent's socket with the trust settings (docs/agent.md, "Who may send")."""
    policy = SenderPolicy(
        verify_job=VerifyJob.parse(settings.agent_verify_job),
        host_aliases=parse_aliases(settings.agent_host_aliases),
        sender_rate=settings.agent_sender_rate,
        sender_burst=settings.agent_sender_burst,
        user_rate=settings.agent_user_rate,
        user_burst=settings.agent_user_burst,
        proc_root=settings.proc_root,
    )
    return StepsCollector(
        settings.agent_socket,
        gate=SenderGate(policy),
        group=settings.agent_socket_group,
        max_message_bytes=min(settings.agent_max_message_bytes, settings.max_message_bytes),
    )


def build_collectors(settings: Settings) -> list[Collector]:
    """The collectors named in ``settings.collectors``; ``steps`` is the agent's own."""
    names = collector_names(settings.collectors)
    out: list[Collector] = []
    if "steps" in names:
        out.append(steps_collector(settings))
    others = [n for n in names if n != "steps"]
    if not others:
        return out
    from stepwatch.agents.collectors import build_host_collectors

    for name in others:
        try:
            out.extend(build_host_collectors(settings, [name]))
        except ConfigError:
            raise
        except Exception as err:
            log.error("collector could not start collector=%s err=%r", name, err)
            out.append(Unavailable(name, repr(err)))
    return out


def build_agent(settings: Settings, sink: MessageSink | None = None) -> Agent:
    """An agent with the configured collectors publishing through ``sink``
    (default: the spool-backed Kafka publisher)."""
    collectors = build_collectors(settings)
    if sink is None:
        from stepwatch.agents.publisher import KafkaPublisher

        try:
            sink = KafkaPublisher(settings)
        except Exception:
            for c in collectors:
                c.close()
            raise
    return Agent(settings, collectors, sink)

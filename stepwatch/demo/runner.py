"""Orchestrates one demo run: broker, services, fleet, live view, final audit."""

from __future__ import annotations

import logging
import shutil
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stepwatch.broker import DevBroker
from stepwatch.demo.services import Child, child_env, children
from stepwatch.demo.tap import Tap
from stepwatch.demo.view import render
from stepwatch.kafka import ensure_topics
from stepwatch.settings import Settings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DemoOptions:
    bootstrap: str = ""
    nodes: int = 8
    steps: int = 600
    step_seconds: float = 1.0
    faults: tuple[str, ...] = ()
    duration: float = 0.0
    workers: int = 1
    store: bool = True
    workdir: Path = Path("var/demo")
    redraw: bool = False
    refresh_seconds: float = 2.0
    report: bool = True


class Demo:
    def __init__(self, options: DemoOptions) -> None:
        self.options = options
        self.broker: DevBroker | None = None
        self.children: list[Child] = []
        self.tap: Tap | None = None
        self.publisher: Any = None
        self.fleet: Any = None
        self.ok = True
        self._stop = False
        self._started = time.monotonic()
        self.first_detection_s: float | None = None

    # ------------------------------------------------------------------ lifecycle
    def run(self) -> None:
        from stepwatch.agents.publisher import KafkaPublisher
        from stepwatch.demo.fleet import FleetDriver

        opts = self.options
        if opts.workdir.exists():
            shutil.rmtree(opts.workdir)
        opts.workdir.mkdir(parents=True)
        signal.signal(signal.SIGTERM, self._on_signal)
        bootstrap = opts.bootstrap or self._start_broker()
        settings = Settings.load(bootstrap_servers=bootstrap, spool_dir=str(opts.workdir / "spool"),
                                 store_path=str(opts.workdir / "chdb"))
        if not opts.bootstrap:
            from stepwatch.broker import DEV_TOPIC_SETTINGS

            settings = settings.replace(**DEV_TOPIC_SETTINGS)
        ensure_topics(settings)
        env = child_env(settings.topic_prefix, settings.partitions)
        self.children = children(bootstrap, opts.workdir, workers=opts.workers, store=opts.store)
        for child in self.children:
            child.start(env)
        self.tap = Tap(settings)
        self.tap.start()
        self.publisher = KafkaPublisher(settings)
        self.fleet = FleetDriver(self._scenarios(), self.publisher).start()
        self._loop()

    def _start_broker(self) -> str:
        # the broker runs in its own session: a terminal's Ctrl-C reaches the demo only,
        # which stops the broker last, after the publisher and the workers have drained
        self.broker = DevBroker(log_path=str(self.options.workdir / "broker.log")).start()
        return self.broker.bootstrap

    def _scenarios(self) -> list:
        from stepwatch.sim import Scenario, parse_fault

        faults = tuple(parse_fault(text).fault for text in self.options.faults)
        return [Scenario(
            seed=7, job_id="demo-job", nodes=self.options.nodes, steps=self.options.steps,
            step_seconds=self.options.step_seconds, faults=faults, realtime=True,
            checkpoint_every=100, eval_every=0,
        )]

    def _loop(self) -> None:
        assert self.tap is not None and self.fleet is not None
        next_draw = 0.0
        while not self._stop:
            self.tap.poll()
            now = time.monotonic()
            if self.first_detection_s is None and self.tap.detections:
                self.first_detection_s = now - self._started
                log.info("first detection seconds_from_start=%.1f", self.first_detection_s)
            if now >= next_draw:
                self._draw()
                next_draw = now + self.options.refresh_seconds
            elapsed = now - self._started
            if self.options.duration and elapsed >= self.options.duration:
                break
            if self.fleet.finished.is_set() and self._caught_up():
                break

    def _caught_up(self) -> bool:
        assert self.tap is not None and self.fleet is not None
        return self.tap.audit.report().messages >= self.fleet.sent

    def _draw(self) -> None:
        assert self.tap is not None and self.publisher is not None
        stats = self.publisher.stats()
        screen = render(
            elapsed=time.monotonic() - self._started,
            report=self.tap.audit.report(),
            accepted=sum(stats.accepted.values()),
            spool={"state": stats.state.value, "records": stats.spool.records,
                   "bytes": stats.spool.bytes, "dropped": sum(stats.spool.dropped.values())},
            detections=self.tap.detections,
            dlq=self.tap.dlq,
            services={c.name: c.alive for c in self.children},
        )
        if self.options.redraw:
            sys.stdout.write("\x1b[H\x1b[2J" + screen + "\n")
        else:
            sys.stdout.write(screen + "\n" + "-" * 72 + "\n")
        sys.stdout.flush()

    def _on_signal(self, *_: object) -> None:
        self._stop = True

    def shutdown(self) -> str:
        """Stop everything in order; return the final summary."""
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not orphan children
        try:
            return self._shutdown()
        finally:
            signal.signal(signal.SIGINT, signal.default_int_handler)

    def _shutdown(self) -> str:
        if self.fleet is not None:
            self.fleet.stop()
        undelivered = self.publisher.flush(15.0) if self.publisher is not None else 0
        if self.tap is not None and self.fleet is not None:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and not self._caught_up():
                self.tap.poll()
        summary = self._summary(undelivered)
        if self.publisher is not None:
            self.publisher.close(5.0)
        for child in reversed(self.children):
            child.stop()
        if self.tap is not None:
            self.tap.close()
        if self.broker is not None:
            self.broker.stop()
        return summary

    @property
    def store_path(self) -> Path | None:
        """The embedded store of this run, when the sink ran."""
        store = self.options.workdir / "chdb"
        return store if any(c.name == "sink" for c in self.children) and store.exists() else None

    def _summary(self, undelivered: int) -> str:
        if self.tap is None or self.fleet is None:
            return "demo did not start"
        report = self.tap.audit.report()
        opened = [d for d in self.tap.detections if d.state == "open"]
        self.ok = report.missing == 0 and undelivered == 0
        lines = [
            "",
            f"published {self.fleet.sent} messages; arrived {report.messages}; "
            f"missing {report.missing}; duplicates {report.duplicates}; undelivered {undelivered}",
            f"faults injected: {', '.join(self.options.faults) or 'none'}",
            f"detections opened: {len(opened)}",
        ]
        if self.first_detection_s is not None:
            lines.append(f"first detection {self.first_detection_s:.0f} s after the demo started")
        for d in opened:
            lines.append(f"  {d.type} job={d.job_id} rank={d.rank} host={d.host} cause={d.cause} "
                         f"at step {d.step}: {d.summary}")
        return "\n".join(lines)

"""Orchestrates one demo run: broker, services, fleet, live view, final audit."""

from __future__ import annotations

import dataclasses
import logging
import shutil
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stepwatch.daemons.broker import DevBroker
from stepwatch.demo.alerting import AlertingStack, AlertView
from stepwatch.demo.arc import Arc
from stepwatch.demo.ledger import STATE_FILE, Recorder, clear_previous
from stepwatch.demo.plain import Changes, snapshot
from stepwatch.demo.scrape import scrape_jobs
from stepwatch.demo.services import Child, become_subreaper, child_env, children, stop_descendants
from stepwatch.demo.tap import Tap
from stepwatch.demo.torchjob import HOSTS as TORCH_HOSTS
from stepwatch.demo.torchjob import TorchJob
from stepwatch.demo.view import render
from stepwatch.demo.watch import Probed, Service, Watch, verdict
from stepwatch.errors import StepwatchError
from stepwatch.kafka import ensure_topics
from stepwatch.settings import Settings

if TYPE_CHECKING:
    from stepwatch.sim import Scenario

log = logging.getLogger(__name__)
CHECKPOINT_EVERY = 25  # steps: a restart loses at most this many


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
    alerting: bool = True  # Prometheus + Alertmanager + remediator (+ Slurm when present)
    slurm: bool = True  # act on a local Slurm cluster when this machine can run one
    torch: bool = False  # a real PyTorch DDP job (examples/ddp_train.py) instead of the simulator


class Demo:
    def __init__(self, options: DemoOptions) -> None:
        # every path handed to a daemon is absolute: Alertmanager and Prometheus resolve a
        # relative one against their config file's folder, not this process's directory
        self.options = dataclasses.replace(options, workdir=options.workdir.resolve())
        self.broker: DevBroker | None = None
        self.children: list[Child] = []
        self.tap: Tap | None = None
        self.publisher: Any = None
        self.fleet: Any = None
        self.ok = True
        self._stop = False
        self._started = time.monotonic()
        self.first_detection_s: float | None = None
        self.first_alert_s: float | None = None
        self.first_action_s: float | None = None
        self.alerting: AlertingStack | None = None
        self.job_id = "demo-job"
        self._alert_view = AlertView()
        self._live: Any = None
        self.torch_job: TorchJob | None = None
        self.arc = Arc(wall0=time.time())
        self._changes = Changes()
        self.watch = Watch()  # the services that died while the demo ran
        self.failures: list[str] = []  # why the run failed (set by the summary)
        self._recorder: Recorder | None = None
        self._looped = False  # the live loop ended by itself (not by Ctrl-C)

    # ------------------------------------------------------------------ lifecycle
    def run(self) -> None:
        self._prepare()
        self._start()
        self._loop()

    def _prepare(self) -> None:
        """A fresh workdir (what a killed run left running stopped first); supervision on."""
        opts = self.options
        if opts.workdir.exists():
            # a killed run's processes would go on writing into the folder deleted here
            clear_previous(opts.workdir, _say)
            shutil.rmtree(opts.workdir)
        opts.workdir.mkdir(parents=True)
        signal.signal(signal.SIGTERM, self._on_signal)
        become_subreaper()  # what a daemon leaves behind comes back to us, to be stopped
        self._recorder = Recorder(opts.workdir / STATE_FILE, names=self._names).start()

    def _start(self) -> None:
        """The broker, the services, the alerting stack, the tap and the job."""
        from stepwatch.agents.publisher import KafkaPublisher
        from stepwatch.demo.fleet import FleetDriver

        opts = self.options
        bootstrap = opts.bootstrap or self._start_broker()
        settings = Settings.load(
            bootstrap_servers=bootstrap,
            spool_dir=str(opts.workdir / "spool"),
            store_path=str(opts.workdir / "chdb"),
        )
        if not opts.bootstrap:
            from stepwatch.daemons.broker import DEV_TOPIC_SETTINGS

            settings = settings.replace(**DEV_TOPIC_SETTINGS)
        ensure_topics(settings)
        env = child_env(settings.topic_prefix, settings.partitions)
        self.children = children(bootstrap, opts.workdir, workers=opts.workers, store=opts.store)
        for child in self.children:
            child.start(env)
        hosts = self._start_alerting(settings, env)
        self.tap = Tap(settings)
        self.tap.start()
        self.publisher = KafkaPublisher(settings)
        if opts.torch:
            self.torch_job = self._torch_job(settings, hosts).start(env)
            self.arc.fault_hosts = frozenset({self.torch_job.slow_node})
            self.fleet = self.torch_job
        else:
            follow = self.alerting.allocation() if self.alerting is not None else None
            self.fleet = FleetDriver(self._scenarios(hosts), self.publisher, follow=follow).start()

    def _torch_job(self, settings: Settings, hosts: tuple[str, ...] | None) -> TorchJob:
        """The DDP job: on the Slurm job's nodes (an agent on every node) when Slurm runs."""
        follow = self.alerting.allocation() if self.alerting is not None else None
        if follow is None or not hosts or self.alerting is None:
            return TorchJob(settings, self.options.workdir, self.job_id, self.options)
        return TorchJob(
            settings,
            self.options.workdir,
            self.job_id,
            self.options,
            follow=follow,
            hosts=hosts,
            agent_hosts=tuple(self.alerting.slurm.node_names),
        )

    def _start_alerting(self, settings: Settings, env: dict[str, str]) -> tuple[str, ...] | None:
        """Slurm (when possible), remediator, Alertmanager, Prometheus; the job's hosts."""
        opts = self.options
        if not opts.alerting:
            return None
        scrape = {
            "stepwatch-stream": [
                c.metrics for c in self.children if c.name.startswith("stream") and c.metrics
            ],
            "stepwatch-sink": [c.metrics for c in self.children if c.name == "sink" and c.metrics],
        }
        stack = AlertingStack(
            opts.workdir / "alerting",
            scrape={k: v for k, v in scrape.items() if v},
            bootstrap=settings.bootstrap_servers,
            topic_prefix=settings.topic_prefix,
            nodes=len(TORCH_HOSTS) if opts.torch else opts.nodes,
            want_slurm=opts.slurm,
        )
        stack.workdir.mkdir(parents=True, exist_ok=True)
        self.alerting = stack
        try:
            nodes = stack.start_slurm()
            if nodes is not None and stack.slurm_job:
                self.job_id = stack.slurm_job
            stack.start(env)
        except (StepwatchError, OSError) as err:
            log.warning("demo: alerting stack did not start, running without it err=%s", err)
            stack.stop()
            self.alerting = None
            return None
        return tuple(nodes) if nodes else None

    def _start_broker(self) -> str:
        # the broker runs in its own session: a terminal's Ctrl-C reaches the demo only,
        # which stops the broker last, after the publisher and the workers have drained
        self.broker = DevBroker(log_path=str(self.options.workdir / "broker.log")).start()
        return self.broker.bootstrap

    def _scenarios(self, hosts: tuple[str, ...] | None = None) -> list[Scenario]:
        from stepwatch.sim import Scenario, parse_fault

        faults = tuple(parse_fault(text).fault for text in self.options.faults)
        return [
            Scenario(
                seed=7,
                job_id=self.job_id,
                nodes=self.options.nodes,
                steps=self.options.steps,
                step_seconds=self.options.step_seconds,
                faults=faults,
                realtime=True,
                checkpoint_every=CHECKPOINT_EVERY,
                checkpoint_seconds=2 * self.options.step_seconds,
                eval_every=0,
                hosts=hosts,
            )
        ]

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
                self._check_services(now - self._started)
                self._refresh_alerting(now)
                self._observe(now - self._started)
                self._draw()
                next_draw = now + self.options.refresh_seconds
            elapsed = now - self._started
            if self.options.duration and elapsed >= self.options.duration:
                break
            if self.fleet.finished.is_set() and self._caught_up():
                break
        self._looped = True

    def _services(self) -> list[Service]:
        """What the demo watches: its services, the job's agents, the broker."""
        agents: list[Child] = list(getattr(self.fleet, "agents", []))
        out: list[Service] = [*self._all_children(), *agents]
        if self.broker is not None:
            out.append(Probed("broker", self.options.workdir / "broker.log", self._broker_runs))
        return out

    def _broker_runs(self) -> bool:
        return self.broker is not None and self.broker.running

    def _names(self) -> dict[int, str]:
        """The pids of the services the demo started, by name (for its state file)."""
        agents: list[Child] = list(getattr(self.fleet, "agents", []))
        return {c.proc.pid: c.name for c in [*self._all_children(), *agents] if c.proc}

    def _check_services(self, at: float) -> None:
        """Note the services that died since the last check (none while the demo stops)."""
        if self._stop:
            return
        for death in self.watch.check(self._services(), at):
            log.warning(
                "demo: service died name=%s how=%s log=%s", death.name, death.how, death.log
            )

    def _refresh_alerting(self, now: float) -> None:
        if self.alerting is None:
            return
        self._alert_view = self.alerting.view()
        if self.first_alert_s is None and self._alert_view.firing:
            self.first_alert_s = now - self._started
            log.info("first alert firing seconds_from_start=%.1f", self.first_alert_s)
        if self.first_action_s is None and self._alert_view.decisions:
            self.first_action_s = now - self._started
            log.info("first remediator decision seconds_from_start=%.1f", self.first_action_s)

    def _observe(self, at: float) -> None:
        assert self.tap is not None and self.fleet is not None
        view = self._alert_view
        for stage in self.arc.observe(
            at,
            steps=self.tap.audit.report().by_kind.get("step", 0),
            detections=self.tap.detections,
            notifications=view.notifications,
            actions=view.actions,
            incarnations=getattr(self.fleet, "incarnations", ()),
            outcomes=view.outcomes,
        ):
            log.info(
                "demo stage=%s seconds_from_start=%.1f detail=%s",
                stage.name.replace(" ", "_"),
                stage.at,
                stage.detail,
            )

    def _job_line(self) -> str:
        follow = self.alerting.allocation() if self.alerting is not None else None
        if follow is None:
            return ""
        now = follow()
        where = f" on {','.join(now.nodes)}" if now.nodes else ""
        incarnations = getattr(self.fleet, "incarnations", [])
        run = (
            f" (run {len(incarnations)}, from step {incarnations[-1].first_step})"
            if incarnations
            else ""
        )
        return f"{self.alerting.slurm_job if self.alerting else ''} {now.state}{where}{run}".strip()

    def _caught_up(self) -> bool:
        assert self.tap is not None and self.fleet is not None
        sent: int = self.fleet.sent
        return self.tap.audit.report().messages >= sent

    def _draw(self) -> None:
        assert self.tap is not None and self.publisher is not None
        elapsed = time.monotonic() - self._started
        report = self.tap.audit.report()
        alerting = self._alert_view if self.alerting is not None else None
        slurm = self.alerting.slurm_nodes() if self.alerting is not None else {}
        services = self.watch.states(self._services())
        job = self._job_line()
        if not self.options.redraw:
            snap = snapshot(
                stages=self.arc.stages(),
                detections=self.tap.detections,
                alerting=alerting,
                slurm=slurm,
                job=job,
                services=services,
            )
            status = (
                f"steps={report.by_kind.get('step', 0)} arrived={report.messages} "
                f"missing={report.missing} duplicates={report.duplicates} "
                f"firing={len(alerting.firing) if alerting else 0} job={job or '-'}"
                f"{self.watch.status()}"
            )
            for line in self._changes.lines(elapsed, snap, status):
                sys.stdout.write(line + "\n")
            sys.stdout.flush()
            return
        stats = self.publisher.stats()
        screen = render(
            elapsed=elapsed,
            report=report,
            accepted=sum(stats.accepted.values()),
            spool={
                "state": stats.state.value,
                "records": stats.spool.records,
                "bytes": stats.spool.bytes,
                "dropped": sum(stats.spool.dropped.values()),
            },
            detections=self.tap.detections,
            dlq=self.tap.dlq,
            services=services,
            jobs=scrape_jobs(c.metrics for c in self.children if c.name.startswith("stream")),
            alerting=alerting,
            slurm=slurm,
            stages=self.arc.stages(),
            job=job,
        )
        self._show_live(screen)

    def _show_live(self, screen: str) -> None:
        """Redraw in place with rich when it is installed, with ANSI codes otherwise."""
        try:
            from rich.live import Live
            from rich.panel import Panel
            from rich.text import Text
        except ImportError:
            sys.stdout.write("\x1b[H\x1b[2J" + screen + "\n")
            return
        panel = Panel(Text(screen), title="stepwatch demo", subtitle="Ctrl-C stops everything")
        if self._live is None:
            self._live = Live(panel, auto_refresh=False, screen=False)
            self._live.start()
        self._live.update(panel, refresh=True)

    def _all_children(self) -> list[Child]:
        stack = self.alerting
        extra = [stack.remediator, stack.alert_receiver] if stack is not None else []
        return [*self.children, *(c for c in extra if c is not None)]

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
        if self._live is not None:
            self._live.stop()
        if self._looped:  # what died after the last refresh, before anything is stopped
            self._check_services(time.monotonic() - self._started)
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
        if self.alerting is not None:
            self.alerting.stop()
        for child in reversed(self.children):
            child.stop()
        if self.tap is not None:
            self.tap.close()
        if self.broker is not None:
            self.broker.stop()
        left = stop_descendants()
        if left:
            log.warning("demo: stopped processes left behind pids=%s", left)
        if self._recorder is not None:
            self._recorder.close()  # everything it listed has stopped
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
        self.failures = verdict(
            deaths=list(self.watch.deaths), missing=report.missing, undelivered=undelivered
        )
        self.ok = not self.failures
        faults = (
            self.torch_job.fault if self.torch_job else ", ".join(self.options.faults) or "none"
        )
        lines = [
            "",
            f"published {self.fleet.sent} messages; arrived {report.messages}; "
            f"missing {report.missing}; duplicates {report.duplicates}; undelivered {undelivered}",
            f"faults injected: {faults}",
            f"detections opened: {len(opened)}",
        ]
        if self.first_detection_s is not None:
            lines.append(f"first detection {self.first_detection_s:.0f} s after the demo started")
        if self.first_alert_s is not None:
            lines.append(f"first alert firing {self.first_alert_s:.0f} s after the demo started")
        if self.first_action_s is not None:
            lines.append(
                f"first remediator decision {self.first_action_s:.0f} s after the demo started"
            )
        for decision in self._alert_view.decisions:
            lines.append(f"  remediator: {decision}")
        if self.arc.stages():
            lines.append("the loop (seconds after the demo started):")
            lines += [f"  {s.name:<14} {s.at:6.1f} s  {s.detail}" for s in self.arc.stages()]
        if self.alerting is not None and self.alerting.prometheus is not None:
            lines.append(
                f"Prometheus {self.alerting.prometheus.url} and Alertmanager "
                f"{self.alerting.alertmanager.url} ran for this demo (stopped now)"
            )
        for d in opened:
            lines.append(
                f"  {d.type} job={d.job_id} rank={d.rank} host={d.host} cause={d.cause} "
                f"at step {d.step}: {d.summary}"
            )
        lines += self.watch.summary()
        return "\n".join(lines)


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()

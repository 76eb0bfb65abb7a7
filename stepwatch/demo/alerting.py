"""The demo's alerting half: a local Slurm cluster, the remediator, Alertmanager, Prometheus.

What a person sees in the demo after a detection: Prometheus scrapes every
stepwatch component and evaluates the shipped alert rules, Alertmanager routes
with the shipped tree (waits shortened to 1 s), and the remediator acts on a
real local Slurm cluster (execute mode) when this machine has Slurm and munge
and runs as root, or records what it would do (observe mode, a dry run)
otherwise. Every part is optional: a missing binary turns that part off with
one log line, never the demo.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import secrets
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stepwatch.daemons.process import free_port
from stepwatch.demo.allocation import SlurmAllocation
from stepwatch.demo.pager import Pager
from stepwatch.demo.services import Child
from stepwatch.errors import StepwatchError

log = logging.getLogger(__name__)

SPARE_NODES = 2  # idle nodes beside the job's: a requeued job runs again without the drained one
REQUEUE_DELAY_S = 10  # Slurm holds a requeued job this long (its cred_expire; default 120 s)

POLICY = """\
mode: {mode}
rules:
  - match: {{class: system, remediation: drain}}
    actions: [drain, requeue]
  - match: {{class: system, remediation: requeue}}
    actions: [requeue]
  - match: {{class: user}}
    actions: [notify]
guardrails:
  breaker: {{max_share: 0.25, window: 10m}}
  rate_limit: {{actions: 3, per: 1h}}
actuator: {actuator}
notify: {{kind: log}}
page: {{kind: log}}
"""
# where the remediator tracks outcomes: did the alert resolve after the action?
OUTCOME = """\
outcome: {{deadline: 5m, check_every: 5s, settle: 20s, prometheus_url: "{prometheus}"}}
"""


@dataclass(frozen=True)
class AlertView:
    """What the live view shows of alerting: firing alerts and the remediator's decisions."""

    firing: tuple[str, ...] = ()
    decisions: tuple[str, ...] = ()
    breaker_open: bool = False
    actions: tuple[Mapping[str, Any], ...] = ()  # the remediator's action rows, oldest first
    notifications: tuple[Any, ...] = ()  # what the pager and the ticket queue received
    outcomes: tuple[Mapping[str, Any], ...] = ()  # did an executed action help (remediator)


@dataclass
class AlertingStack:
    workdir: Path
    scrape: Mapping[str, Sequence[str]]  # Prometheus job name -> host:port targets
    bootstrap: str
    topic_prefix: str
    nodes: int
    want_slurm: bool = True
    slurm: Any = None
    slurm_job: str = ""
    remediator: Child | None = None
    alertmanager: Any = None
    prometheus: Any = None
    remediator_url: str = ""
    spare: int = SPARE_NODES
    pager: Pager | None = None
    alert_receiver: Child | None = None
    _token: str = field(default_factory=lambda: secrets.token_hex(16), repr=False)
    # the live view reads the remediator's API as an operator, with a token of its own
    _operator_token: str = field(default_factory=lambda: secrets.token_hex(16), repr=False)
    _client: Any = None

    # ------------------------------------------------------------------ lifecycle
    def start_slurm(self) -> list[str] | None:
        """Start the local Slurm cluster (spare nodes included) and the job; its nodes, or None."""
        if not self.want_slurm:
            return None
        from stepwatch.daemons.slurm import SlurmCluster, missing_binaries

        missing = missing_binaries()
        if missing or os.geteuid() != 0:
            why = f"missing {', '.join(missing)}" if missing else "not root"
            log.info("demo: no local Slurm cluster (%s); the remediator runs in observe mode", why)
            return None
        try:
            self.slurm = SlurmCluster(
                self.workdir / "slurm", nodes=self.nodes + self.spare, cred_expire=REQUEUE_DELAY_S
            ).start()
            self.slurm_job = self.slurm.sbatch(
                "-N",
                str(self.nodes),
                "--requeue",
                "--job-name",
                "demo-train",
                "--chdir",
                str(self.workdir),
                "--output",
                str(self.workdir / "slurm-%j.out"),
                "--wrap",
                "sleep 3600",
            )
            return list(self._wait_running())
        except (StepwatchError, ValueError) as err:
            log.warning("demo: local Slurm cluster did not start (%s); observe mode", err)
            if self.slurm is not None:
                self.slurm.stop()
            self.slurm, self.slurm_job = None, ""
            return None

    def _wait_running(self, timeout: float = 60.0) -> tuple[str, ...]:
        follow = self.allocation()
        assert follow is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            now = follow()
            if now.running:
                return now.nodes
            time.sleep(0.5)
        raise StepwatchError(f"Slurm job {self.slurm_job} not running after {timeout:.0f} s")

    def allocation(self) -> SlurmAllocation | None:
        """Reads the job's allocation from Slurm (None without a Slurm cluster)."""
        if self.slurm is None or not self.slurm_job:
            return None
        return SlurmAllocation(self.slurm_job, self.slurm.env())

    def start(self, env: Mapping[str, str]) -> AlertingStack:
        from stepwatch.alerts.config import Receivers, alertmanager_config, rule_files
        from stepwatch.daemons.alertmanager import Alertmanager
        from stepwatch.daemons.prometheus import Prometheus

        token_file = (self.workdir / "remediator.token").resolve()  # daemons resolve paths oddly
        token_file.write_text(self._token)
        token_file.chmod(0o600)
        port, prometheus_port = free_port(), free_port()
        self.remediator_url = f"http://127.0.0.1:{port}"
        self._start_remediator(port, token_file, env, f"http://127.0.0.1:{prometheus_port}")
        self.pager = Pager(self._token).start()
        store = self._start_alert_receiver(token_file, env)
        receivers = Receivers(
            remediator_url=f"{self.remediator_url}/webhook",
            token_file=str(token_file),
            pager_url=f"{self.pager.url}/page",
            tickets_url=f"{self.pager.url}/ticket",
            **store,
        )
        config = with_bearer(alertmanager_config(receivers, fast=True), token_file)
        self.alertmanager = Alertmanager(self.workdir / "alertmanager", config=config)
        self.alertmanager.start()
        jobs = {**self.scrape, "stepwatch-remediator": [f"127.0.0.1:{port}"]}
        self.prometheus = Prometheus(
            self.workdir / "prometheus",
            rule_files=rule_files(),
            alertmanagers=[self.alertmanager.address],
            scrape_jobs=jobs,
            port=prometheus_port,
        ).start()
        return self

    def _start_remediator(
        self, port: int, token_file: Path, env: Mapping[str, str], prometheus: str
    ) -> None:
        if self.slurm is not None:
            mode, actuator = "execute", f'{{kind: slurm, slurm_conf: "{self.slurm.conf_path}"}}'
        else:
            mode, actuator = "observe", f"{{kind: log, nodes: {self.nodes}}}"
        policy = self.workdir / "remediator-policy.yaml"
        text = POLICY.format(mode=mode, actuator=actuator)
        if outcomes_supported():
            text += OUTCOME.format(prometheus=prometheus)
        policy.write_text(text)
        operators = (self.workdir / "remediator.operators").resolve()
        operators.write_text(f"demo:{self._operator_token}\n")
        operators.chmod(0o600)
        self.remediator = Child(
            "remediator",
            [
                sys.executable,
                "-m",
                "stepwatch.cli",
                "remediate",
                "serve",
                "--policy",
                str(policy),
                "--port",
                str(port),
                "--state-dir",
                str(self.workdir / "remediator"),
                "--token-file",
                str(token_file),
                "--operators-file",
                str(operators),
                "--bootstrap-servers",
                self.bootstrap,
                "--topic-prefix",
                self.topic_prefix,
            ],
            self.workdir / "remediator.log",
        )
        self.remediator.start(dict(env))

    def _start_alert_receiver(self, token_file: Path, env: Mapping[str, str]) -> dict[str, str]:
        """The store's Alertmanager receiver, where this build has one: Receivers' store_url."""
        from stepwatch.alerts.config import Receivers
        from stepwatch.demo.services import available

        if not available("stepwatch.alerts.receiver") or "store_url" not in {
            f.name for f in dataclasses.fields(Receivers)
        }:
            return {}
        port = free_port()
        self.alert_receiver = Child(
            "alerts-receiver",
            [
                sys.executable,
                "-m",
                "stepwatch.cli",
                "alerts",
                "receive",
                "--bootstrap-servers",
                self.bootstrap,
                "--port",
                str(port),
                "--token-file",
                str(token_file),
            ],
            self.workdir / "alerts-receiver.log",
        )
        self.alert_receiver.start(dict(env))
        return {"store_url": f"http://127.0.0.1:{port}/alerts"}

    def stop(self) -> None:
        if self.pager is not None:
            self.pager.stop()
        if self.alert_receiver is not None:
            self.alert_receiver.stop()
        for part in (self.prometheus, self.alertmanager):
            if part is not None:
                try:
                    part.stop()
                except StepwatchError as err:
                    log.warning("demo: stop failed err=%s", err)
        if self.remediator is not None:
            self.remediator.stop()
        if self.slurm is not None:
            self.slurm.stop()

    # ------------------------------------------------------------------ what to show
    def view(self) -> AlertView:
        firing: tuple[str, ...] = ()
        decisions: tuple[str, ...] = ()
        actions: list[dict[str, Any]] = []
        outcomes: list[dict[str, Any]] = []
        breaker = False
        try:
            if self.prometheus is not None:
                firing = tuple(_alert_line(a) for a in self.prometheus.firing())
            actions = sorted(self._actions(), key=lambda a: float(a.get("created") or 0))
            newest_first = sorted(actions, key=lambda a: float(a.get("updated") or 0), reverse=True)
            decisions = tuple(_decision_line(a) for a in reversed(newest_first[:8]))
            breaker = bool(self._call("breaker").get("open", False))
            outcomes = self._outcomes()
        except (StepwatchError, OSError, ValueError, AttributeError) as err:
            log.debug("demo: alerting view unavailable err=%s", err)
        notes = tuple(self.pager.notifications()) if self.pager is not None else ()
        return AlertView(
            firing=firing,
            decisions=decisions,
            breaker_open=breaker,
            actions=tuple(actions),
            notifications=notes,
            outcomes=tuple(outcomes),
        )

    def slurm_nodes(self) -> dict[str, str]:
        return self.slurm.node_states() if self.slurm is not None else {}

    def _actions(self) -> list[dict[str, Any]]:
        result = self._call("actions")
        items = result.get("actions", result) if isinstance(result, dict) else result
        return [a for a in items if isinstance(a, dict)]

    def _outcomes(self) -> list[dict[str, Any]]:
        if not outcomes_supported():
            return []
        result = self._call("outcomes")
        items = result.get("outcomes", []) if isinstance(result, dict) else []
        return [o for o in items if isinstance(o, dict)]

    def _call(self, what: str) -> Any:
        if self._client is None:
            from stepwatch.alerts.remediate.client import Client

            self._client = Client(self.remediator_url, self._operator_token, timeout=2.0)
        return getattr(self._client, what)()


def outcomes_supported() -> bool:
    """Whether this build's remediator tracks outcomes (recovered / not_recovered)."""
    from stepwatch.alerts.remediate.client import Client

    return hasattr(Client, "outcomes")


def with_bearer(config: str, token_file: Path) -> str:
    """``config`` with every webhook authenticated by the bearer token in ``token_file``."""
    import yaml

    cfg = yaml.safe_load(config)
    for receiver in cfg.get("receivers", []):
        for hook in receiver.get("webhook_configs", []):
            hook.setdefault("http_config", {})["authorization"] = {
                "type": "Bearer",
                "credentials_file": str(token_file),
            }
    return str(yaml.safe_dump(cfg, sort_keys=False))


def _alert_line(alert: Any) -> str:
    labels = alert.labels
    where = " ".join(
        f"{k}={labels[k]}" for k in ("job_id", "host", "rank", "cause") if labels.get(k)
    )
    return f"{alert.name} [{labels.get('severity', '')}] {where}".strip()


def _decision_line(action: Mapping[str, Any]) -> str:
    """``12:00:01 drain node02 (job 1): done - stepwatch: StragglerPersistent ...``"""
    when = action.get("updated") or action.get("created") or time.time()
    try:
        stamp = time.strftime("%H:%M:%S", time.localtime(float(when)))
    except (TypeError, ValueError):
        stamp = str(when)
    kind = action.get("kind") or action.get("action") or "?"
    target = action.get("node") or ""
    job = f" (job {action['job_id']})" if action.get("job_id") else ""
    reason = action.get("reason") or action.get("detail") or ""
    outcome = f" -> {action['outcome']}" if action.get("outcome") else ""
    return f"{stamp} {kind} {target}{job}: {action.get('status', '?')}{outcome} - {reason}".strip()

"""Fault-to-action latency of the remediation path, split by stage.

Measured on real daemons (loopback): an alert posted to a real Alertmanager
(the shipped routing with the remediator route's group_wait set by --group-wait)
-> the remediator (execute mode) -> ``scontrol`` on a real 4-node Slurm cluster.
For each of --repeat alerts (a new node/job each time, the cluster reset between):

  grouping   Alertmanager: alert posted -> webhook received by the remediator
  decision   the remediator: webhook received -> actuator called (policy, guardrails, state)
  actuator   scontrol drain + requeue (hold, exclude, release)

The two stages before Alertmanager are configured, not measured here (they
are waits, not work): detection (the stream core's k-of-n persistence, see
docs/detection.md; --detect-s) and rule evaluation (the rule's ``for:`` plus
up to one evaluation interval; read from alerts/src/stepwatch/alerts/rules/jobs.yml). They are
printed from their settings so the total is the budget a deployment sees.

Run: ``python bench/bench_remediate.py`` (root, Slurm + munge + Alertmanager installed;
about 30 s). Knob that trades speed for false actions: the rule's ``for:``
(and the core's persistence): shorter acts sooner on blips that would have cleared.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from stepwatch.alerts.config import RULES_DIR, Receivers, alertmanager_config
from stepwatch.alerts.remediate.actuators.slurm import SlurmActuator
from stepwatch.alerts.remediate.model import Alert, Decision
from stepwatch.alerts.remediate.service import build
from stepwatch.daemons.alertmanager import Alertmanager
from stepwatch.daemons.process import free_port
from stepwatch.daemons.prometheus import wait_for
from stepwatch.daemons.slurm import SlurmCluster
from stepwatch.settings import Settings

POLICY = """mode: execute
cluster_nodes: 1000  # the bench resumes nodes between runs: keep the breaker out of the way
rules: [{match: {alertname: StragglerPersistent}, actions: [drain, requeue]}]
guardrails: {breaker: {max_share: 1.0}, rate_limit: {actions: 1000}, cooldown: {node: 0, job: 0},
             repeat_offender: {count: 1000}, attempts: {per_node: 1000}}
actuator: {kind: slurm, slurm_conf: "%s"}
"""


class Timed:
    """Wraps the Slurm actuator: when each drain/requeue started and how long it took."""

    def __init__(self, inner: SlurmActuator) -> None:
        self.inner, self.name = inner, inner.name
        self.calls: list[tuple[str, float, float]] = []

    def node_state(self, node: str) -> Any:
        return self.inner.node_state(node)

    def node_count(self) -> int:
        return self.inner.node_count()

    def job_owner(self, job_id: str) -> str:
        return self.inner.job_owner(job_id)

    def drain(self, node: str, reason: str) -> str:
        return self._timed("drain", self.inner.drain, node, reason)

    def requeue(self, job_id: str, exclude_node: str) -> str:
        return self._timed("requeue", self.inner.requeue, job_id, exclude_node)

    def _timed(self, what: str, fn: Any, *args: str) -> str:
        start = time.time()
        out = str(fn(*args))
        self.calls.append((what, start, time.time() - start))
        return out


def rule_for_seconds(name: str) -> float:
    for path in RULES_DIR.glob("*.yml"):
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                if rule.get("alert") == name:
                    text = str(rule.get("for", "0s"))
                    return float(text[:-1]) * {"s": 1, "m": 60, "h": 3600}[text[-1]]
    return 0.0


def remediator_and_alertmanager(
    settings: Settings, work: Path, actuator: Any, group_wait: str, received: list[float]
) -> tuple[Any, Alertmanager]:
    """The remediator (its webhook arrivals stamped into ``received``) and a started
    Alertmanager with the shipped routing pointed at it, every group_wait set."""
    svc = build(settings, port=0, actuator=actuator, writers=[])
    handle = svc.server.remediator.handle

    def stamped(alerts: list[Alert]) -> list[Decision]:
        received.append(time.time())
        return handle(alerts)

    svc.server.remediator.handle = stamped  # type: ignore[method-assign]
    cfg = yaml.safe_load(
        alertmanager_config(
            Receivers(
                svc.url + "/webhook",
                str(work / "token"),
                "http://127.0.0.1:9/p",
                "http://127.0.0.1:9/t",
            ),
            fast=True,
        )
    )
    for route in cfg["route"]["routes"]:
        route["group_wait"] = group_wait
    am = Alertmanager(workdir=work / "am", config=yaml.safe_dump(cfg), port=free_port()).start()
    return svc, am


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument(
        "--group-wait", default="1s", help="the remediator route's group_wait (shipped: 5s)"
    )
    ap.add_argument(
        "--eval-interval", type=float, default=15.0, help="Prometheus evaluation interval"
    )
    ap.add_argument(
        "--detect-s",
        type=float,
        default=20.0,
        help="detection: measured by bench_remediate_full.py (about 20 s at 1 step/s)",
    )
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-remediate-"))
    received: list[float] = []
    with SlurmCluster(work / "slurm", nodes=4) as slurm:
        (work / "policy.yaml").write_text(POLICY % slurm.conf_path)
        (work / "token").write_text("bench-token")
        timed = Timed(SlurmActuator(conf=str(slurm.conf_path)))
        settings = Settings.load(
            env={},
            remediate_policy=str(work / "policy.yaml"),
            remediate_token_file=str(work / "token"),
            remediate_state_dir=str(work / "state"),
        )
        svc, am = remediator_and_alertmanager(settings, work, timed, args.group_wait, received)
        rows: list[tuple[float, float, float]] = []
        try:
            for i in range(args.repeat):
                node = f"node{i % 4 + 1:02d}"
                job = slurm.sbatch(
                    "-N", "1", "-w", node, "--requeue", "-o", "/dev/null", "--wrap", "sleep 600"
                )

                def running(j: str = job) -> bool:
                    return "JobState=RUNNING" in slurm.scontrol("show", "job", j, "-o")

                wait_for(running, 30, what="job")
                n_calls, n_recv = len(timed.calls), len(received)
                posted = time.time()
                am.post_alerts(
                    [
                        {
                            "labels": {
                                "alertname": "StragglerPersistent",
                                "host": node,
                                "job_id": job,
                                "cause": "gpu",
                                "class": "system",
                                "remediation": "drain",
                                "severity": "page",
                                "run": str(i),
                            }
                        }
                    ]
                )

                def drained(n: int = n_calls) -> bool:
                    return len(timed.calls) >= n + 2

                wait_for(drained, 60, what="drain + requeue")
                got = received[n_recv]
                first, last = timed.calls[n_calls], timed.calls[n_calls + 1]
                rows.append((got - posted, first[1] - got, last[1] + last[2] - first[1]))
                slurm.cancel_jobs()
                slurm.scontrol("update", f"nodename={node}", "state=resume")
        finally:
            am.stop()
            svc.stop()
    med = [statistics.median(c) for c in zip(*rows, strict=True)]
    detect, rule = args.detect_s, rule_for_seconds("StragglerPersistent") + args.eval_interval
    total = detect + rule + sum(med)
    print(f"fault-to-action, median of {len(rows)} (real Alertmanager, remediator, 4-node Slurm):")
    print(f"  detection       {detect:7.2f} s  configured (core persistence, --detect-s)")
    print(
        f"  rule evaluation {rule:7.2f} s  configured "
        f"(for: {rule - args.eval_interval:.0f} s + one "
        f"evaluation interval {args.eval_interval:.0f} s, worst case)"
    )
    print(f"  AM grouping     {med[0]:7.3f} s  measured (group_wait {args.group_wait})")
    print(f"  decision        {med[1]:7.3f} s  measured")
    print(f"  actuator        {med[2]:7.3f} s  measured (scontrol drain + requeue)")
    print(f"  total           {total:7.2f} s  (goal < 60 s)")
    return 0 if total < 60 else 1


if __name__ == "__main__":
    sys.exit(main())

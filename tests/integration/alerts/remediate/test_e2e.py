"""End to end on real daemons: a simulated fleet feeding two jobs that run on a real Slurm
cluster (sim hosts = Slurm node names, job ids = Slurm job ids) -> Kafka -> a stream worker
-> real Prometheus (shipped rules, scrape and evaluation 1 s) -> real Alertmanager (shipped
routing, 1 s waits) -> the remediator in execute mode -> scontrol.

Scenario 1: a slow GPU on node02 -> node02 drained with stepwatch's reason, the job requeued
excluding it, an audit record, nothing done to the other nodes. Scenario 2: a NaN loss
(user error) -> the owner is notified, no drain. The breaker scenario (many nodes at once)
is in test_remediation_slurm.py, with the alerts posted to Alertmanager directly.
"""

from __future__ import annotations

import time

import pytest

from stepwatch.alerts.config import Receivers, alertmanager_config, rule_files
from stepwatch.alerts.remediate.actuators.slurm import SlurmActuator
from stepwatch.alerts.remediate.service import build
from stepwatch.contract import EventMessage, EventType
from stepwatch.daemons.process import free_port
from stepwatch.daemons.prometheus import wait_for
from stepwatch.daemons.slurm import missing_binaries
from stepwatch.kafka import ensure_topics
from stepwatch.sim import Fault, FaultKind, Scenario, simulate
from tests.support.alert_support import WebhookReceiver
from tests.support.remediation_support import POLICY, TOKEN, audit_records
from tests.support.stream_support import StreamWorker, publish

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        bool(missing_binaries()), reason=f"Slurm/munge binaries absent: {missing_binaries()}"
    ),
]


def fleet(slow_job: str, nan_job: str) -> list:
    now = time.time()
    slow = Scenario(
        seed=4,
        job_id=slow_job,
        nodes=2,
        steps=60,
        start_ts=now - 80,
        hosts=("node01", "node02"),
        faults=(Fault(FaultKind.SLOW_GPU, rank=11, start_step=15, severity=0.3),),
    )
    nan = Scenario(
        seed=3,
        job_id=nan_job,
        nodes=2,
        steps=40,
        start_ts=now - 60,
        hosts=("node03", "node04"),
        faults=(Fault(FaultKind.NAN_LOSS, start_step=25),),
    )
    return [
        m
        for m in simulate(slow, nan)
        if not (isinstance(m, EventMessage) and m.type == EventType.JOB_END)
    ]


def running(slurm, job: str) -> bool:
    return "JobState=RUNNING" in slurm.scontrol("show", "job", job, "-o")


@pytest.mark.timeout(240)
def test_fleet_to_slurm_straggler_drained_and_requeued_user_error_notified(
    tmp_path, slurm, settings, prometheus_factory, alertmanager_factory
):
    slow_job = slurm.sbatch(
        "-N", "2", "-w", "node[01-02]", "--requeue", "-o", "/dev/null", "--wrap", "sleep 600"
    )
    nan_job = slurm.sbatch(
        "-N", "2", "-w", "node[03-04]", "--requeue", "-o", "/dev/null", "--wrap", "sleep 600"
    )
    wait_for(lambda: running(slurm, slow_job) and running(slurm, nan_job), 30, what="jobs running")
    ensure_topics(settings)
    token = tmp_path / "token"
    token.write_text(TOKEN)
    worker = StreamWorker(settings, tmp_path, "w").start()
    try:
        with WebhookReceiver() as hooks:
            policy = tmp_path / "policy.yaml"
            prom_port = free_port()  # the remediator asks it whether an alert fires
            policy.write_text(
                POLICY.format(
                    conf=slurm.conf_path, notify=hooks.url("/owner"), page=hooks.url("/page")
                )
                + f'outcome: {{prometheus_url: "http://127.0.0.1:{prom_port}"}}\n'
            )
            svc = build(
                settings.replace(
                    remediate_policy=str(policy),
                    remediate_token_file=str(token),
                    remediate_state_dir=str(tmp_path / "state"),
                ),
                port=0,
            )
            try:
                am = alertmanager_factory(
                    alertmanager_config(
                        Receivers(
                            svc.url + "/webhook",
                            str(token),
                            hooks.url("/oncall"),
                            hooks.url("/ticket"),
                        ),
                        fast=True,
                    )
                )
                prom = prometheus_factory(
                    targets=[f"127.0.0.1:{worker.port}"],
                    rule_files=rule_files(),
                    alertmanagers=[am.address],
                    job_name="stepwatch-stream",
                    port=prom_port,
                )
                injected = time.monotonic()
                publish(settings, fleet(slow_job, nan_job))
                wait_for(
                    lambda: slurm.node_states().get("node02", "").startswith("drain"),
                    150,
                    what="node02 drained",
                )
                to_drain = time.monotonic() - injected
                reason = SlurmActuator(conf=str(slurm.conf_path)).node_state("node02").reason
                assert reason.startswith(f"stepwatch: StragglerPersistent cause gpu job {slow_job}")
                fired = prom.firing("StragglerPersistent")
                assert {(a.labels["host"], a.labels["job_id"]) for a in fired} == {
                    ("node02", slow_job)
                }
                show = wait_for(
                    lambda: (
                        (s := slurm.scontrol("show", "job", slow_job, "-o"))
                        and "Restarts=1" in s
                        and s
                    ),
                    30,
                    what="requeue",
                )
                assert "ExcNodeList=node02" in show
                note = wait_for(lambda: hooks.received("/owner"), 60, what="owner notified")[0]
                assert note.body["alertname"] == "JobUserError" and note.body["job_id"] == nan_job
                assert note.body["to"] == "root"  # the Slurm job's owner (the test runs as root)
                time.sleep(2)
                states = slurm.node_states()
                assert [n for n, s in states.items() if s.startswith("drain")] == ["node02"], states
                assert "Restarts=0" in slurm.scontrol("show", "job", nan_job, "-o")
                records = audit_records(settings, 3)
                got = {(r["action"], r["host"], r["outcome"]) for r in records}
                assert {("drain", "node02", "acted"), ("requeue", "node02", "acted")} <= got
                assert any(r["action"] == "notify" and r["job_id"] == nan_job for r in records)
                print(
                    "\nfault injected (fleet published) -> Slurm drain of node02: "
                    f"{to_drain:.1f} s "
                    "(scrape 1 s, evaluation 1 s, for: 30 s, group_wait 1 s)"
                )
            finally:
                svc.stop()
    finally:
        assert worker.stop() == 0, worker.log[-3000:]

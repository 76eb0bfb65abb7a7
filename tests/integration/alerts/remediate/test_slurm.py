"""Real Alertmanager (shipped routing, 1 s waits) -> the remediator in execute mode -> a real
Slurm cluster (slurmctld + 4 slurmd on this host), audit records on a real Kafka topic.

Alerts are posted to Alertmanager as Prometheus posts them; the rules that produce them
from the stream worker's metrics are tested in test_alerting.py and the alerts' promtool tests.
"""

from __future__ import annotations

import getpass
import time

import pytest

from stepwatch.alerts.config import Receivers, alertmanager_config
from stepwatch.alerts.remediate.actuators.slurm import SlurmActuator
from stepwatch.alerts.remediate.client import Client
from stepwatch.alerts.remediate.service import build
from stepwatch.daemons.prometheus import wait_for
from stepwatch.daemons.slurm import missing_binaries
from tests.support.alert_support import WebhookReceiver
from tests.support.remediation_support import POLICY, TOKEN, audit_records

OPERATOR_TOKEN = "integration-operator-token"

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        bool(missing_binaries()), reason=f"Slurm/munge binaries absent: {missing_binaries()}"
    ),
]


def straggler(host: str, job: str = "") -> dict:
    labels = {
        "alertname": "StragglerPersistent",
        "host": host,
        "job_id": job,
        "rank": "3",
        "cause": "gpu",
        "fault": "system",
        "class": "system",
        "remediation": "drain",
        "severity": "critical",
        "scope": "rank",
    }
    return {
        "labels": {k: v for k, v in labels.items() if v},
        "annotations": {"summary": f"straggler on {host}"},
    }


def xid(host: str) -> dict:
    """A node-scoped fatal XID alert: it names no job, only a ``scope: node`` rule drains."""
    labels = {
        "alertname": "GpuXidFatal",
        "host": host,
        "xid": "79",
        "class": "system",
        "remediation": "drain",
        "severity": "critical",
        "scope": "node",
    }
    return {"labels": labels, "annotations": {"summary": f"XID 79 on {host}"}}


NODE_RULE = """rules:
  - match: {alertname: GpuXidFatal, class: system}
    actions: [drain]
    scope: node
"""


def test_alertmanager_to_slurm_drain_requeue_notify_and_breaker(
    tmp_path, slurm, settings, alertmanager_factory
):
    job = slurm.sbatch("-N", "3", "--requeue", "-o", "/dev/null", "--wrap", "sleep 600")
    wait_for(
        lambda: "JobState=RUNNING" in slurm.scontrol("show", "job", job, "-o"),
        30,
        what="job running",
    )
    fields = slurm.scontrol("show", "job", job, "-o")
    nodes = SlurmActuator(conf=str(slurm.conf_path))
    assert nodes.node_count() == 4
    token = tmp_path / "token"
    token.write_text(TOKEN)
    operators = tmp_path / "operators"
    operators.write_text(f"oncall:{OPERATOR_TOKEN}\n")
    with WebhookReceiver() as hooks:
        policy = tmp_path / "policy.yaml"
        policy.write_text(
            POLICY.format(
                conf=slurm.conf_path, notify=hooks.url("/owner"), page=hooks.url("/page")
            ).replace("rules:\n", NODE_RULE, 1)
        )
        svc = build(
            settings.replace(
                remediate_policy=str(policy),
                remediate_token_file=str(token),
                remediate_operators_file=str(operators),
                remediate_state_dir=str(tmp_path / "state"),
            ),
            port=0,
        )
        try:
            am = alertmanager_factory(
                alertmanager_config(
                    Receivers(
                        svc.url + "/webhook", str(token), hooks.url("/oncall"), hooks.url("/ticket")
                    ),
                    fast=True,
                )
            )
            # 1. a straggler on node02 (one of the job's nodes): drained, job requeued without it
            assert "NodeList=node[01-03]" in fields
            fault = time.monotonic()
            am.post_alerts([straggler("node02", job)])
            wait_for(
                lambda: slurm.node_states().get("node02", "").startswith("drain"), 30, what="drain"
            )
            drained_after = time.monotonic() - fault
            reason = nodes.node_state("node02").reason
            assert reason.startswith("stepwatch: StragglerPersistent cause gpu job " + job)
            show = wait_for(
                lambda: (s := slurm.scontrol("show", "job", job, "-o")) and "Restarts=1" in s and s,
                30,
                what="requeue",
            )
            assert "ExcNodeList=node02" in show
            assert {n: s for n, s in slurm.node_states().items() if n != "node02"} == {
                n: s
                for n, s in slurm.node_states().items()
                if n != "node02" and not s.startswith("drain")
            }
            print(f"\nfault alert to Slurm drain: {drained_after:.2f} s (group_wait 1 s)")
            # 2. a user error: the owner is told, nothing drained
            am.post_alerts(
                [
                    {
                        "labels": {
                            "alertname": "JobUserError",
                            "job_id": job,
                            "host": "node01",
                            "cause": "nan_loss",
                            "class": "user",
                            "remediation": "notify",
                            "severity": "warning",
                            "owner": "mallory",  # the sender's word: Slurm's owner wins
                        }
                    }
                ]
            )
            note = wait_for(
                lambda: [d for d in hooks.received("/owner")], 30, what="owner notified"
            )[0]
            assert note.body["to"] == getpass.getuser()  # who submitted the job
            assert note.body["alertname"] == "JobUserError"
            assert not slurm.node_states()["node01"].startswith("drain")
            # 3. node faults on three more nodes at once: the cap is 2 of 4 nodes, node02 is
            # one (no job named: only the scope: node rule's drain may go ahead)
            am.post_alerts([xid(n) for n in ("node01", "node03", "node04")])
            api = Client(svc.url, OPERATOR_TOKEN)
            wait_for(lambda: api.breaker()["open"], 30, what="breaker open")
            wait_for(lambda: hooks.received("/page"), 30, what="the page")
            time.sleep(3)  # let every group arrive; nothing more may be drained
            drained = sorted(n for n, s in slurm.node_states().items() if s.startswith("drain"))
            assert len(drained) == 2 and "node02" in drained
            records = audit_records(settings, 6)  # 2 + 1 + 3 drain-only alerts
            outcomes = {(r["action"], r["host"], r["outcome"]) for r in records}
            assert ("drain", "node02", "acted") in outcomes and (
                "requeue",
                "node02",
                "acted",
            ) in outcomes
            assert ("notify", "node01", "acted") in outcomes
            assert any(r["reason"] == "breaker_tripped" for r in records)
            assert api.close_breaker()["was_open"] is True
        finally:
            svc.stop()


def test_a_requeue_keeps_the_jobs_own_exclusions_as_slurm_prints_them(slurm) -> None:
    """A job started with ``-x node01,node03``: squeue prints ``node[01,03]``. Before, the
    list was split on commas (``node[01`` and ``03]``), the update was refused as an
    invalid node name, and the job was requeued without the new exclusion."""
    job = slurm.sbatch("-N", "1", "-x", "node01,node03", "--requeue", "-o", "/dev/null",
                       "--wrap", "sleep 600")  # fmt: skip
    actuator = SlurmActuator(conf=str(slurm.conf_path))
    assert wait_for(lambda: actuator.job_nodes(job) == {"node02"} or None, 60), slurm.log_tail()
    detail = actuator.requeue(job, "node02")
    assert detail.endswith("excluding node01,node02,node03"), detail
    shown = slurm.scontrol("show", "job", job, "-o")
    excluded = shown.split("ExcNodeList=", 1)[1].split(" ", 1)[0]
    assert slurm.scontrol("show", "hostnames", excluded).split() == ["node01", "node02", "node03"]
    assert "Restarts=1" in shown, shown  # requeued
    assert "Reason=JobHeldUser" not in shown and "Priority=0 " not in shown, shown  # released


def test_an_alert_from_an_arrays_last_task_requeues_that_task_alone(slurm) -> None:
    """Slurm gives an array's last task the array's id as its SLURM_JOB_ID, and ``squeue
    --jobs=<id>`` lists every task. Before, the check that the node runs the job took every
    task's nodes, and requeuehold/update/release acted on the whole array: healthy tasks on
    other nodes were restarted (red team)."""
    array = slurm.sbatch("--array=0-3", "--requeue", "-o", "/dev/null", "--wrap", "sleep 600")
    actuator = SlurmActuator(conf=str(slurm.conf_path))

    def tasks() -> dict[str, str]:  # task id -> its job record
        out = slurm.scontrol("show", "job", array, "-o")
        return {
            line.split("ArrayTaskId=", 1)[1].split()[0]: line
            for line in out.splitlines()
            if "ArrayTaskId=" in line
        }

    def running() -> dict[str, str] | None:
        got = tasks()
        ok = len(got) == 4 and all("JobState=RUNNING" in t for t in got.values())
        return got if ok else None

    assert wait_for(running, 60), slurm.log_tail()
    last = tasks()["3"]
    assert f"JobId={array} " in last, last  # the last task holds the array's id
    node = last.split(" NodeList=", 1)[1].split()[0]
    assert actuator.job_nodes(array) == {node}
    detail = actuator.requeue(array, node)
    assert detail.startswith(f"job {array}_3 requeued"), detail
    after = tasks()
    assert "Restarts=1" in after["3"], after["3"]
    assert all("Restarts=0" in after[t] for t in ("0", "1", "2")), after


def test_a_finished_job_runs_on_no_node_and_a_held_one_stays_held(slurm) -> None:
    """squeue lists a finished job with its old nodes for a while: a stale alert drained
    the node it had left. A pending job its owner held was released by the requeue."""
    actuator = SlurmActuator(conf=str(slurm.conf_path))
    done = slurm.sbatch("-N", "1", "-o", "/dev/null", "--wrap", "true")
    assert wait_for(
        lambda: "JobState=COMPLETED" in slurm.scontrol("show", "job", done, "-o") or None, 60
    ), slurm.log_tail()
    assert actuator.job_nodes(done) == frozenset()
    held = slurm.sbatch("-H", "-N", "1", "--requeue", "-o", "/dev/null", "--wrap", "sleep 600")
    detail = actuator.requeue(held, "node02")
    shown = slurm.scontrol("show", "job", held, "-o")
    assert "Reason=JobHeldUser" in shown, (detail, shown)  # the owner's hold stays
    excluded = shown.split("ExcNodeList=", 1)[1].split(" ", 1)[0]
    assert "node02" in slurm.scontrol("show", "hostnames", excluded).split()


def test_a_requeue_cut_off_after_the_hold_is_released_at_the_next_start(slurm) -> None:
    """The remediator killed between ``requeuehold`` and ``release`` left the job held for
    good. ``release_interrupted`` (called for each action still ``started`` at start-up)
    adds the exclusion and releases a job an administrator held; its owner's hold stays."""
    actuator = SlurmActuator(conf=str(slurm.conf_path))
    job = slurm.sbatch("-N", "1", "--requeue", "-o", "/dev/null", "--wrap", "sleep 600")
    assert wait_for(lambda: actuator.job_nodes(job) or None, 60), slurm.log_tail()
    (node,) = actuator.job_nodes(job)
    slurm.scontrol("requeuehold", job)  # where the killed remediator stopped
    assert wait_for(
        lambda: "JobState=PENDING" in slurm.scontrol("show", "job", job, "-o") or None, 30
    ), slurm.log_tail()
    detail = actuator.release_interrupted(job, node)
    shown = slurm.scontrol("show", "job", job, "-o")
    assert detail.startswith(f"job {job} released excluding"), detail
    assert "JobHeldAdmin" not in shown and "Priority=0 " not in shown, shown
    assert node in slurm.scontrol("show", "hostnames", shown.split("ExcNodeList=")[1].split()[0])
    owned = slurm.sbatch("-H", "-N", "1", "-o", "/dev/null", "--wrap", "sleep 600")
    slurm.scontrol("uhold", owned)
    assert "left as is" in actuator.release_interrupted(owned, "node01")
    assert "Reason=JobHeldUser" in slurm.scontrol("show", "job", owned, "-o")


def test_a_node_a_person_set_down_or_failed_is_theirs_not_ours(slurm) -> None:
    """Before, only DRAIN counted as out of service: an XID alert for a node a person had
    set DOWN ("bob: GPU RMA") drained it, wrote stepwatch's reason over theirs, and the
    drain took the breaker's one slot, so the next real alert opened the breaker."""
    from stepwatch.alerts.remediate import guards

    actuator = SlurmActuator(conf=str(slurm.conf_path))
    told = {"node01": ("down", "bob: GPU4 RMA, do not touch"), "node02": ("fail", "alice: DIMM")}
    for node, (state, reason) in told.items():
        slurm.scontrol("update", f"nodename={node}", f"state={state}", f"reason={reason}")
    for node, (_, reason) in told.items():
        seen = actuator.node_state(node)
        assert seen.drained and not seen.drained_by_stepwatch and seen.reason == reason
        verdict = guards.node_checks(seen)
        assert verdict.skip == "drained_by_person" and verdict.detail == reason
    free = actuator.node_state("node03")
    assert not free.drained and guards.node_checks(free).skip is None

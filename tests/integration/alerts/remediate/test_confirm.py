"""A drain or requeue needs Prometheus's word that the alert fires (``guardrails.confirm_firing``).

A real Prometheus evaluates one rule that fires ``StragglerPersistent`` for gpu-001 of
job 43; the real remediator service (HTTP, bearer token, the Slurm actuator calling the
recording fake ``scontrol``) gets webhooks as Alertmanager sends them. An alert for
another node of the same job, or a node-hardware alert Prometheus never fired (the
scope-node drain needs no job), is what anyone who can post to Alertmanager's open API
or holds the webhook token could send: before, each drained its node.
"""

from __future__ import annotations

import os

import pytest
import yaml

from stepwatch.daemons.prometheus import wait_for
from tests.support.fake_slurm import FakeSlurm, install
from tests.support.remediator_http import alert, send, start

pytestmark = pytest.mark.integration
REAL = alert("gpu-001", "43")
# a straggler the shipped rule calls the job's own (fault=user: notify its owner, no drain)
USER_FAULT = alert("gpu-003", "43", fault="user", **{"class": "user", "remediation": "notify"})
OPTED_OUT = alert("gpu-004", "43", stepwatch_opt_out="true")  # a node opted out by its label


@pytest.fixture()
def fake(tmp_path, monkeypatch) -> FakeSlurm:
    slurm = install(
        tmp_path / "bin", [f"gpu-{i:03d}" for i in range(1, 11)], {"43": "gpu-[001-004]"}
    )
    monkeypatch.setenv("PATH", f"{slurm.folder}:{os.environ['PATH']}")
    return slurm


@pytest.fixture()
def prometheus(tmp_path, prometheus_factory):
    rules = tmp_path / "rules.yml"
    fired = [REAL, USER_FAULT, OPTED_OUT]
    rule = [
        {
            "alert": a["labels"]["alertname"],
            "expr": "vector(1)",
            "labels": {k: v for k, v in a["labels"].items() if k != "alertname"},
        }
        for a in fired
    ]
    rules.write_text(yaml.safe_dump({"groups": [{"name": "t", "rules": rule}]}))
    prom = prometheus_factory(rule_files=[rules])
    # ALERTS, what the remediator asks, lags the rule's state by two evaluations after
    # Prometheus starts (a later alert is in ALERTS as it fires)
    wait_for(
        lambda: len(prom.query('ALERTS{alertstate="firing"}')) == 3, 30, what="the alerts firing"
    )
    return prom


def _reasons(decisions: list[dict]) -> set[tuple[str, str]]:
    return {(d["outcome"], d["reason"]) for d in decisions}


def test_only_an_alert_prometheus_fires_drains_its_node(tmp_path, fake, prometheus):
    svc = start(tmp_path, outcome={"prometheus_url": prometheus.url})
    try:
        other_node = alert("gpu-002", "43")  # a node of the same job Prometheus fires nothing for
        hardware = alert("gpu-003", job="", name="GpuXidFatal", scope="node")  # no job check
        refused = send(svc, [other_node, hardware])
        assert _reasons(refused) == {("skipped", "not_firing")}, refused
        assert fake.calls() == []  # refused before the scheduler is asked anything
        acted = send(svc, [REAL])
        assert _reasons(acted) == {("acted", "executed")}, acted
        assert list(fake.drained()) == ["gpu-001"] and fake.requeued() == ["43"]
        # a refusal is not remembered: the same alert is judged again (and again refused)
        assert _reasons(send(svc, [other_node])) == {("skipped", "not_firing")}
        assert list(fake.drained()) == ["gpu-001"]
    finally:
        svc.stop()


def test_a_real_alert_resent_with_other_deciding_labels_drains_nothing(tmp_path, fake, prometheus):
    """Prometheus fires these alerts, but not with these labels: the user fault re-sent
    as a system fault with remediation=drain, the opted-out node's alert without its
    opt-out label. Before, only the name, host and job were compared, and both drained."""
    svc = start(tmp_path, outcome={"prometheus_url": prometheus.url})
    try:
        upgraded = alert("gpu-003", "43")  # class=system, remediation=drain, fault=system
        opted_in = alert("gpu-004", "43")
        refused = send(svc, [upgraded, opted_in])
        assert _reasons(refused) == {("skipped", "not_firing")}, refused
        details = {d["host"]: d["detail"] for d in refused}
        assert "class, remediation" in details["gpu-003"]
        assert "stepwatch_opt_out" in details["gpu-004"]
        # the alerts exactly as Prometheus fires them: the user fault only tells its
        # owner, the opted-out node is left alone
        as_fired = send(svc, [USER_FAULT, OPTED_OUT])
        assert {d["reason"] for d in as_fired} == {"executed", "opted_out"}, as_fired
        assert {d["action"] for d in as_fired if d["reason"] == "executed"} == {"notify"}
        assert fake.drained() == {} and fake.requeued() == []  # squeue asked for the owner
    finally:
        svc.stop()


def test_without_an_answer_from_prometheus_nothing_is_done(tmp_path, fake, prometheus):
    svc = start(tmp_path, outcome={"prometheus_url": prometheus.url})
    try:
        prometheus.stop()
        refused = send(svc, [REAL])
        assert _reasons(refused) == {("skipped", "firing_unconfirmed")}, refused
        assert fake.calls() == [] and fake.drained() == {}
    finally:
        svc.stop()


def test_confirm_firing_false_acts_on_the_webhook_alone(tmp_path, fake, prometheus):
    """The switch is real: with it off the same forged alert drains its node."""
    svc = start(
        tmp_path,
        outcome={"prometheus_url": prometheus.url},
        guardrails={"confirm_firing": False},
    )
    try:
        acted = send(svc, [alert("gpu-002", "43")])
        assert _reasons(acted) == {("acted", "executed")}, acted
        assert list(fake.drained()) == ["gpu-002"]
    finally:
        svc.stop()


def test_an_alert_name_cannot_rewrite_the_question(tmp_path, fake, prometheus):
    """A rule that matches on labels other than the name takes any alert name: one that
    closes the PromQL string (``X"} or vector(1) or ALERTS{alertname="``) asked
    Prometheus something that is always true, had it been pasted into the query."""
    rules = [{"match": {"class": "system", "remediation": "drain"}, "actions": ["drain"]}]
    svc = start(tmp_path, outcome={"prometheus_url": prometheus.url}, rules=rules)
    try:
        name = 'StragglerPersistent"} or vector(1) or ALERTS{alertname="'
        refused = send(svc, [alert("gpu-002", "43", name=name)])
        assert _reasons(refused) == {("skipped", "not_firing")}, refused
        assert fake.drained() == {}
    finally:
        svc.stop()

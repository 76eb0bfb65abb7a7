"""Attacks on the remediator boundary (issue 15), through its real HTTP server and bearer token.

Alertmanager-v4 bodies go to the real service; the Slurm actuator calls a
recording fake ``scontrol``/``sinfo`` on PATH that answers and expands
host lists like Slurm 22.05 (``fake_slurm``), and for holes 1 and 3 the real
local Slurm cluster too. Each test names the hole it closes; each fails on
the remediator before the fix (docs/security.md, "Boundary 3").
"""

from __future__ import annotations

import json
import os
import subprocess
import urllib.error
import urllib.request
from typing import Any

import pytest

from stepwatch.daemons.prometheus import wait_for
from stepwatch.daemons.slurm import missing_binaries
from tests.support.alert_support import WebhookReceiver
from tests.support.fake_slurm import FakeSlurm, install
from tests.support.remediator_http import (
    OPERATOR,
    OPERATOR_TOKEN,
    TOKEN,
    alert,
    get,
    post,
    send,
    start,
)

pytestmark = pytest.mark.integration
NODES = [f"gpu-{i:03d}" for i in range(1, 101)]
JOBS = {
    "43": "gpu-[001-004]",
    "44": "gpu-[005-008]",
    **{str(100 + i): f"gpu-{i:03d}" for i in range(1, 101)},
}  # job 10i runs on gpu-00i


@pytest.fixture()
def fake(tmp_path, monkeypatch) -> FakeSlurm:
    slurm = install(tmp_path / "bin", NODES, JOBS)
    monkeypatch.setenv("PATH", f"{slurm.folder}:{os.environ['PATH']}")
    return slurm


@pytest.fixture()
def service(tmp_path):
    made = []

    def make(**kwargs):
        svc = start(tmp_path, **kwargs)
        made.append(svc)
        return svc

    yield make
    for svc in made:
        svc.stop()


def xid(i: int) -> dict:
    """A node-scoped fatal XID alert (no job: drain only, by the scope: node rule) for gpu-00i."""
    return alert(f"gpu-{i:03d}", job="", name="GpuXidFatal", scope="node")


@pytest.mark.parametrize(
    "host, job",
    [
        ("gpu-[001-100]", "43"),  # a Slurm host-list expression: 100 nodes
        ("gpu-010,gpu-011", "43"),  # a comma list
        ("ALL", "43"),
        ("gpu-001", "43,44"),  # a job-id list
        ("gpu-001", "ALL"),
        ("gpu-001", "101_[1-5]"),  # an array range
        ("-h", "43"),  # an option, not a name
    ],
)
def test_hole1_a_name_slurm_would_expand_reaches_no_scheduler_command(fake, service, host, job):
    svc = service()
    decisions = send(svc, [alert(host, job)])
    assert {(d["outcome"], d["reason"]) for d in decisions} == {("skipped", "invalid_identity")}
    assert fake.calls() == []  # not even a `show node`: refused before any argv is built
    assert fake.drained() == {} and fake.requeued() == []


def test_hole2_approve_after_the_rate_limit_is_spent_is_refused(fake, service):
    svc = service(mode="recommend", guardrails={"rate_limit": {"actions": 3, "per": "1h"}})
    queued = send(svc, [xid(i) for i in range(1, 7)])
    # queued drains count when they are queued: three reserve the three slots
    assert [d["outcome"] for d in queued] == ["queued"] * 3 + ["skipped"] * 3
    assert {d["reason"] for d in queued[3:]} == {"rate_limited"}
    for d in queued:
        post(f"{svc.url}/api/approve/{d['id']}", token=OPERATOR_TOKEN)
    assert len(fake.drained()) == 3
    more = send(svc, [xid(i) for i in range(7, 10)])  # the limit is spent: nothing more queued
    assert {d["reason"] for d in more} == {"rate_limited"}
    assert len(fake.drained()) == 3


def test_hole2_approve_with_the_breaker_open_is_refused(fake, service):
    with WebhookReceiver() as hooks:
        svc = service(
            mode="recommend",
            cluster_nodes=10,
            page=hooks.url("/page"),
            guardrails={"breaker": {"max_share": 0.2, "window": "1h"}},
        )
        decisions = send(svc, [xid(1), xid(2), xid(3)])  # cap 2 of 10: the 3rd trips it
        assert [d["outcome"] for d in decisions] == ["queued", "queued", "escalated"]
        assert get(svc, "/api/breaker")["open"] and hooks.received("/page")
        for d in decisions[:2]:
            code, body = post(f"{svc.url}/api/approve/{d['id']}", token=OPERATOR_TOKEN)
            assert code == 200 and body["reason"] == "breaker_open", body
        assert fake.drained() == {}
        assert get(svc, "/api/actions?status=queued")["actions"] == []  # refused, not left queued


def test_hole2_approve_of_a_node_a_person_drained_since_is_refused(fake, service):
    svc = service(mode="recommend")
    queued = send(svc, [xid(4)])
    subprocess.run(
        [
            str(fake.folder / "scontrol"),
            "update",
            "nodename=gpu-004",
            "state=drain",
            "reason=bad fan, ticket 123",
        ],
        check=True,
    )
    code, body = post(f"{svc.url}/api/approve/{queued[0]['id']}", token=OPERATOR_TOKEN)
    assert code == 200 and body["reason"] == "drained_by_person"
    assert fake.drained() == {"gpu-004": "bad fan, ticket 123"}


def test_hole2_the_breaker_counts_nodes_not_actions(fake, service):
    svc = service(
        cluster_nodes=10,
        guardrails={
            "breaker": {"max_share": 0.2, "window": "1h"},
            "cooldown": {"node": 0, "job": 0},
        },
    )
    assert {d["outcome"] for d in send(svc, [xid(1)])} == {"acted"}
    subprocess.run(
        [str(fake.folder / "scontrol"), "update", "nodename=gpu-001", "state=resume"], check=True
    )  # a person puts it back; it fails again, another alert drains it
    assert {
        d["outcome"] for d in send(svc, [alert("gpu-001", "", name="GpuXidFatal", xid="79")])
    } == {"acted"}
    second = send(
        svc, [xid(2)]
    )  # two drains so far, but of one node: the second node is in the cap
    assert second[0]["outcome"] == "acted" and not get(svc, "/api/breaker")["open"]
    third = send(svc, [xid(3)])
    assert third[0]["reason"] == "breaker_tripped" and sorted(fake.drained()) == [
        "gpu-001",
        "gpu-002",
    ]


def test_hole3_an_alert_naming_a_node_outside_its_job_does_nothing(fake, service):
    svc = service()
    decisions = send(svc, [alert("gpu-077", "43")])  # job 43 runs on gpu-[001-004]
    assert {(d["action"], d["reason"]) for d in decisions} == {
        ("drain", "node_not_in_job"),
        ("requeue", "node_not_in_job"),
    }
    assert fake.drained() == {} and fake.requeued() == [] and fake.acting_calls() == []
    assert ["show", "hostnames", "gpu-[001-004]"] in fake.calls()  # Slurm expanded the NodeList
    ok = send(svc, [alert("gpu-002", "43")])  # a node the job does run on: acted
    assert {d["outcome"] for d in ok} == {"acted"} and list(fake.drained()) == ["gpu-002"]


def test_hole4_a_1000_alert_webhook_makes_a_bounded_number_of_scheduler_calls(fake, service):
    svc = service(guardrails={"webhook": {"max_alerts": 50}})
    storm = [alert(f"ghost-{i:04d}", job="", name="GpuXidFatal") for i in range(1000)]
    decisions = send(svc, storm)
    assert len(fake.calls()) <= 50  # at most one `show node` per admitted alert
    reasons = [d["reason"] for d in decisions]
    assert reasons.count("webhook_cap") == 950 and reasons.count("unknown_node") == 50


def test_hole4_cheap_guardrails_come_before_any_scheduler_call(fake, service):
    svc = service(guardrails={"rate_limit": {"actions": 1, "per": "1h"}})
    send(svc, [xid(1)])
    before = len(fake.calls())
    refused = send(svc, [xid(i) for i in range(2, 40)])
    assert {d["reason"] for d in refused} == {"rate_limited"}
    assert len(fake.calls()) == before  # the rate limit needed no scheduler call


def test_hole4_a_retried_webhook_is_idempotent(fake, service):
    svc = service()
    batch = [alert("gpu-077", "43"), alert("ghost-1", "43"), alert("gpu-001", "999"), xid(9)]
    first = send(svc, batch)
    calls = len(fake.calls())
    assert {d["reason"] for d in first} == {
        "node_not_in_job",
        "unknown_node",
        "job_unknown",
        "executed",
    }
    retry = send(svc, batch)  # Alertmanager retries a delivery it thinks failed
    assert {d["outcome"] for d in retry} == {"duplicate"}
    assert len(fake.calls()) == calls  # no scheduler call repeated


def test_hole4_user_alerts_get_bounded_plain_notifications(fake, service):
    for i in range(1, 101):  # job 10i: Slurm names u<i> its owner, ada for the odd ones
        fake.set_owner(str(100 + i), "ada" if i % 2 else f"u{i}")
    with WebhookReceiver() as hooks:
        svc = service(notify=hooks.url("/owner"))
        spam = []
        for i in range(200):
            a = alert(
                f"gpu-{i % 100 + 1:03d}",
                str(100 + i % 100 + 1),
                name="JobUserError",
                rank=str(i),
                **{"class": "user", "remediation": "notify"},
            )
            a["annotations"] = {
                "summary": "click http://evil.example/x \x1b[31m" + "A" * 2000,
                "description": "wire money to ..." * 60,
            }
            spam.append(a)
        decisions = send(svc, spam)
        sent = hooks.received("/owner")
        assert len(sent) <= 30  # guardrails.notify.total per hour
        assert sum(1 for d in sent if d.body["to"] == "ada") <= 3  # per owner
        assert all(
            "description" not in d.body
            and len(d.body["summary"]) <= 200
            and "\x1b" not in d.body["summary"]
            for d in sent
        )
        assert {d["reason"] for d in decisions} >= {"notify_rate_limited"}


def test_a_user_error_goes_to_the_owner_slurm_names_not_the_owner_label(fake, service):
    """The ``owner`` label is the sender's word: it chose who was told of a job's user
    errors (its summary, host and job id). Slurm's owner of the job comes first; the
    label only where the scheduler names none (Kubernetes)."""
    fake.set_owner("43", "bob")
    with WebhookReceiver() as hooks:
        svc = service(notify=hooks.url("/owner"))
        forged = alert(
            "gpu-001",
            "43",
            name="JobUserError",
            owner="mallory",
            **{"class": "user", "remediation": "notify"},
        )
        assert {d["reason"] for d in send(svc, [forged])} == {"executed"}
        assert [n.body["to"] for n in hooks.received("/owner")] == ["bob"]


def test_c4_a_straggler_with_its_job_id_left_out_drains_nothing(fake, service):
    """Without job_id the "node runs the alert's job" check has nothing to check: the sender
    leaves it out (and calls the alert node-scoped) to drain a node outside any job of its."""
    svc = service()
    jobless = send(svc, [alert("gpu-077", job="", scope="node")])
    assert {(d["action"], d["outcome"], d["reason"]) for d in jobless} == {
        ("drain", "skipped", "no_job"),
        ("requeue", "skipped", "no_job"),
    }
    assert fake.drained() == {} and fake.acting_calls() == []
    # a node's own hardware fault names no job: the policy's scope: node rule drains it
    assert {d["outcome"] for d in send(svc, [xid(9)])} == {"acted"}
    assert list(fake.drained()) == ["gpu-009"]


def test_c5_the_webhook_token_neither_approves_nor_closes_the_breaker(fake, service):
    """The sender holds Alertmanager's token and poses as the on-call in a header."""
    svc = service(
        mode="recommend",
        cluster_nodes=10,
        guardrails={"breaker": {"max_share": 0.2, "window": "1h"}},
    )
    first, _, tripped = send(svc, [xid(1), xid(2), xid(3)])  # the 3rd trips the breaker
    assert first["outcome"] == "queued" and tripped["reason"] == "breaker_tripped"
    posing = {"X-Stepwatch-User": "oncall-alice"}
    code, answer = _post(f"{svc.url}/api/close-breaker", TOKEN, posing)
    assert code == 403 and "not an operator credential" in answer["error"]
    code, _ = _post(f"{svc.url}/api/approve/{first['id']}", TOKEN, posing)
    assert code == 403 and get(svc, "/api/breaker")["open"] and fake.drained() == {}
    # the operator's own token closes it, recorded under the operator's name, not the header
    code, _ = _post(f"{svc.url}/api/close-breaker", OPERATOR_TOKEN, {"X-Stepwatch-User": "eve"})
    breaker = get(svc, "/api/breaker")
    assert code == 200 and not breaker["open"] and breaker["reason"] == f"closed by {OPERATOR}"
    code, done = _post(f"{svc.url}/api/approve/{first['id']}", OPERATOR_TOKEN, posing)
    assert code == 200 and done["outcome"] == "acted", done
    assert done["detail"].startswith(f"approval by {OPERATOR}: ")
    assert list(fake.drained()) == ["gpu-001"]


def test_c6_a_forged_alert_does_not_pre_empt_the_real_one(fake, service):
    """The sender posts the real alert's fingerprint first with an identity it knows is
    refused (job_id ALL), hoping the refusal is remembered for the real alert that follows."""
    svc = service()
    real = alert("gpu-002", "43")
    forged = dict(alert("gpu-002", "ALL"), fingerprint=real["fingerprint"])
    assert {d["reason"] for d in send(svc, [forged])} == {"invalid_identity"}
    acted = send(svc, [real])
    assert {(d["action"], d["outcome"]) for d in acted} == {
        ("drain", "acted"),
        ("requeue", "acted"),
    }, acted
    assert list(fake.drained()) == ["gpu-002"] and fake.requeued() == ["43"]
    assert {d["outcome"] for d in send(svc, [forged])} == {"duplicate"}  # its retry: remembered
    assert {d["outcome"] for d in send(svc, [real])} == {"duplicate"}  # and the real one's


def _post(url: str, token: str, headers: dict[str, str]) -> tuple[int, Any]:
    req = urllib.request.Request(
        url, data=b"", method="POST", headers={"Authorization": f"Bearer {token}", **headers}
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"null")


@pytest.mark.skipif(
    bool(missing_binaries()), reason=f"Slurm/munge binaries absent: {missing_binaries()}"
)
def test_holes_1_and_3_on_a_real_slurm_cluster(tmp_path, slurm, service):
    job = slurm.sbatch(
        "-N", "2", "-w", "node[01-02]", "--requeue", "-o", "/dev/null", "--wrap", "sleep 600"
    )
    wait_for(
        lambda: "JobState=RUNNING" in slurm.scontrol("show", "job", job, "-o"),
        30,
        what="job running",
    )
    svc = service(actuator={"kind": "slurm", "slurm_conf": str(slurm.conf_path)})
    attacks = [
        alert("node[01-04]", job),
        alert("node03,node04", job),
        alert("ALL", job),
        alert("node02", f"{job},{job}"),
        alert("node03", job),
    ]  # the last: not the job's node
    decisions = send(svc, attacks)
    assert {d["reason"] for d in decisions} == {"invalid_identity", "node_not_in_job"}
    states = slurm.node_states()
    assert not any(s.startswith("drain") for s in states.values()), states
    assert "Restarts=0" in slurm.scontrol("show", "job", job, "-o")
    done = send(svc, [alert("node02", job)])  # the job's own node: drained and requeued
    assert {d["outcome"] for d in done} == {"acted"}, done
    assert [n for n, s in slurm.node_states().items() if s.startswith("drain")] == ["node02"]


def test_a_job_named_like_its_own_fields_points_the_remediator_nowhere(tmp_path, slurm, service):
    """A Slurm user names (or renames, ``scontrol update jobid=J name=...``) a job
    ``x NodeList=node03 UserId=root(0)``: ``scontrol show job -o`` prints the name before
    the real fields, so reading the first ``NodeList=`` took node03 for a node of the job
    (drained) and root for its owner. The actuator reads jobs through ``squeue`` with a
    format of its own, which prints no field the job's owner writes."""
    job = slurm.sbatch(
        "-N", "1", "-w", "node01", "-J", "x NodeList=node03 UserId=root(0)",
        "--requeue", "-o", "/dev/null", "--wrap", "sleep 600",
    )  # fmt: skip
    wait_for(
        lambda: "JobState=RUNNING" in slurm.scontrol("show", "job", job, "-o"),
        30,
        what="job running",
    )
    shown = slurm.scontrol("show", "job", job, "-o")
    assert shown.index("NodeList=node03") < shown.index("NodeList=node01")  # the bait
    svc = service(actuator={"kind": "slurm", "slurm_conf": str(slurm.conf_path)})
    decisions = send(svc, [alert("node03", job)])
    assert {(d["action"], d["reason"]) for d in decisions} == {
        ("drain", "node_not_in_job"),
        ("requeue", "node_not_in_job"),
    }
    assert not any(s.startswith("drain") for s in slurm.node_states().values())
    done = send(svc, [alert("node01", job)])  # the node it does run on
    assert {d["outcome"] for d in done} == {"acted"}, done

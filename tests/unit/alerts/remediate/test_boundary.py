"""The remediator boundary's pure pieces (issue 15/16): identities, reservations, approve's
re-checks, the job check, the actuators' last checks and the outcome tracker."""

from __future__ import annotations

import json
import sqlite3
import subprocess
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from stepwatch.alerts.remediate import identity
from stepwatch.alerts.remediate.actuators.base import LogActuator
from stepwatch.alerts.remediate.actuators.kube import KubeActuator
from stepwatch.alerts.remediate.actuators.slurm import SlurmActuator
from stepwatch.alerts.remediate.audit import Audit, Metrics
from stepwatch.alerts.remediate.engine import Remediator
from stepwatch.alerts.remediate.model import ActionKind, Alert, Mode, Outcome, action_id
from stepwatch.alerts.remediate.outcome import OutcomeTracker
from stepwatch.alerts.remediate.policy import PolicyError, from_mapping, load
from stepwatch.alerts.remediate.state import RESERVE, State, Status
from stepwatch.errors import ActuatorError
from tests.support import paths

pytestmark = pytest.mark.unit
RULES = [{"match": {"alertname": "StragglerPersistent"}, "actions": ["drain", "requeue"]}]
XID_RULE = {"match": {"alertname": "GpuXidFatal"}, "actions": ["drain", "requeue"], "scope": "node"}


@pytest.mark.parametrize(
    "node, ok",
    [
        ("gpu-001", True),
        ("node02.cluster", True),
        ("n_1", True),
        ("gpu-[001-100]", False),
        ("a,b", False),
        ("ALL", False),
        ("all", False),
        ("-h", False),
        ("", False),
        ("a b", False),
        ("a" * 63, True),
        ("a" * 64, False),
        ("gpu-01\n", False),
        ("{gpu}", False),
    ],
)
def test_node_names(node, ok):
    assert identity.node_ok(node) is ok


@pytest.mark.parametrize(
    "job, scheme, ok",
    [
        ("43", "slurm", True),
        ("123_4", "slurm", True),
        ("43,44", "slurm", False),
        ("ALL", "slurm", False),
        ("123_[1-5]", "slurm", False),
        ("j1", "slurm", False),
        ("train-7", "label", True),
        ("j1,x!=y", "label", False),
        ("-j", "label", False),
        ("1" * 11, "slurm", False),
        ("ml/train7", "label", True),
        ("/train7", "label", False),  # a second spelling of train7 (its own job cooldown)
    ],
)
def test_job_ids(job, scheme, ok):
    assert identity.job_ok(job, scheme) is ok


def test_the_command_actuator_requeues_a_label_job_id(tmp_path):
    """The engine checks a command backend's job ids as labels; its requeue refused every
    one that was not a Slurm number (``train-7``: failed_permanent)."""
    import sys

    from stepwatch.alerts.remediate.actuators.command import CommandActuator

    argv = [
        sys.executable,
        "-c",
        "import sys; print(' '.join(sys.argv[1:]))",
        "{action}",
        "{job_id}",
    ]
    assert CommandActuator(argv).requeue("train-7", "node02") == "requeue train-7"


def test_free_text_is_plain_and_bounded():
    assert identity.text("a\x1b[31m\nb" + "x" * 500, 20) == "a 31m b" + "x" * 13
    assert identity.word("Straggler Persistent;rm") == "Straggler_Persistent_rm"
    assert identity.problem("gpu-[1-2]", "43").startswith("host label")


def test_policy_keys_and_errors():
    g = from_mapping(
        {
            "guardrails": {
                "webhook": {"max_alerts": 7, "skip_memory": "1m"},
                "job_check": {"jobless_drain": False, "unverifiable": "skip"},
                "notify": {"per_owner": 1, "total": 2, "per": "10m"},
            },
            "outcome": {"deadline": "2m"},
        }
    )
    assert (g.guardrails.max_alerts_per_webhook, g.guardrails.skip_memory_s) == (7, 60.0)
    assert not g.guardrails.jobless_drain and g.guardrails.unverified_jobs == "skip"
    assert g.guardrails.notify_total == 2 and g.outcome.deadline_s == 120.0
    with pytest.raises(PolicyError, match="unverifiable"):
        from_mapping({"guardrails": {"job_check": {"unverifiable": "maybe"}}})
    with pytest.raises(PolicyError, match="max_alerts"):
        from_mapping({"guardrails": {"webhook": {"max_alerts": 0}}})


def test_old_state_files_get_the_new_columns(tmp_path):
    db = sqlite3.connect(tmp_path / "remediator.sqlite3")
    db.execute("CREATE TABLE history (ts REAL, what TEXT, node TEXT, job_id TEXT)")
    db.executemany(
        "INSERT INTO history VALUES (?,?,?,?)",
        [(10, "remediation", "n1", "1"), (11, "remediation", "n2", "2")],
    )
    db.commit()
    db.close()
    state = State(tmp_path)
    assert state.remediations(0) == 2  # old rows have no key: each is one remediation
    state.record(12, RESERVE, "n3", "3", ref="k", action="a1")
    state.record(12, "remediation", "n3", "3", ref="k")
    assert state.remediations(0) == 3 and state.remediations(0, exclude_ref="k") == 2
    state.unreserve("a1")
    assert state.count(RESERVE, 0) == 0


class Fake(LogActuator):
    def __init__(self) -> None:
        super().__init__(20, jobs={"42": ["node01", "node02"]})
        self.calls: list[tuple[str, ...]] = []

    def drain(self, node: str, reason: str) -> str:
        self.calls.append(("drain", node))
        return super().drain(node, reason)

    def requeue(self, job_id: str, exclude_node: str) -> str:
        self.calls.append(("requeue", job_id))
        return "ok"


class Sent:
    def __init__(self) -> None:
        self.events: list[Any] = []

    def send(self, event: Any) -> None:
        self.events.append(event)


class Clock:
    now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def engine(
    tmp_path,
    mode: Mode = Mode.EXECUTE,
    tracker: bool = False,
    rules: list[dict[str, Any]] | None = None,
    **guardrails: Any,
):
    policy = from_mapping(
        {
            "mode": mode.value,
            "rules": RULES if rules is None else rules,
            "cluster_nodes": 20,
            "guardrails": guardrails,
            "outcome": {"deadline": "10m"},
        }
    )
    state, fake, pager, clock = State(tmp_path / "s"), Fake(), Sent(), Clock()
    registry = CollectorRegistry()
    audit = Audit(Metrics(registry))
    outcomes = (
        OutcomeTracker(
            state, policy.outcome, pager, audit, mode=mode, clock=clock, registry=registry
        )
        if tracker
        else None
    )
    return (
        Remediator(policy, state, fake, Sent(), pager, audit, clock=clock, outcomes=outcomes),
        fake,
        pager,
        clock,
        registry,
    )


def alert(
    host: str = "node02",
    job: str = "42",
    fp: str = "f1",
    status: str = "firing",
    name: str = "StragglerPersistent",
) -> Alert:
    labels = {"alertname": name, "host": host, "job_id": job, "cause": "gpu"}
    return Alert(fp, status, {k: v for k, v in labels.items() if v})


def test_node_outside_its_job_and_requeue_without_a_job(tmp_path):
    eng, fake, *_ = engine(tmp_path, rules=[*RULES, XID_RULE])
    assert {d.reason for d in eng.handle([alert(host="node07")])} == {"node_not_in_job"}
    jobless = eng.handle([alert(host="node01", job="", fp="f2", name="GpuXidFatal")])
    assert [(d.action.value, d.reason) for d in jobless] == [
        ("requeue", "no_job"),
        ("drain", "executed"),
    ]
    assert fake.calls == [("drain", "node01")]


def test_jobless_drain_can_be_refused(tmp_path):
    eng, fake, *_ = engine(tmp_path, rules=[XID_RULE], job_check={"jobless_drain": False})
    jobless = eng.handle([alert(job="", name="GpuXidFatal")])
    assert {d.reason for d in jobless} == {"no_job"} and fake.calls == []


def test_approving_both_actions_of_one_alert_is_one_remediation(tmp_path):
    eng, fake, *_ = engine(tmp_path, Mode.RECOMMEND, rate_limit={"actions": 1}, cooldown={"job": 0})
    queued = eng.handle([alert()])
    assert {d.outcome for d in queued} == {Outcome.QUEUED}
    assert eng.handle([alert(host="node01", fp="f2")])[0].reason == "rate_limited"  # reserved
    done = [eng.approve(d.action_id) for d in queued]
    assert [d.outcome for d in done if d] == [Outcome.ACTED, Outcome.ACTED]
    assert fake.calls == [("drain", "node02"), ("requeue", "42")]


def test_approving_both_actions_of_an_alert_with_its_start_time_acts_both(tmp_path):
    """Alertmanager always sends ``startsAt``, part of the alert's key; the approval
    rebuilt the alert without it: the first approved action was refused node_cooldown
    (the sibling's reservation read as another alert's) and the node stayed in service."""
    eng, fake, *_ = engine(tmp_path, Mode.RECOMMEND, cooldown={"job": 0})
    started = Alert("f1", "firing", alert().labels, starts_at="2026-12-03T10:00:00Z")
    queued = eng.handle([started])
    assert {d.outcome for d in queued} == {Outcome.QUEUED}
    done = [eng.approve(d.action_id) for d in queued]
    assert [(d.outcome, d.reason) for d in done if d] == [(Outcome.ACTED, "executed")] * 2
    assert fake.calls == [("drain", "node02"), ("requeue", "42")]


def test_approve_checks_the_stored_labels_again(tmp_path):
    eng, fake, *_ = engine(tmp_path, Mode.RECOMMEND)
    queued = eng.handle([alert()])
    row = eng.state.action(queued[0].action_id)
    assert row is not None
    tampered = json.loads(row.alert)
    tampered["labels"]["host"] = "node[01-20]"  # the state file is an input too
    eng.state.put_action(row.__class__(**{**row.__dict__, "alert": json.dumps(tampered)}))
    refused = eng.approve(queued[0].action_id)
    assert refused is not None and refused.reason == "invalid_identity" and fake.calls == []
    assert eng.approve(queued[0].action_id) is None  # refused for good


def test_skips_after_a_scheduler_call_are_remembered(tmp_path):
    eng, _fake, _pager, clock, _ = engine(tmp_path, webhook={"skip_memory": "10m"})
    eng.handle([alert(host="node07")])
    assert {d.outcome for d in eng.handle([alert(host="node07")])} == {Outcome.DUPLICATE}
    clock.now += 601
    assert {d.reason for d in eng.handle([alert(host="node07")])} == {"node_not_in_job"}


def test_outcome_recovered_when_the_alert_resolves_in_time_and_stays_resolved(tmp_path):
    eng, _fake, pager, clock, registry = engine(tmp_path, tracker=True)
    eng.handle([alert()])
    clock.now += 120
    assert eng.handle([alert(status="resolved")]) == []  # settling: it may fire again
    assert eng.outcomes is not None
    clock.now += 119
    assert eng.outcomes.check() == []
    clock.now += 2  # resolved for the settle period (120 s)
    decisions = eng.outcomes.check()
    assert [(d.outcome, d.reason) for d in decisions] == [
        (Outcome.RECOVERED, "resolved_and_stayed_resolved")
    ]
    row = eng.state.outcomes()[0]
    assert row.outcome == "recovered" and row.action == "drain+requeue"
    assert (
        registry.get_sample_value("stepwatch_remediation_outcomes_total", {"outcome": "recovered"})
        == 1
    )
    assert eng.outcomes is not None and eng.outcomes.check() == [] and pager.events == []


def test_outcome_not_recovered_at_the_deadline_pages(tmp_path):
    eng, _fake, pager, clock, registry = engine(tmp_path, tracker=True)
    eng.handle([alert()])
    assert eng.outcomes is not None
    clock.now += 599
    assert eng.outcomes.check() == []
    clock.now += 2
    late = eng.outcomes.check()
    assert [d.outcome for d in late] == [Outcome.NOT_RECOVERED]
    assert pager.events[-1]["kind"] == "page" and "did not resolve" in pager.events[-1]["text"]
    assert eng.handle([alert(status="resolved")]) == []  # too late: stays not_recovered
    assert (
        registry.get_sample_value(
            "stepwatch_remediation_outcomes_total", {"outcome": "not_recovered"}
        )
        == 1
    )


def test_outcome_an_alert_that_fires_again_while_settling_did_not_recover(tmp_path):
    """The restart resolves the straggler; once the new run has warmed up on the same bad
    node it fires again: the remediation did not help, at the deadline a person is paged."""
    eng, _fake, pager, clock, _registry = engine(tmp_path, tracker=True)
    eng.handle([alert()])
    assert eng.outcomes is not None
    clock.now += 60
    eng.handle([alert(status="resolved")])
    clock.now += 60
    eng.handle([alert()])  # fired again before settling (duplicate actions: nothing redone)
    clock.now += 100
    assert eng.outcomes.check() == []  # not resolved any more: no recovery to settle
    clock.now += 400
    late = eng.outcomes.check()
    assert [(d.outcome, d.reason) for d in late] == [
        (Outcome.NOT_RECOVERED, "still_firing_at_deadline")
    ]
    assert pager.events[-1]["kind"] == "page"


def test_outcome_resolved_but_the_step_time_did_not_come_back(tmp_path):
    from stepwatch.alerts.remediate.policy import OutcomeSettings

    eng, _fake, pager, clock, _registry = engine(tmp_path, tracker=True)
    assert eng.outcomes is not None
    times = iter([1.27, 1.26])  # before the action, after settling: not 3 % faster
    eng.outcomes.step_time = lambda job_id: next(times)  # what Prometheus would answer
    eng.outcomes.settings = OutcomeSettings(settle_s=30.0)
    eng.handle([alert()])
    clock.now += 10
    eng.handle([alert(status="resolved")])
    clock.now += 31
    (d,) = eng.outcomes.check()
    assert (d.outcome, d.reason) == (Outcome.NOT_RECOVERED, "step_time_not_back")
    assert "1.27" in d.detail and pager.events[-1]["kind"] == "page"


@pytest.mark.parametrize("total", [20, 1])
def test_escalation_pages_are_bounded_per_node_and_in_all(tmp_path, total):
    """Once a node is a repeat offender, every alert for it with a fresh fingerprint
    escalates: before, each paged the on-call (20 webhooks of 100: 2,000 pages). Now one
    page per node and reason per window, and ``guardrails.pages.total`` in all."""
    eng, _fake, pager, clock, _registry = engine(tmp_path, pages={"total": total})
    for i in range(3):  # three real remediations of each node, past every cooldown
        for host in ("node01", "node02"):
            eng.handle([alert(host=host, fp=f"{host}-real{i}")])
            clock.now += 43200
    for host in ("node01", "node02"):
        flood = eng.handle([alert(host=host, fp=f"{host}-forged-{i}") for i in range(100)])
        assert {(d.outcome, d.reason) for d in flood} == {(Outcome.ESCALATED, "repeat_offender")}
    assert [e["host"] for e in pager.events] == ["node01", "node02"][:total]
    clock.now += 3601  # a new window: a node pages again
    eng.handle([alert(host="node02", fp="later")])
    assert [e["host"] for e in pager.events][-1] == "node02"


def test_outcome_a_resolved_with_other_labels_does_not_end_the_watch(tmp_path):
    """A forger holding the webhook token posts ``resolved`` with the real alert's name and
    fingerprint but not its labels: before, the outcome became ``recovered`` after the
    settle time though the alert still fired, and the not-recovered page never came."""
    eng, _fake, pager, clock, _registry = engine(tmp_path, tracker=True)
    assert eng.outcomes is not None
    eng.handle([alert()])
    clock.now += 5
    eng.handle([alert(host="x", job="", status="resolved")])
    eng.handle([alert(host="node02", job="43", status="resolved")])
    decided = []
    for _ in range(70):  # past the 10 min deadline, the real alert never resolved
        clock.now += 10
        decided += eng.outcomes.check()
    assert [(d.outcome, d.reason) for d in decided] == [
        (Outcome.NOT_RECOVERED, "still_firing_at_deadline")
    ]
    assert [e["kind"] for e in pager.events if e["kind"] == "page"][-1:] == ["page"]


def _prometheus(answer: Callable[[str], str]) -> tuple[Any, list[str]]:
    """A Prometheus HTTP API on loopback answering each instant query with ``answer(q)``."""
    import threading
    import urllib.parse
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    asked: list[str] = []

    class Prom(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)["query"][0]
            asked.append(query)
            value = answer(query)
            result = [{"metric": {}, "value": [1764086400.0, value]}] if value else []
            body = json.dumps(
                {"status": "success", "data": {"resultType": "vector", "result": result}}
            ).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Prom)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, asked


@pytest.mark.parametrize("firing", [True, False])
def test_outcome_a_resolved_alert_still_firing_in_prometheus_is_no_recovery(tmp_path, firing):
    """With a Prometheus URL the outcome asks ``ALERTS`` before it calls a resolved alert
    recovered: a ``resolved`` (even with the right labels) while Prometheus still fires
    the alert starts the settling over, and the deadline pages."""
    from stepwatch.alerts.remediate.policy import OutcomeSettings

    server, asked = _prometheus(lambda q: ("1" if firing else "") if "ALERTS" in q else "")
    try:
        eng, _fake, pager, clock, _registry = engine(tmp_path, tracker=True)
        assert eng.outcomes is not None
        url = f"http://127.0.0.1:{server.server_address[1]}"
        eng.outcomes.settings = OutcomeSettings(settle_s=30.0, prometheus_url=url)
        from stepwatch.alerts.remediate.outcome import StillFiring

        eng.outcomes.still_firing = StillFiring(url)
        eng.handle([alert()])
        clock.now += 10
        eng.handle([alert(status="resolved")])
        decided = []
        for _ in range(70):
            clock.now += 10
            decided += eng.outcomes.check()
    finally:
        server.shutdown()
        server.server_close()
    expected = (
        (Outcome.NOT_RECOVERED, "still_firing_at_deadline")
        if firing
        else (Outcome.RECOVERED, "resolved_and_stayed_resolved")
    )
    assert [(d.outcome, d.reason) for d in decided] == [expected]
    assert any(e["kind"] == "page" for e in pager.events) == firing
    queries = [q for q in asked if "ALERTS" in q]
    assert queries and queries[0] == (
        'count(ALERTS{alertstate="firing",alertname="StragglerPersistent",'
        'host="node02",job_id="42"})'
    )


def runner(answers: dict[str, str], calls: list[list[str]]):
    def run(argv, timeout, env):
        calls.append(list(argv))
        text = answers.get(" ".join(argv[1:3]), "")
        return subprocess.CompletedProcess(argv, 0, text, "")

    return run


def test_slurm_actuator_last_checks_and_job_nodes():
    calls: list[list[str]] = []
    slurm = SlurmActuator(
        runner=runner(
            {
                "show node": "NodeName=n1 State=IDLE\nNodeName=n2 State=IDLE\n",
                "--noheader --array": "7|7|ada|RUNNING|n[1-2]|\n",
                "show hostnames": "n1\nn2\n",
            },
            calls,
        )
    )
    with pytest.raises(ActuatorError, match="not exactly that one node"):
        slurm.node_state("n1")  # two records back: the name was expanded somewhere
    assert slurm.job_nodes("7") == frozenset({"n1", "n2"})
    assert calls[-1][1:] == ["show", "hostnames", "n[1-2]"]
    before = len(calls)
    for bad in (
        lambda: slurm.drain("n[1-2]", "r"),
        lambda: slurm.requeue("7,8", "n1"),
        lambda: slurm.requeue("7", "ALL"),
        lambda: slurm.job_nodes("ALL"),
    ):
        with pytest.raises(ActuatorError, match="refusing"):
            bad()
    assert len(calls) == before  # refused before any argv was built


def test_kube_actuator_job_nodes_and_label_injection():
    pods = [SimpleNamespace(spec=SimpleNamespace(node_name=n)) for n in ("k1", "k2", None)]
    seen: list[str] = []

    def list_pods(label_selector: str, **_: Any) -> Any:
        seen.append(label_selector)
        return SimpleNamespace(items=pods)

    kube = KubeActuator(SimpleNamespace(list_pod_for_all_namespaces=list_pods))
    assert kube.job_nodes("train-7") == frozenset({"k1", "k2"})
    assert seen == ["stepwatch.io/job-id=train-7"]
    with pytest.raises(ActuatorError, match="refusing"):
        kube.job_nodes("x,stepwatch.io/job-id!=y")


def test_kube_job_in_a_namespace_touches_that_namespaces_pods_only():
    """The SDK names a Kubeflow PyTorchJob's pods ``namespace/job``. Before, such an id was
    refused, and a plain one listed and deleted every namespace's pods of that label."""
    asked: list[tuple[str, dict]] = []
    deleted: list[tuple[str, str]] = []
    pod = SimpleNamespace(
        spec=SimpleNamespace(node_name="k1"), metadata=SimpleNamespace(name="p0", namespace="ml")
    )

    def namespaced(namespace: str, **kw: Any) -> Any:
        asked.append((namespace, kw))
        return SimpleNamespace(items=[pod])

    def everywhere(**kw: Any) -> Any:
        raise AssertionError(f"listed every namespace {kw}")

    kube = KubeActuator(
        SimpleNamespace(
            list_namespaced_pod=namespaced,
            list_pod_for_all_namespaces=everywhere,
            delete_namespaced_pod=lambda name, ns: deleted.append((name, ns)),
        )
    )
    assert kube.job_nodes("ml/llm") == frozenset({"k1"})
    kube.requeue("ml/llm", "k1")
    assert asked[0] == ("ml", {"label_selector": "stepwatch.io/job-id=llm"})
    assert asked[1][1]["field_selector"] == "spec.nodeName=k1" and deleted == [("p0", "ml")]
    for bad in ("ML/llm", "a/b/c", "ml/", "-x/llm", "ml/all"):
        with pytest.raises(ActuatorError, match="refusing"):
            kube.job_nodes(bad)


def test_approve_in_observe_mode_acts_for_no_one(tmp_path):
    eng, fake, *_ = engine(tmp_path, Mode.RECOMMEND)
    queued = eng.handle([alert()])
    observer, fake2, *_ = engine(
        tmp_path, Mode.OBSERVE
    )  # the same state, restarted in observe mode
    done = observer.approve(queued[0].action_id)
    assert done is not None and done.reason == "observe_mode" and fake.calls == fake2.calls == []
    assert [r.id for r in observer.state.actions("queued")] != []


def test_step_time_evidence_from_prometheus_http_api():
    from stepwatch.alerts.remediate.outcome import StepTimes

    server, asked = _prometheus(lambda query: "1.25")
    try:
        steps = StepTimes(f"http://127.0.0.1:{server.server_address[1]}")
        assert steps("42") == 1.25
        assert asked[0] == 'max(stepwatch_job_step_seconds{job_id="42"})'
        assert steps('42"} or vector(1) #') is None and len(asked) == 1  # never built into a query
    finally:
        server.shutdown()
        server.server_close()
    assert StepTimes("http://127.0.0.1:9")("42") is None  # unreachable: no evidence, no error


def test_skips_that_may_pass_by_themselves_are_not_remembered(tmp_path):
    eng, fake, *_ = engine(tmp_path, cooldown={"job": 0})
    assert fake.jobs is not None
    fake.jobs["42"] = frozenset()  # pending: on no node yet
    assert {d.reason for d in eng.handle([alert()])} == {"job_not_running"}
    fake.jobs["42"] = frozenset({"node02"})  # started: the next webhook acts
    assert {d.outcome for d in eng.handle([alert()])} == {Outcome.ACTED}
    busy = ActuatorError("Unable to contact slurm controller", transient=True)

    def down(node: str) -> Any:
        raise busy

    fake.node_state = down  # type: ignore[method-assign]
    assert {d.reason for d in eng.handle([alert(host="node01", fp="f9")])} == {"node_state_unknown"}
    assert {d.reason for d in eng.handle([alert(host="node01", fp="f9")])} == {"node_state_unknown"}


def test_one_webhook_judges_an_alert_once_and_asks_the_scheduler_once_per_job(tmp_path):
    eng, fake, *_ = engine(
        tmp_path,
        Mode.OBSERVE,
        cooldown={"node": 0, "job": 0},
        rate_limit={"actions": 100},
        breaker={"max_share": 1.0},
    )
    asked: list[str] = []
    real = fake.job_nodes

    def counting(job_id: str) -> frozenset[str] | None:
        asked.append(job_id)
        return real(job_id)

    fake.job_nodes = counting  # type: ignore[method-assign]
    decisions = eng.handle([alert()] * 50 + [alert(host="node01", fp=f"g{i}") for i in range(10)])
    assert len(decisions) == 2 * 11 and asked == ["42"]


def test_approve_rechecks_the_rate_limit_spent_since_the_queueing(tmp_path):
    rules = [
        {
            "match": {"alertname": "GpuXidFatal"},
            "actions": ["drain"],
            "approval": True,
            "scope": "node",
        },
        *RULES,
    ]
    policy = from_mapping(
        {
            "mode": "execute",
            "rules": rules,
            "cluster_nodes": 20,
            "guardrails": {"rate_limit": {"actions": 2, "per": "1h"}, "cooldown": {"job": 0}},
        }
    )
    fake, clock = Fake(), Clock()
    fake.jobs = {"42": frozenset({"node01", "node02", "node03"})}
    eng = Remediator(
        policy,
        State(tmp_path / "s"),
        fake,
        Sent(),
        Sent(),
        Audit(Metrics(CollectorRegistry())),
        clock=clock,
    )
    xid = Alert("x1", "firing", {"alertname": "GpuXidFatal", "host": "node05"})
    queued = eng.handle([xid])[0]
    assert queued.outcome is Outcome.QUEUED
    clock.now += 2 * 3600  # the queued drain's reservation has run out; two remediations since
    assert {
        d.outcome for d in eng.handle([alert(host="node01"), alert(host="node03", fp="f3")])
    } == {Outcome.ACTED}
    refused = eng.approve(queued.action_id)
    assert refused is not None and refused.reason == "rate_limited"
    assert ("drain", "node05") not in fake.calls


# --- C4: a drain without job identity only for rules declared node-scoped --------------------

EXAMPLE = (
    paths.ROOT / "alerts" / "src" / "stepwatch" / "alerts" / "remediate" / "policy.example.yaml"
)
# the shipped alerts whose remediation can be drain: the node's own hardware, or a job's rank/port
NODE_FAULTS = {
    "GpuXidFatal",
    "GpuXidNeedsReset",
    "GpuEccDoubleBit",
    "GpuRowRemapFailure",
    "RdmaLinkDown",
    "RdmaLinkFlapping",
}
JOB_FAULTS = {"StragglerPersistent", "NetworkFaultLocalized", "RankStopped"}


def test_a_drain_without_job_id_needs_a_rule_declared_scope_node(tmp_path):
    """The attacker leaves job_id out so that "the node runs the alert's job" is never asked,
    and labels the alert scope=node: node07 (outside job 42) must not be drained."""
    eng, fake, *_ = engine(tmp_path, rules=[*RULES, XID_RULE])
    forged = Alert(
        "fp-forged",
        "firing",
        {"alertname": "StragglerPersistent", "host": "node07", "cause": "gpu", "scope": "node"},
    )
    decisions = eng.handle([forged])
    assert [(d.action.value, d.outcome, d.reason) for d in decisions] == [
        ("drain", Outcome.SKIPPED, "no_job"),
        ("requeue", Outcome.SKIPPED, "no_job"),
    ]
    assert "scope: node" in decisions[0].detail
    assert fake.calls == [] and fake.drained == {}
    xid = eng.handle([alert(host="node07", job="", fp="x1", name="GpuXidFatal")])
    assert [(d.action.value, d.reason) for d in xid] == [
        ("requeue", "no_job"),
        ("drain", "executed"),
    ]  # a node's own hardware fault names no job: its rule says scope: node
    assert fake.calls == [("drain", "node07")]


def test_approve_applies_the_same_jobless_rule(tmp_path):
    """A queued straggler drain whose stored labels lost their job_id (the state file is an
    input too) is refused at approval; a node-scoped rule's jobless drain is approved."""
    eng, fake, *_ = engine(tmp_path, Mode.RECOMMEND, rules=[*RULES, XID_RULE])
    drain = next(d for d in eng.handle([alert()]) if d.action is ActionKind.DRAIN)
    row = eng.state.action(drain.action_id)
    assert row is not None and drain.outcome is Outcome.QUEUED
    tampered = json.loads(row.alert)
    del tampered["labels"]["job_id"]
    eng.state.put_action(row.__class__(**{**row.__dict__, "alert": json.dumps(tampered)}))
    refused = eng.approve(drain.action_id, by="alice")
    assert refused is not None and refused.reason == "no_job" and fake.calls == []
    assert "scope: node" in refused.detail and refused.detail.startswith("approval by alice")
    xid = eng.handle([alert(host="node05", job="", fp="x1", name="GpuXidFatal")])
    queued = next(d for d in xid if d.action is ActionKind.DRAIN)
    done = eng.approve(queued.action_id, by="alice")
    assert done is not None and done.outcome is Outcome.ACTED
    assert fake.calls == [("drain", "node05")]


def test_rule_scope_is_strict_and_the_example_marks_only_node_faults():
    with pytest.raises(PolicyError, match=r"rules\[0\]\.scope: 'rack' is not one of job, node"):
        from_mapping({"rules": [{"match": {}, "actions": ["drain"], "scope": "rack"}]})
    with pytest.raises(PolicyError, match=r"rules\[0\]\.scope"):
        from_mapping({"rules": [{"match": {}, "actions": ["drain"], "scope": ["node"]}]})
    assert from_mapping({"rules": [{"match": {}, "actions": ["drain"]}]}).rules[0].scope == "job"
    shipped = _drain_alerts()
    assert shipped == NODE_FAULTS | JOB_FAULTS, "classify every shipped drain alert"
    example = load(EXAMPLE)
    for name in sorted(shipped):
        labels = {"alertname": name, "class": "system", "remediation": "drain", "host": "n1"}
        jobless_ok = example.jobless_drain(Alert("f", "firing", labels))
        assert jobless_ok is (name in NODE_FAULTS), name


def _drain_alerts() -> set[str]:
    """The shipped alert rules whose remediation label can be drain."""
    import yaml

    from stepwatch.alerts.config import rule_files

    names = set()
    for path in rule_files():
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                if "drain" in str(rule.get("labels", {}).get("remediation", "")):
                    names.add(rule["alert"])
    return names


# --- C6: a forged alert must not use up the real alert's de-duplication memory ---------------


@pytest.mark.parametrize(
    "forged_job, why",
    [
        ("ALL", "invalid_identity"),  # an expression Slurm would expand
        ("4,2", "invalid_identity"),  # made plain, it reads like the real array task 4_2
        ("43", "node_not_in_job"),  # a real job the node does not run
        ("", "no_job"),  # no job: a straggler rule's drain is refused
    ],
)
def test_an_alert_refused_for_its_input_does_not_pre_empt_the_real_one(tmp_path, forged_job, why):
    eng, fake, *_ = engine(tmp_path)
    fake.jobs = {"4_2": frozenset({"node01", "node02"}), "43": frozenset({"node05"})}
    forged = eng.handle([alert(job=forged_job, fp="fp-real")])  # the real alert's fingerprint
    assert {d.reason for d in forged} == {why} and fake.calls == []
    real = eng.handle([alert(job="4_2", fp="fp-real")])
    assert [(d.action.value, d.outcome) for d in real] == [
        ("drain", Outcome.ACTED),
        ("requeue", Outcome.ACTED),
    ]
    assert fake.calls == [("drain", "node02"), ("requeue", "4_2")]
    again = eng.handle([alert(job=forged_job, fp="fp-real")])  # the forged one's retry
    assert {d.outcome for d in again} == {Outcome.DUPLICATE}  # its own skip is remembered


def test_a_drain_id_names_the_job_and_long_targets_stay_apart(tmp_path):
    eng, *_ = engine(tmp_path)
    assert eng.handle([alert()])[0].action_id.startswith("drain-42_node02-StragglerPersistent-")
    a = alert()
    job = "j" * 63  # a Kubernetes job label at its longest: the host came after the old cut
    one, two = (
        action_id(ActionKind.DRAIN, a, f"{job}@gpu-rack-17-node-{n}") for n in ("0001", "0002")
    )
    assert one != two and len(one) == len(two) <= 80 + len("drain--StragglerPersistent-") + 12


def test_slurm_requeue_releases_the_held_job_or_says_it_is_left_held(monkeypatch):
    """Before, one transient failure of ``scontrol release`` left the job held for good:
    the next try found it not running and did nothing, and nobody was told."""
    monkeypatch.setattr("stepwatch.alerts.remediate.actuators.slurm.RELEASE_PAUSE_S", 0.0)

    def flaky(failures: int, text: str):
        calls: list[str] = []

        def run(argv, timeout, env):
            calls.append(" ".join(argv[1:3]))
            if argv[1:2] == ["release"] and calls.count("release 7") <= failures:
                return subprocess.CompletedProcess(argv, 1, "", text)
            out = "7|7|ada|RUNNING|n1|\n" if "--noheader" in argv else ""
            return subprocess.CompletedProcess(argv, 0, out, "")

        return SlurmActuator(runner=run), calls

    slurm, calls = flaky(2, "Unable to contact slurm controller")
    assert slurm.requeue("7", "n1").startswith("job 7 requeued")
    assert calls.count("release 7") == 3
    for failures, text in ((5, "Unable to contact slurm controller"), (1, "Access denied")):
        slurm, calls = flaky(failures, text)
        with pytest.raises(ActuatorError, match="left held") as err:
            slurm.requeue("7", "n1")
        assert not err.value.transient  # a failed action: the remediator's alert fires


class Died(BaseException):
    """The remediator's process ending inside an actuator call (kill -9, SIGTERM)."""


def test_an_action_cut_off_mid_call_is_recovered_at_the_next_start(tmp_path):
    """Killed between ``requeuehold`` and ``release``, the remediator left the job held for
    good: no row said so, and the alert's repeat found the job not running and did nothing
    (red team, real Slurm). Now the row says ``started`` until the call returns; the next
    start records it failed and has the actuator release the job."""
    eng, fake, *_ = engine(tmp_path)

    def dies(job_id: str, exclude_node: str) -> str:
        raise Died()

    fake.requeue = dies  # type: ignore[method-assign]
    with pytest.raises(Died):
        eng.handle([alert()])
    started = eng.state.actions(Status.STARTED)
    assert [r.kind for r in started] == ["requeue"]
    released: list[tuple[str, str]] = []
    fake.release_interrupted = lambda j, n: released.append((j, n)) or f"job {j} released"  # type: ignore[attr-defined]
    again = Remediator(
        eng.policy, State(tmp_path / "s"), fake, Sent(), Sent(), Audit(Metrics(CollectorRegistry()))
    )
    decisions = again.recover_interrupted()
    assert [(d.action.value, d.outcome, d.reason) for d in decisions] == [
        ("requeue", Outcome.FAILED, "interrupted")
    ]
    assert released == [("42", "node02")] and "job 42 released" in decisions[0].detail
    assert not again.state.actions(Status.STARTED)
    assert again.recover_interrupted() == []  # once

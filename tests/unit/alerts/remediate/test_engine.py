"""The remediator's decisions and guardrails over a fake actuator (no daemons)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from stepwatch.alerts.remediate.actuators.base import LogActuator, NodeState
from stepwatch.alerts.remediate.audit import Audit, Metrics
from stepwatch.alerts.remediate.engine import Remediator
from stepwatch.alerts.remediate.model import ActionKind, Alert, Mode, Outcome
from stepwatch.alerts.remediate.policy import PolicyError, from_mapping, load
from stepwatch.alerts.remediate.state import State
from stepwatch.errors import ActuatorError
from tests.support import paths

pytestmark = pytest.mark.unit
EXAMPLE = (
    paths.ROOT / "alerts" / "src" / "stepwatch" / "alerts" / "remediate" / "policy.example.yaml"
)
RULES = [
    {
        "match": {"alertname": "StragglerPersistent", "class": "system"},
        "actions": ["drain", "requeue"],
    },
    {"match": {"alertname": "GpuXidRestartApplication"}, "actions": ["requeue"], "approval": True},
]


class FakeSlurm(LogActuator):
    def __init__(self, nodes: int = 20) -> None:
        super().__init__(nodes)
        self.calls: list[tuple[str, ...]] = []
        self.fail: ActuatorError | None = None

    def drain(self, node: str, reason: str) -> str:
        self.calls.append(("drain", node, reason))
        if self.fail:
            raise self.fail
        return super().drain(node, reason)

    def requeue(self, job_id: str, exclude_node: str) -> str:
        self.calls.append(("requeue", job_id, exclude_node))
        return "ok"


class Sent:
    def __init__(self) -> None:
        self.events: list[Any] = []

    def send(self, event: Any) -> None:
        self.events.append(event)


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def alert(
    host: str = "node02", name: str = "StragglerPersistent", fp: str = "", **labels: str
) -> Alert:
    base = {
        "alertname": name,
        "host": host,
        "job_id": "42",
        "cause": "gpu",
        "class": "system",
        "remediation": "drain",
    }
    return Alert(fp or f"fp-{host}-{name}", "firing", {**base, **labels}, {"summary": "s"})


@pytest.fixture()
def make(tmp_path):
    def build(
        mode: Mode = Mode.EXECUTE,
        guardrails: dict | None = None,
        nodes: int = 20,
        state_dir: Path | None = None,
    ):
        policy = from_mapping(
            {
                "mode": mode.value,
                "rules": RULES,
                "guardrails": guardrails or {},
                "cluster_nodes": nodes,
            }
        )
        registry = CollectorRegistry()
        fake, owner, pager = FakeSlurm(nodes), Sent(), Sent()
        clock = Clock()
        engine = Remediator(
            policy,
            State(state_dir or tmp_path / "state"),
            fake,
            owner,
            pager,
            Audit(Metrics(registry)),
            clock=clock,
        )
        return engine, fake, owner, pager, clock, registry

    return build


def outcomes(decisions) -> list[tuple[str, str, str]]:
    return [(d.action.value, d.outcome.value, d.reason) for d in decisions]


def test_example_policy_loads():
    policy = load(EXAMPLE)
    assert policy.mode is Mode.OBSERVE and policy.guardrails.rate_limit == 3


@pytest.mark.parametrize(
    "raw, message",
    [
        ({"mode": "yolo"}, "mode: 'yolo' is not one of observe, recommend, execute"),
        (
            {"rules": [{"match": {}, "actions": ["reboot"]}]},
            "rules[0].actions[0]: unknown action 'reboot'",
        ),
        ({"rules": [{"match": {"class": "user"}, "actions": ["drain"]}]}, "never remediated"),
        ({"guardrails": {"breaker": {"max_share": 2}}}, "max_share: must be in (0, 1]"),
        ({"guardrails": {"cooldown": {"node": "soon"}}}, "not a duration"),
        ({"colour": 1}, "unknown key(s) colour"),
        ({"guardrails": {"confirm_firing": True}}, "true needs outcome.prometheus_url"),
        ({"guardrails": {"confirm_firing": "yes"}}, "'yes' is not one of auto, true, false"),
    ],
)
def test_policy_errors_are_one_clear_line(raw, message):
    with pytest.raises(PolicyError) as err:
        from_mapping(raw)
    assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(
    "guardrails, url, asks",
    [
        ({}, "", False),
        ({}, "http://p:9090", True),
        ({"confirm_firing": False}, "http://p:9090", False),
    ],
)
def test_prometheus_is_asked_whether_an_alert_fires_when_a_url_is_set(guardrails, url, asks):
    policy = from_mapping({"guardrails": guardrails, "outcome": {"prometheus_url": url}})
    assert policy.confirms_firing is asks


def test_execute_drains_and_requeues_once_per_fingerprint(make):
    engine, fake, *_, registry = make()
    first = engine.handle([alert()])
    assert outcomes(first) == [("drain", "acted", "executed"), ("requeue", "acted", "executed")]
    assert fake.calls[0][:2] == ("drain", "node02") and fake.calls[0][2].startswith("stepwatch: ")
    assert fake.calls[1] == ("requeue", "42", "node02")
    again = engine.handle([alert()])  # Alertmanager's repeat: same fingerprint
    assert [d.outcome for d in again] == [Outcome.DUPLICATE, Outcome.DUPLICATE] and len(
        fake.calls
    ) == 2
    assert (
        registry.get_sample_value(
            "stepwatch_remediator_decisions_total", {"action": "drain", "outcome": "acted"}
        )
        == 1
    )


def test_state_survives_a_restart(make, tmp_path):
    engine, _fake, *_ = make(state_dir=tmp_path / "s")
    engine.handle([alert()])
    engine2, fake2, *_ = make(state_dir=tmp_path / "s")
    assert [d.outcome for d in engine2.handle([alert()])] == [Outcome.DUPLICATE] * 2
    assert fake2.calls == []


def test_observe_mode_is_a_dry_run(make):
    engine, fake, *_ = make(Mode.OBSERVE)
    assert [d.outcome for d in engine.handle([alert()])] == [Outcome.DRY_RUN] * 2
    assert fake.calls == []


def test_user_errors_only_notify_the_owner(make):
    engine, fake, owner, *_ = make()
    decisions = engine.handle([alert(name="JobUserError", **{"class": "user", "owner": "ada"})])
    assert outcomes(decisions) == [("notify", "acted", "executed")]
    assert fake.calls == [] and owner.events[0]["to"] == "ada"


def test_no_rule_is_recorded_and_nothing_done(make):
    engine, _fake, *_ = make()
    assert outcomes(engine.handle([alert(name="JobThroughputDrop")])) == [
        ("none", "skipped", "no_rule")
    ]


def test_breaker_opens_at_the_share_and_stays_open(make):
    engine, fake, _owner, pager, clock, registry = make(
        guardrails={"breaker": {"max_share": 0.1, "window": "1h"}, "rate_limit": {"actions": 100}},
        nodes=20,
    )
    results = [engine.handle([alert(host=f"node{i:02d}", job_id=f"j{i}")]) for i in range(1, 6)]
    drained = [c[1] for c in fake.calls if c[0] == "drain"]
    assert drained == ["node01", "node02"]  # 10 % of 20 nodes
    assert results[2][0].reason == "breaker_tripped" and pager.events
    assert {d.reason for r in results[3:] for d in r} == {"breaker_open"}
    assert registry.get_sample_value("stepwatch_remediator_circuit_breaker_open") == 1
    clock.now += 86400  # time alone does not close it
    assert engine.handle([alert(host="node09")])[0].reason == "breaker_open"
    assert engine.close_breaker("ops") is True
    assert engine.handle([alert(host="node09")])[0].outcome is Outcome.ACTED


def test_cooldowns_rate_limit_and_repeat_offenders(make):
    engine, _fake, _owner, pager, clock, _ = make(
        guardrails={
            "cooldown": {"node": "1h", "job": "10m"},
            "rate_limit": {"actions": 2, "per": "1h"},
            "repeat_offender": {"count": 2, "window": "7d"},
            "breaker": {"max_share": 1.0},
        }
    )
    engine.handle([alert(fp="a")])
    assert engine.handle([alert(fp="b")])[0].reason == "node_cooldown"
    assert engine.handle([alert(host="node03", fp="c")])[0].reason == "job_cooldown"
    engine.handle([alert(host="node03", fp="d", job_id="7")])
    assert engine.handle([alert(host="node04", fp="e", job_id="8")])[0].reason == "rate_limited"
    clock.now += 2 * 3600
    engine.handle([alert(fp="f")])  # node02's second remediation this week
    clock.now += 2 * 3600
    refused = engine.handle([alert(fp="g")])
    assert refused[0].reason == "repeat_offender" and refused[0].outcome is Outcome.ESCALATED
    assert pager.events[-1]["kind"] == "page"


def test_opt_out_and_nodes_a_person_drained_are_left_alone(make):
    engine, fake, *_ = make(guardrails={"opt_out": {"nodes": ["node07"]}})
    assert engine.handle([alert(host="node07")])[0].reason == "opted_out"
    assert engine.handle([alert(host="node08", stepwatch_opt_out="true")])[0].reason == "opted_out"
    fake.drained["node09"] = "bad fan, ticket 123"
    assert engine.handle([alert(host="node09")])[0].reason == "drained_by_person"
    assert fake.calls == []


def test_approval_queue_then_approve(make):
    engine, fake, *_ = make()
    queued = engine.handle([alert(name="GpuXidRestartApplication")])
    assert outcomes(queued) == [("requeue", "queued", "needs_approval")] and fake.calls == []
    done = engine.approve(queued[0].action_id)
    assert (
        done is not None
        and done.outcome is Outcome.ACTED
        and fake.calls == [("requeue", "42", "node02")]
    )
    assert engine.approve(queued[0].action_id) is None  # only once


def test_recommend_mode_queues_everything(make):
    engine, _fake, *_ = make(Mode.RECOMMEND)
    assert {d.outcome for d in engine.handle([alert()])} == {Outcome.QUEUED}


def test_transient_failures_retry_within_the_budget_permanent_do_not(make, tmp_path):
    engine, fake, *_ = make(
        guardrails={"attempts": {"per_node": 3}, "cooldown": {"node": 0, "job": 0}}
    )
    fake.fail = ActuatorError("controller busy", transient=True)

    def drain(decisions):
        return next(d for d in decisions if d.action is ActionKind.DRAIN)

    assert drain(engine.handle([alert()])).reason == "failed_transient"  # and the requeue ran
    assert drain(engine.handle([alert()])).reason == "failed_transient"  # retried
    assert drain(engine.handle([alert()])).reason == "attempt_budget"  # 3 actuator calls on node02
    engine2, fake2, *_ = make(
        guardrails={"cooldown": {"node": 0, "job": 0}}, state_dir=tmp_path / "p"
    )
    fake2.fail = ActuatorError("Invalid node name", transient=False)
    engine2.handle([alert(host="node05")])
    # the requeue of the same alert ran; the drain is final: not tried again
    assert {d.outcome for d in engine2.handle([alert(host="node05")])} == {Outcome.DUPLICATE}
    assert len(fake2.calls) == 2


def test_unknown_node_and_missing_host(make):
    engine, fake, *_ = make()
    fake.node_state = lambda node: NodeState(False, False)  # type: ignore[method-assign]
    assert engine.handle([alert(host="ghost")])[0].reason == "unknown_node"
    assert engine.handle([alert(host="")])[0].reason == "no_host"
    assert ActionKind.DRAIN.value == "drain"


def _rows(engine: Remediator, table: str) -> int:
    return int(engine.state._db.execute(f"SELECT count(*) FROM {table}").fetchone()[0])


def test_state_forgets_old_skips_and_history_but_keeps_what_guardrails_count(make):
    engine, fake, *_ = make(
        guardrails={"repeat_offender": {"count": 1, "window": "7d"}, "breaker": {"max_share": 1}}
    )
    fake.node_state = lambda node: NodeState(False, False)  # type: ignore[method-assign]
    for i in range(50):  # fresh label sets, each a remembered skip
        assert engine.handle([alert(host="ghost", fp=f"g{i}", extra=str(i))])[0].reason == (
            "unknown_node"
        )
    assert _rows(engine, "actions") >= 50
    clock = engine.clock
    clock.now += 601 + 60  # past the skip memory (10 min) and the prune interval
    engine.handle([])
    assert _rows(engine, "actions") == 0
    # a remediation stays counted for the repeat-offender window (7 days), then is forgotten
    fake.node_state = lambda node: NodeState(True, False)  # type: ignore[method-assign]
    assert engine.handle([alert(fp="r1")])[0].outcome is Outcome.ACTED
    history = _rows(engine, "history")
    clock.now += 6 * 86400
    engine.handle([])
    assert _rows(engine, "history") == history
    refused = engine.handle([alert(fp="r2")])
    assert refused[0].reason == "repeat_offender"
    clock.now += 2 * 86400
    engine.handle([])
    assert 0 < _rows(engine, "history") < history + 2


def firing(started: str, host: str = "node02", fp: str = "fp-xid", **labels: str) -> Alert:
    a = alert(host=host, fp=fp, **labels)
    return Alert(a.fingerprint, a.status, a.labels, a.annotations, starts_at=started)


def test_the_same_fault_firing_again_after_a_repair_is_acted_on_again(make):
    """A fatal XID on one GPU has the same labels, so the same fingerprint, every time.
    Before, its second firing, two weeks after the node was repaired and resumed, was
    'already handled' for good: the node was never drained again."""
    engine, fake, _owner, _pager, clock, _ = make(guardrails={"breaker": {"max_share": 1.0}})
    first = engine.handle([firing("2026-01-01T00:00:00Z")])
    assert [d.outcome for d in first] == [Outcome.ACTED, Outcome.ACTED]
    repeat = engine.handle([firing("2026-01-01T00:00:00Z")])  # Alertmanager's repeat
    assert [d.outcome for d in repeat] == [Outcome.DUPLICATE] * 2
    fake.drained.clear()  # repaired and resumed by a person
    clock.now += 14 * 86400
    again = engine.handle([firing("2026-01-15T00:00:00Z")])
    assert [d.outcome for d in again] == [Outcome.ACTED, Outcome.ACTED]
    assert [c[0] for c in fake.calls] == ["drain", "requeue"] * 2


def test_alerts_sharing_a_fingerprint_each_count_in_the_rate_limit(make):
    """The sender chooses the fingerprint. Before, one shared by 12 alerts for 12 hosts
    counted as one remediation: 12 nodes drained at a rate limit of 3 an hour."""
    engine, fake, *_ = make(
        guardrails={"rate_limit": {"actions": 3, "per": "1h"}, "breaker": {"max_share": 1.0}}
    )
    for i in range(12):
        engine.handle([firing("t", host=f"node{i + 1:02d}", fp="F", job_id=str(100 + i))])
    assert len([c for c in fake.calls if c[0] == "drain"]) == 3


def test_a_job_id_with_leading_zeros_is_the_same_job(make):
    engine, fake, *_ = make(guardrails={"cooldown": {"job": "1h"}, "breaker": {"max_share": 1.0}})
    engine.scheme = "slurm"  # as with the Slurm actuator
    engine.handle([alert(host="node02", fp="a", job_id="42")])
    for host, job in (("node03", "042"), ("node04", "0042")):
        assert engine.handle([alert(host=host, fp=host, job_id=job)])[0].reason == "job_cooldown"
    assert [c[0] for c in fake.calls] == ["drain", "requeue"]


def test_alerts_seen_in_observe_mode_are_acted_on_in_execute_mode(make, tmp_path):
    observe, fake, *_ = make(Mode.OBSERVE, state_dir=tmp_path / "s")
    assert [d.outcome for d in observe.handle([alert()])] == [Outcome.DRY_RUN] * 2
    assert [d.outcome for d in observe.handle([alert()])] == [Outcome.DUPLICATE] * 2
    execute, fake2, *_ = make(Mode.EXECUTE, state_dir=tmp_path / "s")
    assert [d.outcome for d in execute.handle([alert()])] == [Outcome.ACTED] * 2
    assert fake.calls == [] and [c[0] for c in fake2.calls] == ["drain", "requeue"]


def test_decided_actions_are_forgotten_after_the_longest_guardrail_window(make):
    engine, *_ = make(
        guardrails={"breaker": {"max_share": 1.0}, "rate_limit": {"actions": 100, "per": "1h"}}
    )
    for i in range(20):
        engine.handle([firing(f"t{i}", host=f"node{i + 1:02d}", job_id=str(i + 1))])
    assert _rows(engine, "actions") >= 20
    engine.clock.now += engine.policy.guardrails.history_span_s + 120
    engine.handle([])
    assert _rows(engine, "actions") == 0


def test_a_system_rules_notify_tells_the_owner_and_spends_no_attempt(make):
    engine, fake, owner, *_ = make(guardrails={"breaker": {"max_share": 1.0}})
    engine.policy = from_mapping(
        {
            "mode": "execute",
            "rules": [
                {"match": {"alertname": "JobHang", "class": "system"}, "actions": ["notify"]},
                *RULES,
            ],
            "guardrails": {"breaker": {"max_share": 1.0}},
            "cluster_nodes": 20,
        }
    )
    for i in range(5):
        hang = engine.handle([alert(name="JobHang", fp=f"h{i}", owner=f"u{i}", job_id=str(i))])
        assert [(d.action, d.outcome) for d in hang] == [(ActionKind.NOTIFY, Outcome.ACTED)]
    assert fake.calls == [] and len(owner.events) == 5
    straggler = engine.handle([alert(fp="s")])
    assert [d.outcome for d in straggler] == [Outcome.ACTED, Outcome.ACTED]

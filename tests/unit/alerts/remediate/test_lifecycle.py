"""The remediator's process lifecycle (an end-to-end red team of the real CLI found these):
a drain cut off by a kill counts in the breaker, one remediator per state dir, a stopping
remediator decides nothing more, a Prometheus that does not answer is not asked again at
once."""

from __future__ import annotations

import time

import pytest
from prometheus_client import CollectorRegistry

from stepwatch.alerts.remediate import guards
from stepwatch.alerts.remediate.actuators.base import LogActuator
from stepwatch.alerts.remediate.audit import Audit, Metrics
from stepwatch.alerts.remediate.engine import Remediator, RemediatorStopping
from stepwatch.alerts.remediate.outcome import Prometheus
from stepwatch.alerts.remediate.service import build
from stepwatch.alerts.remediate.state import State, Status
from stepwatch.errors import ConfigError
from stepwatch.settings import Settings
from tests.unit.alerts.remediate.test_boundary import XID_RULE, Died, Sent, alert, engine

pytestmark = pytest.mark.unit


def test_a_drain_cut_off_mid_call_counts_as_a_drain_and_keeps_its_alert_name(tmp_path):
    """scontrol outlives a kill -9 and drains the node anyway: recorded only as failed, the
    breaker never counted it (three drains sat in a window capped at two), and the row's
    alert name was ''."""
    eng, fake, *_ = engine(tmp_path, rules=[XID_RULE])

    def dies(node: str, reason: str) -> str:
        raise Died()

    fake.drain = dies  # type: ignore[method-assign]
    with pytest.raises(Died):
        eng.handle([alert(job="", name="GpuXidFatal")])
    again = Remediator(
        eng.policy, State(tmp_path / "s"), fake, Sent(), Sent(), Audit(Metrics(CollectorRegistry()))
    )
    (decision,) = again.recover_interrupted()
    assert (decision.reason, decision.alertname) == ("interrupted", "GpuXidFatal")
    (row,) = again.state.actions(Status.FAILED_PERMANENT)
    assert row.alertname == "GpuXidFatal" and "counted as a drain" in row.detail
    assert again.state.drained_nodes(0.0) == {"node02"}
    assert again.state.count(guards.REMEDIATION, 0.0, node="node02") == 1


def _settings(tmp_path, state: str = "s") -> Settings:
    policy = tmp_path / "policy.yaml"
    policy.write_text("mode: execute\ncluster_nodes: 10\nrules: []\n")
    return Settings.load(
        env={},
        remediate_policy=str(policy),
        remediate_state_dir=str(tmp_path / state),
        remediate_token="t",
    )


def test_one_remediator_per_state_dir(tmp_path):
    """Two on one state dir each ran the same drain and requeue, and a second that then
    failed to start had first recorded the running one's action interrupted."""
    first = build(_settings(tmp_path), port=0, actuator=LogActuator(10), writers=[])
    try:
        first.state.put_action(_started_row(first.state))
        with pytest.raises(ConfigError, match="another remediator uses it"):
            build(_settings(tmp_path), port=0, actuator=LogActuator(10), writers=[])
        (row,) = first.state.actions()
        assert row.status == Status.STARTED  # the running one's action left alone
    finally:
        first.stop()
    again = build(_settings(tmp_path), port=0, actuator=LogActuator(10), writers=[])
    again.stop()  # the lock went with the first one


def _started_row(state: State):  # type: ignore[no-untyped-def]
    from stepwatch.alerts.remediate.state import ActionRow

    now = time.time()
    return ActionRow(
        "drain-n1", "drain", "n1", "", "X", "f", Status.STARTED, 1, now, now, "r", "", "{}"
    )


def test_a_stopping_remediator_decides_nothing_more(tmp_path):
    """Webhooks waiting for the decision lock when the stop began started new scheduler
    calls up to the stop's limit, and were cut off there."""
    eng, fake, *_ = engine(tmp_path)
    eng.stopping.set()
    with pytest.raises(RemediatorStopping):
        eng.handle([alert()])
    with pytest.raises(RemediatorStopping):
        eng.approve("any", by="alice")
    assert fake.calls == []


def test_a_prometheus_that_did_not_answer_is_not_asked_again_at_once():
    """A stalled Prometheus cost each webhook its timeout in turn (six webhooks: 30 s)."""
    asked: list[str] = []

    class Stalled(Prometheus):
        def _fetch(self, url: str) -> bytes:
            asked.append(url)
            raise TimeoutError("no whole answer within 5 s")

    prom = Stalled("http://prometheus:9090", down_s=30.0)
    assert [prom.series("ALERTS", "test") for _ in range(6)] == [None] * 6
    assert len(asked) == 1
    prom._down_until = 0.0  # the time is up: asked again
    assert prom.series("ALERTS", "test") is None and len(asked) == 2

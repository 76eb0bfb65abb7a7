"""Operator credentials apart from the webhook's: the token Alertmanager holds neither approves
nor closes the breaker, and the operator recorded is the one whose token came, not a header."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import pytest

from stepwatch.alerts.remediate.actuators.base import LogActuator
from stepwatch.alerts.remediate.client import Client
from stepwatch.alerts.remediate.operators import Operators, parse
from stepwatch.alerts.remediate.service import Service, build, read_operator_token
from stepwatch.errors import ConfigError, RemediationError
from stepwatch.settings import Settings

pytestmark = pytest.mark.unit
WEBHOOK_TOKEN = "alertmanager-holds-this"
ALICE, BOB = "alice-operator-token", "bob-operator-token"
POLICY = (
    "mode: execute\ncluster_nodes: 10\nrules:\n"
    "  - match: {alertname: GpuXidFatal}\n    actions: [drain]\n    approval: true\n"
    "    scope: node\n"
)


class Records:
    """An audit writer that keeps what it is given."""

    name = "records"

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []

    def write(self, records: list[dict[str, Any]]) -> None:
        self.records.extend(records)

    def close(self) -> None:
        pass


def start(tmp_path, operators: str | None, writers: list[Any] | None = None) -> Service:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    extra = {}
    if operators is not None:
        (tmp_path / "operators").write_text(operators)
        extra["remediate_operators_file"] = str(tmp_path / "operators")
    settings = Settings.load(
        env={},
        remediate_policy=str(policy),
        remediate_state_dir=str(tmp_path / "s"),
        remediate_token=WEBHOOK_TOKEN,
        **extra,
    )
    return build(settings, port=0, actuator=LogActuator(10), writers=writers or [])


@pytest.fixture()
def service(tmp_path):
    made: list[Service] = []

    def make(operators: str | None = f"alice:{ALICE}\nbob:{BOB}\n", **kwargs: Any) -> Service:
        made.append(start(tmp_path, operators, **kwargs))
        return made[-1]

    yield make
    for svc in made:
        svc.stop()


def call(
    url: str, token: str, body: bytes | None = b"", headers: dict[str, str] | None = None
) -> tuple[int, Any]:
    req = urllib.request.Request(
        url,
        data=body,
        method="POST" if body is not None else "GET",
        headers={"Authorization": f"Bearer {token}", **(headers or {})},
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"null")


def queue_a_drain(svc: Service, host: str = "n1") -> str:
    body = {
        "version": "4",
        "status": "firing",
        "alerts": [
            {
                "status": "firing",
                "fingerprint": f"fp-{host}",
                "labels": {"alertname": "GpuXidFatal", "host": host, "class": "system"},
            }
        ],
    }
    code, answer = call(svc.url + "/webhook", WEBHOOK_TOKEN, json.dumps(body).encode())
    assert code == 200 and answer["decisions"][0]["outcome"] == "queued", answer
    return str(answer["decisions"][0]["id"])


def queued(svc: Service) -> list[str]:
    return [r.id for r in svc.state.actions("queued")]


def test_the_webhook_token_approves_nothing_and_closes_no_breaker(service):
    """Whoever holds Alertmanager's token (or reads it off the Alertmanager host) tries to
    run a queued drain and to close an open breaker with it, posing as the on-call."""
    svc = service()
    action = queue_a_drain(svc)
    posing = {"X-Stepwatch-User": "oncall-alice"}
    code, answer = call(f"{svc.url}/api/approve/{action}", WEBHOOK_TOKEN, headers=posing)
    assert code == 403 and "not an operator credential" in answer["error"]
    assert queued(svc) == [action] and svc.server.remediator.actuator.drained == {}
    svc.state.set_breaker(True, 1.0, "tripped: 3 of 10 nodes")
    code, _ = call(f"{svc.url}/api/close-breaker", WEBHOOK_TOKEN, headers=posing)
    assert code == 403 and svc.state.breaker().open
    for path in ("/api/actions", "/api/breaker", "/api/outcomes"):
        assert call(svc.url + path, WEBHOOK_TOKEN, body=None)[0] == 403, path
    metrics = urllib.request.urlopen(svc.url + "/metrics").read().decode()
    assert 'stepwatch_remediator_requests_rejected_total{code="403"} 5.0' in metrics


def test_the_audit_names_the_operator_whose_token_came_not_a_header(service):
    audit = Records()
    svc = service(writers=[audit])
    action = queue_a_drain(svc)
    posing = {"X-Stepwatch-User": "alice"}  # bob presents his own token, says he is alice
    code, decision = call(f"{svc.url}/api/approve/{action}", BOB, headers=posing)
    assert code == 200 and decision["outcome"] == "acted"
    assert decision["detail"].startswith("approval by bob: ") and "alice" not in decision["detail"]
    row = svc.state.action(action)
    assert row is not None and row.detail.startswith("approval by bob: ")
    svc.audit.close()  # flushes the audit queue
    acted = [r for r in audit.records if r["id"] == action and r["outcome"] == "acted"]
    assert len(acted) == 1 and acted[0]["detail"].startswith("approval by bob: ")
    svc.state.set_breaker(True, 1.0, "tripped")
    code, answer = call(f"{svc.url}/api/close-breaker", BOB, headers=posing)
    assert code == 200 and answer == {"was_open": True, "open": False}
    assert svc.state.breaker().reason == "closed by bob"


def test_without_operators_every_operator_endpoint_refuses(service):
    svc = service(operators=None)
    action = queue_a_drain(svc)
    for token in (WEBHOOK_TOKEN, ALICE):
        code, answer = call(f"{svc.url}/api/approve/{action}", token)
        assert code == 403 and "remediate_operators_file" in answer["error"]
        assert call(f"{svc.url}/api/close-breaker", token)[0] == 403
        assert call(svc.url + "/api/actions", token, body=None)[0] == 403
    assert queued(svc) == [action]  # still waiting for a person


def test_an_operator_token_is_no_webhook_credential_and_a_wrong_one_is_401(service):
    svc = service()
    body = json.dumps({"version": "4", "alerts": []}).encode()
    assert call(svc.url + "/webhook", ALICE, body)[0] == 401
    assert call(svc.url + "/api/actions", "guess", body=None)[0] == 401
    assert call(svc.url + "/api/actions", ALICE, body=None)[0] == 200


def test_the_cli_client_uses_the_operators_own_token(service):
    svc = service()
    action = queue_a_drain(svc)
    with pytest.raises(RemediationError, match="403"):
        Client(svc.url, WEBHOOK_TOKEN).approve(action)
    assert Client(svc.url, ALICE).approve(action)["detail"].startswith("approval by alice")


def test_an_operator_token_equal_to_the_webhook_token_is_refused_at_start(tmp_path):
    with pytest.raises(ConfigError, match="webhook token"):
        start(tmp_path, f"alice:{ALICE}\nmallory:{WEBHOOK_TOKEN}\n")


@pytest.mark.parametrize(
    "text, message",
    [
        ("alice\n", "line 1: expected name:token"),
        ("alice:\n", "line 1: expected name:token"),
        ("# ops\n\nbad name:tok\n", "line 3: operator name 'bad name'"),
        ("alice:a b\n", "line 1: a token has no spaces"),
        ("alice:t1\nalice:t2\n", "listed twice: alice"),
        ("alice:same\nbob:same\n", "share a token: alice, bob"),
    ],
)
def test_operators_file_errors_are_one_line_without_the_token(text, message):
    with pytest.raises(ConfigError, match=message) as err:
        parse(text, "ops")
    assert "same" not in str(err.value) and "t2" not in str(err.value)


def test_operators_file_lines_and_constant_time_lookup():
    found = parse("# who may approve\nalice:a-token\n\n bob : b:token \n", "ops")
    assert found.names() == ("alice", "bob")
    assert found.who("Bearer a-token") == "alice" and found.who("bearer b:token") == "bob"
    assert found.who("Bearer b") is None and found.who("Basic a-token") is None
    assert found.who(None) is None and Operators().who("Bearer a-token") is None


def test_operator_settings_flag_over_env_over_default(tmp_path):
    env = {"STEPWATCH_REMEDIATE_OPERATORS_FILE": "/from/env"}
    assert Settings.load(env=env).remediate_operators_file == "/from/env"
    assert Settings.load(env=env, remediate_operators_file="x").remediate_operators_file == "x"
    assert Settings.load(env={}).remediate_operators_file == ""
    mine = tmp_path / "mine"
    mine.write_text(f"{ALICE}\n")
    both = Settings.load(
        env={"STEPWATCH_REMEDIATE_OPERATOR_TOKEN": "from-env"},
        remediate_operator_token_file=str(mine),
    )
    assert read_operator_token(both) == ALICE
    with pytest.raises(ConfigError, match="remediate_operator_token_file"):
        read_operator_token(Settings.load(env={}, remediate_token=WEBHOOK_TOKEN))

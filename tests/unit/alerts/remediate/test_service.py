"""The remediator's HTTP face and actuators: auth, bad bodies, API; Slurm and Kubernetes
backends."""

from __future__ import annotations

import json
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from types import SimpleNamespace
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from stepwatch.alerts.remediate.actuators.base import LogActuator
from stepwatch.alerts.remediate.actuators.kube import REASON_ANNOTATION, TAINT_KEY, KubeActuator
from stepwatch.alerts.remediate.actuators.slurm import SlurmActuator
from stepwatch.alerts.remediate.client import Client
from stepwatch.alerts.remediate.service import build
from stepwatch.alerts.remediate.state import State
from stepwatch.errors import ActuatorError, RemediationError
from stepwatch.settings import Settings

pytestmark = pytest.mark.unit
TOKEN = "unit-token"
OPERATOR_TOKEN = "unit-operator-token"


@pytest.fixture()
def service(tmp_path):
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        "mode: execute\ncluster_nodes: 10\nrules:\n"
        "  - match: {alertname: GpuXidFatal}\n    actions: [drain]\n    approval: true\n"
        "    scope: node\n"
    )
    operators = tmp_path / "operators"
    operators.write_text(f"ops:{OPERATOR_TOKEN}\n")
    settings = Settings.load(
        env={},
        remediate_policy=str(policy),
        remediate_state_dir=str(tmp_path / "s"),
        remediate_token=TOKEN,
        remediate_operators_file=str(operators),
    )
    svc = build(settings, port=0, actuator=LogActuator(10), writers=[])
    yield svc
    svc.stop()


def post(url: str, body: bytes, token: str | None = TOKEN) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    req = urllib.request.Request(url, data=body, method="POST", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, None


def oversized(base: str, size: int) -> bytes:
    """Announce a too-large body and send none of it: refused from the headers alone."""
    host, port = base.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(
            f"POST /webhook HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
            f"Content-Length: {size}\r\n\r\n".encode()
        )
        return sock.recv(200)


def webhook(**labels: str) -> bytes:
    return json.dumps(
        {
            "version": "4",
            "status": "firing",
            "alerts": [
                {
                    "status": "firing",
                    "fingerprint": "abc",
                    "labels": {
                        "alertname": "GpuXidFatal",
                        "host": "n1",
                        "class": "system",
                        **labels,
                    },
                }
            ],
        }
    ).encode()


def test_webhook_auth_bad_bodies_and_oversize(service):
    url = service.url + "/webhook"
    assert post(url, webhook(), token=None)[0] == 401
    assert post(url, webhook(), token="wrong")[0] == 401
    assert post(url, b"{not json")[0] == 400
    assert post(url, json.dumps({"version": "3", "alerts": []}).encode())[0] == 400
    assert post(url, json.dumps({"version": "4", "alerts": [{"labels": {}}]}).encode())[0] == 400
    assert oversized(service.url, 2 * 1024 * 1024).startswith(b"HTTP/1.1 413")
    metrics = urllib.request.urlopen(service.url + "/metrics").read().decode()
    assert 'stepwatch_remediator_requests_rejected_total{code="401"} 2.0' in metrics
    assert urllib.request.urlopen(service.url + "/healthz").status == 200
    code, body = post(url, webhook())  # still serving after all that
    assert code == 200 and body["decisions"][0]["outcome"] == "queued"


def test_a_chunked_body_is_refused_not_left_to_be_read_as_the_next_request(service):
    # before: no Content-Length, so 0 bytes were read and the chunked body that followed
    # on the kept-alive connection was parsed as a second request
    host, port = service.url.removeprefix("http://").split(":")
    smuggled = f"GET /api/actions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n\r\n"
    chunk = f"{len(smuggled):x}\r\n{smuggled}\r\n0\r\n\r\n"
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(
            f"POST /webhook HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
            f"Transfer-Encoding: chunked\r\n\r\n{chunk}".encode()
        )
        sock.settimeout(5)
        reply = b""
        while True:
            part = sock.recv(4096)
            if not part:
                break
            reply += part
    assert reply.startswith(b"HTTP/1.1 411") and reply.count(b"HTTP/1.1 ") == 1


def test_cli_client_lists_approves_and_closes_the_breaker(service):
    post(service.url + "/webhook", webhook())
    api = Client(service.url, OPERATOR_TOKEN)
    queued = api.actions("queued")["actions"]
    assert [a["kind"] for a in queued] == ["drain"]
    assert api.approve(queued[0]["id"])["outcome"] == "acted"
    with pytest.raises(RemediationError, match="404"):
        api.approve(queued[0]["id"])
    assert api.close_breaker() == {"was_open": False, "open": False}
    with pytest.raises(RemediationError, match="401"):
        Client(service.url, "nope").actions()


def fake_runner(answers: dict[str, tuple[int, str]], calls: list[list[str]]):
    def run(argv, timeout, env):
        calls.append(list(argv))
        key = " ".join(argv[1:3])
        code, text = answers.get(key, (0, ""))
        return subprocess.CompletedProcess(
            argv, code, text if code == 0 else "", text if code else ""
        )

    return run


def test_slurm_actuator_commands_and_failure_kinds():
    calls: list[list[str]] = []
    answers = {
        "show node": (
            0,
            "NodeName=n1 Arch=x86_64 State=IDLE+DRAIN ThreadsPerCore=1 "
            "Reason=stepwatch: straggler cause gpu [root@2026-01-01T00:00:00]",
        ),
        "--noheader --array": (0, "7|7|ada|RUNNING|n[1-3]|n4\n"),
        "show hostnames": (0, "n4\n"),  # the job's own exclusions, expanded by Slurm
    }
    slurm = SlurmActuator(runner=fake_runner(answers, calls))
    state = slurm.node_state("n1")
    assert state.drained_by_stepwatch and state.reason == "stepwatch: straggler cause gpu"
    assert slurm.job_owner("7") == "ada"
    slurm.drain("n2", "stepwatch: x")
    assert calls[-1][1:] == ["update", "nodename=n2", "state=drain", "reason=stepwatch: x"]
    slurm.requeue("7", "n2")
    assert calls[-4][1:] == ["show", "hostnames", "n4"]
    assert [c[1] for c in calls[-3:]] == ["requeuehold", "update", "release"]
    assert calls[-2][2:] == ["jobid=7", "ExcNodeList=n2,n4"]
    busy = SlurmActuator(
        runner=fake_runner({"update nodename=n3": (1, "Unable to contact slurm controller")}, [])
    )
    with pytest.raises(ActuatorError) as err:
        busy.drain("n3", "r")
    assert err.value.transient
    bad = SlurmActuator(
        runner=fake_runner({"update nodename=n3": (1, "Invalid node name specified")}, [])
    )
    with pytest.raises(ActuatorError) as err:
        bad.drain("n3", "r")
    assert not err.value.transient


@pytest.mark.parametrize(
    ("shown", "out_of_service"),
    [
        # as a real slurmctld wrote it 50 s after node02's slurmd was killed (SlurmUser root)
        ("State=DOWN+NOT_RESPONDING Reason=Not responding [root@2026-12-04T15:44:31]", False),
        (
            "State=DOWN* Reason=Node unexpectedly rebooted boot_time=1796397000 "
            "last response=1796396900 [slurm@2026-12-04T15:44:31]",
            False,
        ),
        ("State=DOWN+NOT_RESPONDING Reason=bob: GPU4 RMA [bob@2026-12-04T15:44:31]", True),
        # a person's reason that begins with slurmctld's words, or a FAIL/MAINT, is theirs
        ("State=DOWN Reason=Node unexpectedly rebooted 3x - bob RMA [bob@2026-12-04]", True),
        ("State=DOWN* Reason=Not responding to IPMI; alice on it [alice@2026-12-04]", True),
        ("State=DOWN+MAINT+RESERVED+NOT_RESPONDING Reason=Not responding [root@2026-12-04]", True),
        ("State=IDLE+FAIL+NOT_RESPONDING Reason=Not responding [alice@2026-12-04]", True),
        ("State=IDLE+FAIL Reason=alice: DIMM [alice@2026-12-04T15:44:31]", True),
        ("State=DOWN+DRAIN+NOT_RESPONDING Reason=Not responding [root@2026-12-04T15:44:31]", True),
    ],
)
def test_slurmctlds_own_down_is_no_persons_word(shown: str, out_of_service: bool) -> None:
    """A node that stopped answering is set DOWN by slurmctld: an alert for it (a hung GPU
    node) must still drain it, or ReturnToService puts the faulty GPU back in service."""
    answers = {"show node": (0, f"NodeName=n1 Arch=x86_64 {shown}")}
    state = SlurmActuator(runner=fake_runner(answers, [])).node_state("n1")
    assert state.drained is out_of_service and not state.drained_by_stepwatch


def test_a_persons_cordon_after_an_uncordon_is_not_read_as_stepwatchs():
    """``kubectl uncordon`` leaves the reason annotation: a person who took stepwatch's
    taint off and later cordoned the node for maintenance had the cordon read as
    stepwatch's (``drained_by_stepwatch``), so the remediator drained it again and
    deleted the job's pods there. Without the taint the cordon is the person's."""
    core = FakeCore()
    kube = KubeActuator(core)
    kube.drain("n1", "stepwatch: xid 79")
    node = core.nodes["n1"]
    node.spec.unschedulable = False  # kubectl uncordon n1
    node.spec.taints = []  # kubectl taint nodes n1 stepwatch.io/remediation-
    assert not kube.node_state("n1").drained
    node.spec.unschedulable = True  # kubectl cordon n1, weeks later
    state = kube.node_state("n1")
    assert state.drained and not state.drained_by_stepwatch and state.reason == ""
    assert node.metadata.annotations[REASON_ANNOTATION] == "stepwatch: xid 79"  # still there


class FakeCore:
    """CoreV1Api's methods the actuator uses, over the client's own model objects."""

    def __init__(self) -> None:
        self.api_client = client.ApiClient()
        self.nodes = {
            "n1": client.V1Node(
                metadata=client.V1ObjectMeta(name="n1", annotations={}),
                spec=client.V1NodeSpec(unschedulable=False),
            )
        }
        self.patches: list[tuple[str, dict]] = []
        self.deleted: list[tuple[str, str]] = []
        self.fail: ApiException | None = None

    def read_node(self, name: str) -> client.V1Node:
        if name not in self.nodes:
            raise ApiException(status=404, reason="Not Found")
        return self.nodes[name]

    def list_node(self) -> Any:
        return SimpleNamespace(items=list(self.nodes.values()))

    def patch_node(self, name: str, body: dict) -> None:
        if self.fail:
            raise self.fail
        self.patches.append((name, body))
        node = self.nodes[name]
        node.spec.unschedulable = body["spec"]["unschedulable"]
        node.spec.taints = [client.V1Taint(**t) for t in body["spec"]["taints"]]
        node.metadata.annotations.update(body["metadata"]["annotations"])

    def list_pod_for_all_namespaces(self, label_selector: str, field_selector: str) -> Any:
        assert label_selector == "stepwatch.io/job-id=j1" and field_selector == "spec.nodeName=n1"
        pod = client.V1Pod(metadata=client.V1ObjectMeta(name="trainer-3", namespace="ml"))
        return client.V1PodList(items=[pod])

    def delete_namespaced_pod(self, name: str, namespace: str) -> None:
        self.deleted.append((namespace, name))


def test_kubernetes_actuator_cordons_taints_and_deletes_pods():
    core = FakeCore()
    kube = KubeActuator(core)
    assert kube.node_count() == 1 and not kube.node_state("n1").drained
    assert not kube.node_state("ghost").exists
    kube.drain("n1", "stepwatch: xid 79")
    _name, body = core.patches[0]
    assert body["spec"]["unschedulable"] is True
    assert body["spec"]["taints"] == [
        {"effect": "NoSchedule", "key": TAINT_KEY, "value": "stepwatch"}
    ]
    assert body["metadata"]["annotations"] == {REASON_ANNOTATION: "stepwatch: xid 79"}
    assert kube.node_state("n1").drained_by_stepwatch
    assert "1 pod" in kube.requeue("j1", "n1") and core.deleted == [("ml", "trainer-3")]
    core.fail = ApiException(status=503, reason="Unavailable")
    with pytest.raises(ActuatorError) as err:
        kube.drain("n1", "r")
    assert err.value.transient
    core.fail = ApiException(status=403, reason="Forbidden")
    with pytest.raises(ActuatorError) as err:
        kube.drain("n1", "r")
    assert not err.value.transient


class SlowDrain(LogActuator):
    """Drains take ``seconds`` (a busy slurmctld); ``started`` is set inside the call."""

    def __init__(self, seconds: float) -> None:
        super().__init__(10)
        self.seconds = seconds
        self.started = threading.Event()

    def drain(self, node: str, reason: str) -> str:
        self.started.set()
        time.sleep(self.seconds)
        return super().drain(node, reason)


def test_a_stop_lets_a_drain_in_progress_finish_and_takes_no_new_webhook(tmp_path):
    """A SIGTERM during a drain's scheduler call ended it mid-call: Alertmanager got no
    answer and the action's row said started (recorded interrupted at the next start)."""
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        "mode: execute\ncluster_nodes: 10\nrules:\n"
        "  - match: {alertname: GpuXidFatal}\n    actions: [drain]\n    scope: node\n"
    )
    settings = Settings.load(
        env={},
        remediate_policy=str(policy),
        remediate_state_dir=str(tmp_path / "s"),
        remediate_token=TOKEN,
    )
    slow = SlowDrain(1.5)
    svc = build(settings, port=0, actuator=slow, writers=[])
    answers: list[tuple[int, Any]] = []
    sender = threading.Thread(target=lambda: answers.append(post(svc.url + "/webhook", webhook())))
    sender.start()
    assert slow.started.wait(10)
    stopper = threading.Thread(target=svc.stop)
    stopper.start()
    while not svc.server.stopping:
        time.sleep(0.01)
    assert not svc.server.begin()  # a request on a kept-alive connection: 503
    stopper.join(30)
    sender.join(10)
    assert answers and answers[0][0] == 200, answers
    assert [d["outcome"] for d in answers[0][1]["decisions"]] == ["acted"]
    assert list(slow.drained) == ["n1"]
    state = State(tmp_path / "s")
    try:
        assert [r.status for r in state.actions()] == ["done"]
    finally:
        state.close()

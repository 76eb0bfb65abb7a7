"""The remediator's question to Prometheus before a drain or requeue (``confirm.py``).

The engine runs as in ``test_boundary.py`` with its Prometheus answers swapped for a
recorded list of ``ALERTS`` label sets (the labels a real Prometheus answers with), or a
real HTTP server that trickles its answer. Real Prometheus end to end:
``tests/integration/alerts/remediate/test_confirm.py``.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from stepwatch.alerts.remediate.confirm import Confirmations, FiringNow, Series, decision_labels
from stepwatch.alerts.remediate.model import Alert, Mode, Outcome
from stepwatch.alerts.remediate.outcome import promql_string
from stepwatch.alerts.remediate.policy import from_mapping
from stepwatch.alerts.remediate.state import Status
from stepwatch.errors import ActuatorError
from tests.unit.alerts.remediate.test_boundary import alert, engine

pytestmark = pytest.mark.unit
RULES = [
    {
        "match": {"alertname": "StragglerPersistent", "class": "system", "remediation": "drain"},
        "actions": ["drain", "requeue"],
    }
]
FIRING = {
    "__name__": "ALERTS",
    "alertstate": "firing",
    "alertname": "StragglerPersistent",
    "host": "node02",
    "job_id": "42",
    "cause": "gpu",
    "class": "system",
    "remediation": "drain",
}


def sent(**labels: str) -> Alert:
    """The alert as a webhook carries it: Prometheus's labels plus an external one."""
    base = alert()
    merged = {**base.labels, "class": "system", "remediation": "drain", "cluster": "eu-1"}
    return Alert(base.fingerprint, "firing", {**merged, **labels})


class Answers:
    """Prometheus's answers in turn (None: no answer), and the alerts asked about."""

    def __init__(self, *answers: Series | None) -> None:
        self.answers = list(answers)
        self.asked: list[Alert] = []

    def __call__(self, alert: Alert) -> Series | None:
        self.asked.append(alert)
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]


def judged(tmp_path, answers: Answers, *alerts: Alert, **guardrails: Any):
    eng, fake, *_ = engine(tmp_path, rules=RULES, **guardrails)
    eng.firing = answers
    return eng, fake, eng.handle(list(alerts))


def test_the_alert_prometheus_fires_is_acted_on(tmp_path):
    _eng, fake, decisions = judged(tmp_path, Answers([FIRING]), sent())
    assert {d.reason for d in decisions} == {"executed"}
    assert fake.calls == [("drain", "node02"), ("requeue", "42")]


@pytest.mark.parametrize(
    "fired, labels, differ",
    [
        # a real notify-only straggler (data loader; a user fault) re-sent as a drain
        ({"class": "system", "remediation": "notify"}, {}, "remediation"),
        ({"class": "user", "remediation": "notify"}, {}, "class, remediation"),
        # a real alert whose opt-out label the sender left out
        ({"stepwatch_opt_out": "true"}, {}, "stepwatch_opt_out"),
        # nothing fires for this host and job
        (None, {}, ""),
    ],
)
def test_a_webhook_that_differs_from_prometheus_in_a_deciding_label_is_refused(
    tmp_path, fired, labels, differ
):
    series = [] if fired is None else [{**FIRING, **fired}]
    _eng, fake, decisions = judged(tmp_path, Answers(series), sent(**labels))
    assert {(d.outcome, d.reason) for d in decisions} == {(Outcome.SKIPPED, "not_firing")}
    assert all(differ in d.detail for d in decisions), decisions[0].detail
    assert fake.calls == []


def test_labels_nothing_decides_on_may_differ():
    """Prometheus's external labels reach Alertmanager, not ALERTS: not compared."""
    policy = from_mapping({"rules": RULES})
    keys = decision_labels(policy)
    assert {"alertname", "host", "job_id", "class", "remediation", "stepwatch_opt_out"} <= keys
    assert "cluster" not in keys and "cause" not in keys and "severity" not in keys


def test_prometheus_is_asked_once_per_alert_and_not_again_once_it_failed(tmp_path):
    answers = Answers(None)
    others = [sent(host=f"node0{i}") for i in range(3, 8)]
    _eng, fake, decisions = judged(tmp_path, answers, sent(), *others)
    assert {d.reason for d in decisions} == {"firing_unconfirmed"}
    assert len(answers.asked) == 1 and fake.calls == []
    cache = Confirmations(Answers([FIRING]))
    assert cache.series(sent()) == cache.series(sent()) == [FIRING]
    assert len(cache.ask.asked) == 1  # type: ignore[attr-defined]


def test_an_approval_prometheus_cannot_confirm_stays_queued(tmp_path):
    """A Prometheus blip at approval time made the action rejected for good, and the
    alert's repeats were duplicates: the node was never drained."""
    eng, fake, *_ = engine(tmp_path, mode=Mode.RECOMMEND, rules=RULES)
    eng.firing = Answers([FIRING])
    queued = eng.handle([sent()])
    assert {d.outcome for d in queued} == {Outcome.QUEUED}
    eng.mode = Mode.EXECUTE
    eng.firing = Answers(None)
    first = queued[0].action_id
    deferred = eng.approve(first, by="alice")
    assert deferred is not None and deferred.reason == "firing_unconfirmed"
    row = eng.state.action(first)
    assert row is not None and row.status == Status.QUEUED and fake.calls == []
    eng.firing = Answers([FIRING])
    done = eng.approve(first, by="alice")
    assert done is not None and done.outcome is Outcome.ACTED
    assert fake.calls == [("drain", "node02")]


def test_an_approval_after_the_alert_stopped_firing_is_refused_for_good(tmp_path):
    eng, fake, *_ = engine(tmp_path, mode=Mode.RECOMMEND, rules=RULES)
    eng.firing = Answers([FIRING])
    first = eng.handle([sent()])[0].action_id
    eng.mode = Mode.EXECUTE
    eng.firing = Answers([])
    refused = eng.approve(first, by="alice")
    assert refused is not None and refused.reason == "not_firing"
    row = eng.state.action(first)
    assert row is not None and row.status == Status.REJECTED and fake.calls == []


def _trickling_prometheus() -> tuple[ThreadingHTTPServer, list[str]]:
    """Answers 200 with a long body, one byte every 0.2 s (a stalled Prometheus or proxy)."""
    asked: list[str] = []

    class Trickle(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            asked.append(self.path)
            self.send_response(200)
            self.send_header("Content-Length", "1000")
            self.end_headers()
            try:
                for _ in range(100):
                    self.wfile.write(b" ")
                    self.wfile.flush()
                    time.sleep(0.2)
            except OSError:
                pass

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Trickle)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, asked


def test_a_trickling_prometheus_costs_one_timeout_per_webhook(tmp_path):
    """Each socket read came within the 5 s timeout, so one query took the whole trickle
    (20 s here) under the decision lock, and each alert of the webhook asked again."""
    server, asked = _trickling_prometheus()
    try:
        eng, fake, *_ = engine(tmp_path, rules=RULES)
        eng.firing = FiringNow(f"http://127.0.0.1:{server.server_address[1]}", timeout=0.5)
        began = time.monotonic()
        decisions = eng.handle([sent(), sent(host="node03"), sent(host="node04")])
        took = time.monotonic() - began
    finally:
        server.shutdown()
        server.server_close()
    assert {d.reason for d in decisions} == {"firing_unconfirmed"} and fake.calls == []
    assert len(asked) == 1
    assert took < 10  # one 0.5 s timeout; the trickle alone lasts 20 s


def test_an_approval_of_a_job_that_runs_on_no_node_is_refused_for_good(tmp_path):
    """A finished job's action, deferred like a blip, stayed queued with no way to clear it."""
    eng, fake, *_ = engine(tmp_path, mode=Mode.RECOMMEND, rules=RULES)
    eng.firing = Answers([FIRING])
    first = eng.handle([sent()])[0].action_id
    eng.mode = Mode.EXECUTE
    fake.jobs["42"] = frozenset()  # the job finished
    refused = eng.approve(first, by="alice")
    assert refused is not None and refused.reason == "job_not_running"
    row = eng.state.action(first)
    assert row is not None and row.status == Status.REJECTED


def _answering(reply: bytes) -> socket.socket:
    """A port that answers every connection with ``reply`` (not always HTTP)."""
    server = socket.create_server(("127.0.0.1", 0))

    def loop() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:  # the test closed the socket
                return
            with conn:
                conn.recv(65536)
                conn.sendall(reply)

    threading.Thread(target=loop, daemon=True).start()
    return server


@pytest.mark.parametrize(
    "reply",
    [
        b"garbage\r\n\r\n",  # BadStatusLine
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n100\r\n{",  # IncompleteRead
        b"HTTP/1.1 200 OK\r\nX: " + b"a" * 70000 + b"\r\n\r\n",  # LineTooLong
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n[]",  # JSON, not Prometheus's
    ],
    ids=["status-line", "truncated-chunk", "long-header", "not-a-vector"],
)
def test_an_answer_that_is_not_prometheus_is_no_answer(tmp_path, reply):
    """http.client's own errors escaped the query: the webhook answered 500 and the rest
    of its alerts were never decided."""
    server = _answering(reply)
    try:
        eng, fake, *_ = engine(tmp_path, rules=RULES)
        eng.firing = FiringNow(f"http://127.0.0.1:{server.getsockname()[1]}", timeout=2)
        decisions = eng.handle([sent()])
    finally:
        server.close()
    assert {d.reason for d in decisions} == {"firing_unconfirmed"} and fake.calls == []


def test_a_query_thread_that_cannot_start_gives_its_slot_back(monkeypatch):
    """Two failed thread starts took both slots for good: every later question went
    unanswered and every drain was firing_unconfirmed."""
    ask = FiringNow("http://127.0.0.1:9", timeout=0.5)  # nothing listens: a quick refusal

    def cannot(self: threading.Thread) -> None:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading.Thread, "start", cannot)
    assert ask(sent()) is None and ask(sent()) is None and ask(sent()) is None
    monkeypatch.undo()
    assert ask._slots.acquire(blocking=False) and ask._slots.acquire(blocking=False)


def test_a_forged_alert_for_a_repeat_offender_pages_no_one(tmp_path):
    """The repeat-offender check ran before Prometheus was asked: a made-up alert for a
    node remediated three times paged the on-call."""
    eng, _fake, pager, clock, _ = engine(
        tmp_path, rules=RULES, cooldown={"node": 0, "job": 0}, repeat_offender={"count": 1}
    )
    eng.firing = Answers([FIRING])
    assert {d.reason for d in eng.handle([sent()])} == {"executed"}
    eng.firing = Answers([])  # Prometheus fires nothing now
    clock.now += 60
    forged = Alert("other", "firing", sent().labels, {}, "2026-11-25T17:00:00Z")
    assert {d.reason for d in eng.handle([forged])} == {"not_firing"}
    assert pager.events == []


def test_names_past_the_basic_plane_are_quoted_as_prometheus_reads_them():
    """JSON's surrogate pairs (\\ud83d\\ude00) are no Go escape: Prometheus refused the query."""
    assert promql_string("gpu\U0001f600") == '"gpu\U0001f600"'
    assert promql_string('a"b\\c\n') == '"a\\"b\\\\c\\n"'


@pytest.mark.parametrize(
    "scheduler, told",
    [
        ("bob", "bob"),
        ("", "alice"),
        (ActuatorError("squeue: Invalid job id", transient=False), "alice"),
    ],
    ids=["slurm-names-bob", "names-none", "forgotten-job"],
)
def test_the_owner_is_the_schedulers_else_the_label(tmp_path, scheduler, told):
    """The scheduler's owner of the job first; the ``owner`` label where it names none or
    no longer knows the job (Slurm forgets a finished job after MinJobAge)."""
    eng, fake, *_ = engine(tmp_path, rules=[{"match": {"class": "user"}, "actions": ["notify"]}])

    def owner(job_id: str) -> str:
        if isinstance(scheduler, Exception):
            raise scheduler
        return scheduler

    fake.job_owner = owner  # type: ignore[method-assign]
    user_error = Alert("u1", "firing", {**alert().labels, "class": "user", "owner": "alice"})
    decisions = eng.handle([user_error])
    assert {d.reason for d in decisions} == {"executed"}
    assert [e["to"] for e in eng.owner.events] == [told]  # type: ignore[attr-defined]


def test_a_question_prometheus_refuses_does_not_make_it_down(tmp_path):
    """Prometheus answers 400 to a query it cannot parse: that was taken for Prometheus
    down (15 s, and the rest of the webhook unasked), so one alert sent with such a name
    had every real alert refused ``firing_unconfirmed`` meanwhile."""
    asked: list[str] = []

    class Prom(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            asked.append(self.path)
            if "bogus" in self.path:
                self.send_response(400)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            result = [{"metric": FIRING, "value": [0, "1"]}]
            body = json.dumps({"status": "success", "data": {"result": result}}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Prom)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        rules = [{"match": {"class": "system", "remediation": "drain"}, "actions": ["drain"]}]
        eng, fake, *_ = engine(tmp_path, rules=rules)
        eng.firing = FiringNow(f"http://127.0.0.1:{server.server_address[1]}")
        bogus = Alert("b", "firing", {**sent().labels, "alertname": "bogus"})
        decisions = eng.handle([bogus, sent()])
    finally:
        server.shutdown()
        server.server_close()
    assert [d.reason for d in decisions] == ["firing_unconfirmed", "executed"]
    assert len(asked) == 2 and fake.calls == [("drain", "node02")]

"""Red-team attacks on the HTTP boundaries and the contract's identity fields.

Each test drives the real service (the remediator as ``stepwatch remediate
serve`` builds it, the alert receiver with a recording publisher) and failed
before its fix (docs/security.md, "Boundary 3" and "Boundary 2").
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from stepwatch.alerts.receiver import AlertReceiver
from stepwatch.alerts.remediate.service import Service
from stepwatch.contract.ops import AlertRecord
from tests.support.remediator_http import TOKEN, alert, send, start

pytestmark = pytest.mark.integration
CAP = 256  # stepwatch.httpd.MAX_CONNECTIONS: connections a server serves at once


@pytest.fixture()
def remediator(tmp_path) -> Iterator[Service]:
    svc = start(tmp_path, mode="observe")
    yield svc
    svc.stop()


@pytest.fixture()
def receiver() -> Iterator[tuple[AlertReceiver, list[list[AlertRecord]]]]:
    got: list[list[AlertRecord]] = []
    recv = AlertReceiver(got.append, TOKEN).start()
    yield recv, got
    recv.stop()


def _address(url: str) -> tuple[str, int]:
    host, _, port = url.removeprefix("http://").partition(":")
    return host, int(port)


def _post(url: str, path: str, body: bytes) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection(*_address(url), timeout=30)
    try:
        conn.request(
            "POST",
            path,
            body,
            {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
        )
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def _closed_within(sock: socket.socket, seconds: float, trickle: bytes = b"") -> float | None:
    """Seconds until the server closes ``sock`` (None: still open), sending ``trickle``
    one byte at a time meanwhile (a slowloris)."""
    start = time.monotonic()
    sock.settimeout(0.25)
    i = 0
    while time.monotonic() - start < seconds:
        try:
            if sock.recv(4096) == b"":
                return time.monotonic() - start
        except TimeoutError:
            pass
        except OSError:
            return time.monotonic() - start
        if i < len(trickle):
            try:
                sock.send(trickle[i : i + 1])
            except OSError:
                return time.monotonic() - start
            i += 1
    return None


def test_slowloris_connections_are_capped_before_any_token_is_checked(remediator):
    """Before: one thread per connection without a cap, and a per-recv timeout, so 200
    half-sent requests held 200 threads for as long as they trickled."""
    host, port = _address(remediator.url)
    before = threading.active_count()
    socks = []
    try:
        for _ in range(400):
            s = socket.create_connection((host, port), timeout=5)
            s.sendall(b"POST /webhook HTTP/1.1\r\nHost: x\r\n")  # never finished
            socks.append(s)
        time.sleep(1.0)
        assert threading.active_count() - before <= CAP + 2
    finally:
        for s in socks:
            s.close()
    time.sleep(0.5)  # the held slots free as their clients go
    code, body = _post(
        remediator.url,
        "/webhook",
        json.dumps({"version": "4", "alerts": [alert("gpu-001")]}).encode(),
    )
    assert code == 200, body


def test_a_request_trickled_byte_by_byte_is_dropped_at_its_deadline(remediator):
    """Before: each byte reset the 30 s per-recv timeout, so a client sending one byte
    every quarter second held its thread for ever."""
    handler = remediator.server.httpd.RequestHandlerClass
    handler.request_seconds = 2.0  # type: ignore[attr-defined]
    with socket.create_connection(_address(remediator.url), timeout=5) as s:
        took = _closed_within(s, 8.0, trickle=b"POST /webhook HTTP/1.1\r\n" + b"X-A: b\r\n" * 20)
    assert took is not None and took < 4.0
    decisions = send(remediator, [alert("gpu-001")])  # the service goes on
    assert decisions


def _target(request: pytest.FixtureRequest, target: str) -> tuple[str, str, list]:
    """(url, webhook path, the alerts it recorded) of the receiver or the remediator."""
    if target == "receiver":
        recv, got = request.getfixturevalue("receiver")
        return recv.url, "/alerts", got
    return request.getfixturevalue("remediator").url, "/webhook", []


@pytest.mark.parametrize("target", ["receiver", "remediator"])
def test_a_deeply_nested_json_body_is_a_400(request, target):
    """Before: ``json.loads`` raised RecursionError, which the receiver did not catch
    (the connection dropped with a traceback) and the remediator answered 500."""
    url, path, got = _target(request, target)
    code, body = _post(url, path, b"[" * 200_000)
    assert code == 400, body
    assert got == []


def _exchange(url: str, request_line: str, token: str, rest: str) -> bytes:
    """Everything the server answers to one raw request, until it closes the connection."""
    with socket.create_connection(_address(url), timeout=10) as sock:
        head = f"{request_line} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n"
        sock.sendall((head + rest).encode())
        sock.settimeout(5)
        reply = b""
        while part := sock.recv(4096):
            reply += part
    return reply


@pytest.mark.parametrize("target", ["receiver", "remediator"])
def test_a_chunked_body_gets_one_411_not_a_second_request(request, target):
    """The receiver read a chunked body (no Content-Length) as empty, answered 400, and then
    parsed the chunk that followed on the kept-alive connection as a request of its own."""
    url, path, got = _target(request, target)
    payload = json.dumps({"version": "4", "alerts": [alert("node01")]})
    chunk = f"{len(payload):x}\r\n{payload}\r\n0\r\n\r\n"
    reply = _exchange(url, f"POST {path}", TOKEN, f"Transfer-Encoding: chunked\r\n\r\n{chunk}")
    assert reply.startswith(b"HTTP/1.1 411") and reply.count(b"HTTP/1.1 ") == 1, reply[:300]
    assert got == []


@pytest.mark.parametrize("target", ["receiver", "remediator"])
@pytest.mark.parametrize("refusal", ["wrong_token", "wrong_path"])
def test_a_body_refused_unread_is_not_read_as_a_second_request(request, target, refusal):
    """A 401 or 404 answered before the body was read left it on the kept-alive
    connection, where it was parsed as a request of its own (a 401, then a 200)."""
    url, path, got = _target(request, target)
    token = "wrong" if refusal == "wrong_token" else TOKEN
    path = path if refusal == "wrong_token" else "/other"
    smuggled = "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
    reply = _exchange(
        url, f"POST {path}", token, f"Content-Length: {len(smuggled)}\r\n\r\n{smuggled}"
    )
    assert reply.count(b"HTTP/1.1 ") == 1 and b" 200 " not in reply, reply[:300]
    assert got == []

"""The remediator's HTTP face (stdlib ``http.server``, one thread per request).

- ``POST /webhook`` (or ``/``): Alertmanager webhook, payload version 4.
- ``GET /api/actions[?status=queued]``, ``GET /api/outcomes``, ``POST /api/approve/<id>``,
  ``POST /api/close-breaker``, ``GET /api/breaker``: the operators' API (the CLI's).
- ``GET /metrics`` (Prometheus text), ``GET /healthz``.

Two credentials, each accepted in one place only (:mod:`.operators`): the
webhook needs ``Authorization: Bearer <webhook token>`` (what Alertmanager
holds); every ``/api/`` path needs an operator's own token, and the operator
recorded for an approval or a breaker close is the one whose token it is. The
webhook token on ``/api/`` is 403; with no operators configured every ``/api/``
request is 403 with the setting to fix. Tokens are compared in constant time
and never logged. A body over ``max_body`` bytes is refused with 413 before it
is read; bad JSON is 400; connections are capped and a request must arrive
whole in time (:mod:`stepwatch.httpd`); any other failure is 500 and logged —
the server keeps serving.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import asdict
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qs, urlsplit

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from stepwatch.alerts.remediate.audit import Metrics
from stepwatch.alerts.remediate.engine import Remediator, RemediatorStopping
from stepwatch.alerts.remediate.operators import Operators
from stepwatch.alerts.remediate.payload import PayloadError, parse
from stepwatch.httpd import DeadlineHandler, TokenHTTPService, body_refusal

log = logging.getLogger(__name__)

MAX_BODY = 1024 * 1024
API = "/api/"
DRAIN_SECONDS = 60.0  # a stop waits this long for requests in progress (a scheduler call)
NO_OPERATORS = (
    "no operator credentials are configured on the remediator: set remediate_operators_file "
    "(STEPWATCH_REMEDIATE_OPERATORS_FILE); the webhook token is not accepted here"
)


class RemediatorServer(TokenHTTPService):
    name = "remediator"

    def __init__(
        self,
        remediator: Remediator,
        token: str,
        registry: CollectorRegistry,
        metrics: Metrics,
        host: str = "127.0.0.1",
        port: int = 0,
        max_body: int = MAX_BODY,
        *,
        operators: Operators | None = None,
    ) -> None:
        self.remediator = remediator
        self.operators = operators or Operators()
        self.registry = registry
        self.metrics = metrics
        self.max_body = max_body
        self._busy = 0  # POSTs in progress (decisions, scheduler calls)
        self._idle = threading.Condition()
        self.stopping = False
        super().__init__(token, _handler(self), host, port)

    def start(self) -> RemediatorServer:
        super().start()
        log.info("remediator ready url=%s mode=%s", self.url, self.remediator.mode.value)
        return self

    def stop(self, drain_s: float = DRAIN_SECONDS) -> None:
        """Stop taking requests, let those in progress finish (up to ``drain_s``), then
        close. Before, a SIGTERM during a drain's scheduler call ended it mid-call: the
        action's row said started (recorded interrupted at the next start) and
        Alertmanager's request got no answer."""
        with self._idle:
            self.stopping = True
        self.remediator.stopping.set()  # requests still waiting to be decided: 503
        self.httpd.shutdown()  # no new connections
        deadline = time.monotonic() + drain_s
        with self._idle:
            while self._busy and time.monotonic() < deadline:
                self._idle.wait(deadline - time.monotonic())
            if self._busy:
                log.error("remediator stopped with %d request(s) in progress", self._busy)
        super().stop()

    def begin(self) -> bool:
        """A POST may go ahead (False: the service is stopping)."""
        with self._idle:
            if self.stopping:
                return False
            self._busy += 1
            return True

    def end(self) -> None:
        with self._idle:
            self._busy -= 1
            self._idle.notify_all()


def _handler(server: RemediatorServer) -> type[BaseHTTPRequestHandler]:
    class Handler(DeadlineHandler):  # a request must arrive whole within its deadline
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            self._guarded(self._get)

        def do_POST(self) -> None:
            if not server.begin():  # stopping: Alertmanager sends it again later
                return self._send(503, {"error": "the remediator is stopping"}, close=True)
            try:
                self._guarded(self._post)
            finally:
                server.end()

        def _guarded(self, fn: Any) -> None:
            try:
                fn()
            except (ConnectionError, TimeoutError) as err:  # the client went or was too slow
                log.debug("request dropped path=%s error=%r", urlsplit(self.path).path, err)
                self.close_connection = True
            except RemediatorStopping:  # not decided: Alertmanager sends it again later
                self._send(503, {"error": "the remediator is stopping"}, close=True)
            except Exception:  # nothing a client sends takes the service down
                log.exception("request failed path=%s", urlsplit(self.path).path)
                self._send(500, {"error": "internal error"}, close=True)

        def _get(self) -> None:
            parts = urlsplit(self.path)
            if parts.path == "/healthz":
                return self._send(200, {"status": "ok", "mode": server.remediator.mode.value})
            if parts.path == "/metrics":
                body = generate_latest(server.registry)
                return self._raw(200, body, CONTENT_TYPE_LATEST)
            if not parts.path.startswith(API):
                return self._send(404, {"error": "not found"})
            if self._operator() is None:
                return None
            if parts.path == "/api/actions":
                status = parse_qs(parts.query).get("status", [None])[0]
                rows = server.remediator.state.actions(status)
                return self._send(
                    200,
                    {
                        "actions": [
                            {k: v for k, v in asdict(r).items() if k != "alert"} for r in rows
                        ]
                    },
                )
            if parts.path == "/api/outcomes":
                return self._send(
                    200, {"outcomes": [asdict(r) for r in server.remediator.state.outcomes()]}
                )
            if parts.path == "/api/breaker":
                return self._send(200, asdict(server.remediator.state.breaker()))
            return self._send(404, {"error": "not found"})

        def _post(self) -> None:
            path = urlsplit(self.path).path
            if path.startswith(API):
                return self._operate(path)
            if path not in ("/", "/webhook"):  # its body unread: close, or it is a request
                return self._send(404, {"error": "not found"}, close=True)
            if not self._auth():
                return None
            body = self._body()
            if body is None:
                return None
            try:
                alerts = parse(body)
            except PayloadError as err:
                server.metrics.rejected.labels("400").inc()
                log.warning("webhook refused code=400 error=%s", err)
                return self._send(400, {"error": str(err)})
            decisions = server.remediator.handle(alerts)
            return self._send(200, {"decisions": [d.as_dict() for d in decisions]})

        def _operate(self, path: str) -> None:
            """An operator's action, in the name of the operator whose token came."""
            who = self._operator()
            if who is None or self._body() is None:
                return None
            if path.startswith("/api/approve/"):
                decision = server.remediator.approve(path.rsplit("/", 1)[1], by=who)
                if decision is None:
                    return self._send(404, {"error": "no queued action with that id"})
                return self._send(200, decision.as_dict())
            if path == "/api/close-breaker":
                was = server.remediator.close_breaker(who)
                return self._send(200, {"was_open": was, "open": False})
            return self._send(404, {"error": "not found"})

        def _auth(self) -> bool:
            """The webhook's credential: Alertmanager's token, and no other."""
            if server.authorized(self.headers.get("Authorization")):
                return True
            return self._refuse(401, "bearer token required")

        def _operator(self) -> str | None:
            """The operator whose own token came; None (answered 401/403) for any other."""
            header = self.headers.get("Authorization")
            if not server.operators.configured:
                self._refuse(403, NO_OPERATORS)
                return None
            who = server.operators.who(header)
            if who is not None:
                return who
            if server.authorized(header):
                self._refuse(403, "the webhook token is not an operator credential")
            else:
                self._refuse(401, "operator token required")
            return None

        def _refuse(self, code: int, error: str) -> bool:
            server.metrics.rejected.labels(str(code)).inc()
            log.warning(
                "request refused code=%d path=%s client=%s",
                code,
                urlsplit(self.path).path,
                self.client_address[0],
            )
            self._send(code, {"error": error}, close=True)
            return False

        def _body(self) -> bytes | None:
            refused = body_refusal(self.headers, server.max_body)
            if refused is not None:
                code, why = refused
                server.metrics.rejected.labels(str(code)).inc()
                self._send(code, {"error": why}, close=True)
                return None
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))

        def _send(self, code: int, body: dict[str, Any], close: bool = False) -> None:
            self._raw(code, json.dumps(body).encode(), "application/json", close)

        def _raw(self, code: int, body: bytes, ctype: str, close: bool = False) -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            if close:
                self.send_header("Connection", "close")
                self.close_connection = True
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("http %s", format % args)

    return Handler

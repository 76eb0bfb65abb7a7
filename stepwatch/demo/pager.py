"""The demo's on-call pager and ticket queue: an Alertmanager webhook receiver in the demo.

Alertmanager's ``oncall-pager`` and ``tickets`` routes post here with the same
bearer token as the remediator's route (a request without it gets 401). Each
notification is kept (when, route, firing or resolved, which alerts) so the
live view can say when a person was told. Runs on a daemon thread.
"""

from __future__ import annotations

import hmac
import json
import logging
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

log = logging.getLogger(__name__)
ROUTES = ("/page", "/ticket")
MAX_BODY = 1 << 20


@dataclass(frozen=True)
class Notification:
    at: float  # wall clock
    route: str  # page | ticket
    status: str  # firing | resolved
    alerts: tuple[str, ...]  # alert names


@dataclass
class Pager:
    token: str
    host: str = "127.0.0.1"
    received: list[Notification] = field(default_factory=list)
    refused: int = 0
    _server: ThreadingHTTPServer | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://{self.host}:{self._server.server_address[1]}"

    def start(self) -> Pager:
        self._server = ThreadingHTTPServer((self.host, 0), _handler(self))
        self._server.daemon_threads = True
        threading.Thread(
            target=self._server.serve_forever, name="stepwatch-demo-pager", daemon=True
        ).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def notifications(self) -> list[Notification]:
        with self._lock:
            return list(self.received)

    def authorized(self, header: str | None) -> bool:
        scheme, _, given = (header or "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(
            given.strip().encode(), self.token.encode()
        )

    def record(self, route: str, body: dict[str, Any]) -> None:
        names = tuple(
            sorted(
                {
                    str(a.get("labels", {}).get("alertname", "?"))
                    for a in body.get("alerts", [])
                    if isinstance(a, dict)
                }
            )
        )
        note = Notification(time.time(), route.strip("/"), str(body.get("status", "?")), names)
        with self._lock:
            self.received.append(note)
        log.info(
            "pager: notification route=%s status=%s alerts=%s",
            note.route,
            note.status,
            ",".join(names),
        )


def _handler(pager: Pager) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            if not pager.authorized(self.headers.get("Authorization")):
                pager.refused += 1
                return self._reply(401)
            if self.path not in ROUTES:
                return self._reply(404)
            size = int(self.headers.get("Content-Length") or 0)
            try:
                body = json.loads(self.rfile.read(min(size, MAX_BODY)) or b"{}")
            except ValueError:
                return self._reply(400)
            pager.record(self.path, body if isinstance(body, dict) else {})
            return self._reply(200)

        def _reply(self, code: int) -> None:
            self.send_response(code)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            return

    return Handler

"""Test helpers for alerting: a webhook receiver that records what Alertmanager sends."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Delivery:
    """One webhook POST: path, Authorization header and decoded JSON body."""

    path: str
    authorization: str
    body: dict[str, Any]

    def alertnames(self) -> set[str]:
        return {a["labels"].get("alertname", "") for a in self.body.get("alerts", [])}


@dataclass
class WebhookReceiver:
    """A tiny HTTP server on a loopback port; ``url(path)`` is what to configure."""

    deliveries: list[Delivery] = field(default_factory=list)
    _server: ThreadingHTTPServer | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __enter__(self) -> WebhookReceiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                size = int(self.headers.get("Content-Length", "0"))
                raw = self.rfile.read(size)
                with receiver._lock:
                    receiver.deliveries.append(
                        Delivery(
                            self.path,
                            self.headers.get("Authorization", ""),
                            json.loads(raw or b"{}"),
                        )
                    )
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def url(self, path: str = "/") -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}{path}"

    def received(self, path: str | None = None) -> list[Delivery]:
        with self._lock:
            return [d for d in self.deliveries if path in (None, d.path)]

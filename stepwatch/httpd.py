"""Bounds for stepwatch's threaded HTTP servers (alert receiver, remediator, store endpoint).

``http.server.ThreadingHTTPServer`` starts one thread per connection, with no
cap, and a handler's ``timeout`` is per ``recv``: a client that sends one
header byte every few seconds (slowloris) holds its thread for ever, before
any token is checked. Anyone who can reach the port could so pile up threads
and file descriptors until the service stops accepting Alertmanager's
notifications. Two bounds, both before authentication:

* :class:`BoundedHTTPServer` serves at most ``max_connections`` connections at
  once; one more is closed at once (counted in ``refused``, logged once);
* :class:`DeadlineHandler` gives a connection ``idle_seconds`` to start a
  request and then ``request_seconds`` to send all of it (request line,
  headers, body), whatever its pace; past that the connection is closed.
  Handling the request (after the body is read) is not timed; writing the
  reply gets ``idle_seconds``.
"""

from __future__ import annotations

import hmac
import io
import logging
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

log = logging.getLogger(__name__)

MAX_CONNECTIONS = 256  # threads and descriptors: well under the usual 1024 files
IDLE_SECONDS = 10.0
REQUEST_SECONDS = 10.0


class _DeadlineReader(io.RawIOBase):
    """A socket's reads, bounded by an idle timeout and then a whole-request deadline."""

    def __init__(self, sock: socket.socket, idle: float, request: float) -> None:
        self._sock = sock
        self._idle = idle
        self._request = request
        self._deadline: float | None = None

    def restart(self) -> None:
        """A new request: wait up to ``idle`` for its first byte."""
        self._deadline = None

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self._deadline is None:
            self._sock.settimeout(self._idle)
        else:
            left = self._deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"request not received within {self._request:g} s")
            self._sock.settimeout(left)
        try:
            n = self._sock.recv_into(buffer)
        finally:
            self._sock.settimeout(self._idle)  # what the reply's writes get
        if n and self._deadline is None:
            self._deadline = time.monotonic() + self._request
        return n


class DeadlineHandler(BaseHTTPRequestHandler):
    """A request handler whose requests must arrive in ``request_seconds`` in all."""

    idle_seconds = IDLE_SECONDS
    request_seconds = REQUEST_SECONDS

    def setup(self) -> None:
        super().setup()
        self.rfile.close()  # the stdlib's reader: replaced by one with a deadline
        self._reader = _DeadlineReader(self.connection, self.idle_seconds, self.request_seconds)
        self.rfile = io.BufferedReader(self._reader)

    def handle_one_request(self) -> None:
        self._reader.restart()
        try:
            super().handle_one_request()
        except TimeoutError as err:  # raised while a do_* method read the body
            log.info("http request dropped client=%s error=%s", self.client_address[0], err)
            self.close_connection = True


class ConnectionCap:
    """A ``socketserver`` threading-server mixin: at most ``max_connections`` served at once;
    one more is closed at once (counted in ``refused``, logged once per burst)."""

    max_connections = MAX_CONNECTIONS
    request_queue_size = 128  # listen backlog: refusals are quick, let them queue
    refused = 0
    _slots: threading.BoundedSemaphore | None = None
    _refusing = False

    def _slot(self) -> threading.BoundedSemaphore:
        if self._slots is None:
            self.max_connections = max(1, self.max_connections)
            self._slots = threading.BoundedSemaphore(self.max_connections)
        return self._slots

    def process_request(self, request: Any, client_address: Any) -> None:
        slots = self._slot()
        if not slots.acquire(blocking=False):
            self.refused += 1
            if not self._refusing:
                log.warning(
                    "http connections at their cap, new ones closed max=%d address=%s",
                    self.max_connections,
                    getattr(self, "server_address", "?"),
                )
            self._refusing = True
            self.shutdown_request(request)  # type: ignore[attr-defined]
            return
        self._refusing = False
        try:
            super().process_request(request, client_address)  # type: ignore[misc]
        except BaseException:
            slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)  # type: ignore[misc]
        finally:
            self._slot().release()


class BoundedHTTPServer(ConnectionCap, ThreadingHTTPServer):
    """``ThreadingHTTPServer`` with at most ``max_connections`` connections served at once."""

    daemon_threads = True

    def __init__(
        self,
        address: tuple[str, int],
        handler: type[BaseHTTPRequestHandler],
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        self.max_connections = max_connections
        super().__init__(address, handler)
        self._slot()


class TokenHTTPService:
    """A bearer-token HTTP service on a :class:`BoundedHTTPServer` in a thread of its own:
    the lifecycle and the token check the alert receiver and the remediator share."""

    name = "http"

    def __init__(
        self,
        token: str,
        handler: type[BaseHTTPRequestHandler],
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        if not token:
            raise ValueError(f"the {self.name} needs a bearer token")
        self._token = token.encode()
        self.httpd = BoundedHTTPServer((host, port), handler)
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> Any:
        self._thread = threading.Thread(
            target=self.httpd.serve_forever, name=self.name, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        if self._thread is not None:
            self._thread.join(5)

    def authorized(self, header: str | None) -> bool:
        """``Authorization: Bearer <token>``, compared in constant time."""
        scheme, _, given = (header or "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(
            given.strip().encode(), self._token
        )


def body_refusal(headers: Any, limit: int) -> tuple[int, str] | None:
    """(status, why) when a request's body must not be read, else None (read
    ``Content-Length`` bytes). A chunked body is 411: left unread on a keep-alive
    connection, its chunks were parsed as the next request (the alert receiver read
    it as empty, answered 400, then answered the chunk-size line too)."""
    if headers.get("Transfer-Encoding"):
        return 411, "send Content-Length, not a chunked body"
    given = headers.get_all("Content-Length") or ["0"]
    text = given[0].strip()
    if len(given) > 1 or not (text.isascii() and text.isdigit()):  # int() takes "1_0", "+9"
        return 400, "Content-Length is not one size"
    size = int(text)
    if size > limit:
        return 413, f"body over {limit} bytes"
    return None

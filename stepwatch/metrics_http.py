"""Serve a Prometheus registry on ``/metrics``: listen address, optional TLS and basic auth.

One helper for every stepwatch service with an endpoint (agent, stream worker,
sink, remediator). The listen address follows node_exporter's
``--web.listen-address`` convention: ``HOST:PORT``, ``[IPv6]:PORT``, or
``:PORT`` for every interface. The default host is loopback
(``Settings.metrics_host``, ``STEPWATCH_METRICS_HOST``): a scrape from another
machine needs the address set on purpose. With ``metrics_tls_cert`` and
``metrics_tls_key`` the endpoint speaks HTTPS only; with ``metrics_auth_user``
and ``metrics_auth_password`` every request needs HTTP basic auth (the
password is compared in constant time; a wrong or missing one gets 401).
"""

from __future__ import annotations

import base64
import hmac
import logging
import socket
import ssl
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app

from stepwatch.errors import ConfigError
from stepwatch.httpd import ConnectionCap, DeadlineHandler
from stepwatch.settings import Settings

log = logging.getLogger(__name__)

HANDSHAKE_SECONDS = 10.0
Wsgi = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


@dataclass(frozen=True)
class Endpoint:
    """Where and how one /metrics endpoint listens."""

    host: str = "127.0.0.1"
    port: int = 0
    certfile: str = ""
    keyfile: str = ""
    user: str = ""
    password: str = ""

    @classmethod
    def from_settings(cls, settings: Settings, port: int, listen: str = "") -> Endpoint:
        """The settings' TLS and auth; ``listen`` (``HOST:PORT``) wins over host and port."""
        host = settings.metrics_host
        if listen:
            host, port = parse_listen_address(listen)
        return cls(
            host,
            port,
            settings.metrics_tls_cert,
            settings.metrics_tls_key,
            settings.metrics_auth_user,
            settings.metrics_auth_password,
        )

    @property
    def scheme(self) -> str:
        return "https" if self.certfile else "http"

    def __repr__(self) -> str:  # never the password
        return (
            f"Endpoint(host={self.host!r}, port={self.port}, tls={bool(self.certfile)}, "
            f"auth={bool(self.user)})"
        )


def parse_listen_address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` / ``[V6]:PORT`` / ``:PORT`` (every interface) -> (host, port)."""
    host, sep, port = text.strip().rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"listen address {text!r}: expected HOST:PORT, [IPv6]:PORT or :PORT")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host or "0.0.0.0", int(port)


def basic_auth(app: Wsgi, user: str, password: str, realm: str = "stepwatch") -> Wsgi:
    """Wrap a WSGI app: requests without the right ``Authorization: Basic`` get 401."""
    expected = base64.b64encode(f"{user}:{password}".encode()).decode()

    def guarded(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        header = environ.get("HTTP_AUTHORIZATION", "")
        scheme, _, given = header.partition(" ")
        if scheme.lower() == "basic" and hmac.compare_digest(
            given.strip().encode(), expected.encode()
        ):
            return app(environ, start_response)
        start_response(
            "401 Unauthorized",
            [("Content-Type", "text/plain"), ("WWW-Authenticate", f'Basic realm="{realm}"')],
        )
        return [b"unauthorized\n"]

    return guarded


class _Quiet(WSGIRequestHandler, DeadlineHandler):
    """One scrape per connection, which must arrive in time (:mod:`stepwatch.httpd`)."""

    def handle(self) -> None:
        try:
            super().handle()
        except (TimeoutError, ConnectionError, ssl.SSLError) as err:
            log.debug("metrics request dropped client=%s error=%r", self.client_address[0], err)

    def log_message(self, format: str, *args: Any) -> None:
        return None


class _Server(ConnectionCap, ThreadingMixIn, WSGIServer):
    """At most ``max_connections`` scrapes at once; with ``tls`` set, each connection's TLS
    handshake runs in its own thread under a timeout, never in the accept loop (where one
    client that never sent a ClientHello stopped every scrape)."""

    daemon_threads = True
    tls: ssl.SSLContext | None = None

    def get_request(self) -> tuple[socket.socket, Any]:
        sock, addr = super().get_request()
        if self.tls is not None:
            sock = self.tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        return sock, addr

    def finish_request(self, request: Any, client_address: Any) -> None:
        if isinstance(request, ssl.SSLSocket):
            try:
                request.settimeout(HANDSHAKE_SECONDS)
                request.do_handshake()
            except (OSError, ssl.SSLError) as err:  # TimeoutError is an OSError
                log.debug("metrics TLS handshake failed client=%s error=%r", client_address, err)
                return
        super().finish_request(request, client_address)


class MetricsServer:
    """A running endpoint: ``port`` (the bound one), ``url``, ``shutdown()``."""

    def __init__(self, httpd: WSGIServer, endpoint: Endpoint) -> None:
        self._httpd = httpd
        self.endpoint = endpoint
        self.port: int = httpd.server_port
        self.server_port = self.port  # the name prometheus-client's servers use
        self._thread = threading.Thread(
            target=httpd.serve_forever, name="stepwatch-metrics", daemon=True
        )
        self._thread.start()

    @property
    def url(self) -> str:
        host = self.endpoint.host
        host = f"[{host}]" if ":" in host else host
        return f"{self.endpoint.scheme}://{host}:{self.port}/metrics"

    def shutdown(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(5)


def serve_metrics(registry: CollectorRegistry, endpoint: Endpoint, name: str = "") -> MetricsServer:
    """Start serving ``registry``; raise ConfigError when the address or TLS files are bad."""
    app: Wsgi = make_wsgi_app(registry)
    if endpoint.user:
        app = basic_auth(app, endpoint.user, endpoint.password)
    family = socket.AF_INET6 if ":" in endpoint.host else socket.AF_INET

    class Server(_Server):
        address_family = family

    try:
        httpd = make_server(endpoint.host, endpoint.port, app, Server, handler_class=_Quiet)
    except OSError as err:
        raise ConfigError(f"cannot listen on {endpoint.host}:{endpoint.port}: {err}") from err
    if endpoint.certfile:
        try:
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            context.load_cert_chain(endpoint.certfile, endpoint.keyfile)
        except (OSError, ssl.SSLError) as err:
            httpd.server_close()
            raise ConfigError(f"cannot load the metrics TLS certificate/key: {err}") from err
        httpd.tls = context  # wrapped per connection, in its thread (see _Server)
    server = MetricsServer(httpd, endpoint)
    log.info(
        "metrics endpoint listening service=%s url=%s tls=%s auth=%s",
        name or "-",
        server.url,
        bool(endpoint.certfile),
        bool(endpoint.user),
    )
    return server

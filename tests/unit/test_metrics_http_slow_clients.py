"""Slow and silent clients of the /metrics endpoints (docs/security.md, "Boundary 3" table).

Before: with TLS on, the handshake ran in the accept loop with no timeout, so
one TCP connection that never sent a ClientHello stopped every scrape; and
each connection got a thread of its own, without a cap or a timeout, so
idle connections piled up threads for ever.
"""

from __future__ import annotations

import shutil
import socket
import ssl
import subprocess
import threading
import time
import urllib.request

import pytest
from prometheus_client import CollectorRegistry, Counter

from stepwatch.metrics_http import Endpoint, serve_metrics

CAP = 256  # stepwatch.httpd.MAX_CONNECTIONS


@pytest.fixture()
def registry() -> CollectorRegistry:
    r = CollectorRegistry()
    Counter("stepwatch_test_things", "things", registry=r).inc(3)
    return r


@pytest.fixture(scope="module")
def cert(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    d = tmp_path_factory.mktemp("tls")
    key, crt = d / "key.pem", d / "cert.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(crt),
        ],
        check=True,
        capture_output=True,
    )
    return str(crt), str(key)


def scrape(url: str, cafile: str | None = None) -> int:
    context = ssl.create_default_context(cafile=cafile) if cafile else None
    with urllib.request.urlopen(url, timeout=5, context=context) as resp:
        return int(resp.status)


def test_a_client_that_never_says_hello_does_not_stop_tls_scrapes(
    registry: CollectorRegistry, cert: tuple[str, str]
) -> None:
    crt, key = cert
    server = serve_metrics(registry, Endpoint(port=0, certfile=crt, keyfile=key))
    silent = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(3)]
    try:
        time.sleep(0.3)
        assert scrape(server.url, cafile=crt) == 200
    finally:
        for s in silent:
            s.close()
        server.shutdown()


def test_idle_connections_hold_a_bounded_number_of_threads(registry: CollectorRegistry) -> None:
    server = serve_metrics(registry, Endpoint(port=0))
    before = threading.active_count()
    idle = []
    try:
        for _ in range(400):
            idle.append(socket.create_connection(("127.0.0.1", server.port), timeout=5))
        time.sleep(1.0)
        assert threading.active_count() - before <= CAP + 2
    finally:
        for s in idle:
            s.close()
    time.sleep(0.5)
    assert scrape(server.url) == 200
    server.shutdown()

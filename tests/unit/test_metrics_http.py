"""The shared /metrics endpoint: listen address, TLS with a self-signed certificate, basic auth."""

from __future__ import annotations

import base64
import shutil
import ssl
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter

from stepwatch.errors import ConfigError
from stepwatch.metrics_http import Endpoint, parse_listen_address, serve_metrics
from stepwatch.settings import Settings


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


def get(
    url: str, auth: tuple[str, str] | None = None, cafile: str | None = None
) -> tuple[int, str]:
    req = urllib.request.Request(url)
    if auth:
        token = base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
        req.add_header("Authorization", f"Basic {token}")
    context = ssl.create_default_context(cafile=cafile) if cafile else None
    try:
        with urllib.request.urlopen(req, timeout=5, context=context) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, ""


def test_listen_addresses_follow_node_exporters_convention() -> None:
    assert parse_listen_address("127.0.0.1:9465") == ("127.0.0.1", 9465)
    assert parse_listen_address("[::1]:9100") == ("::1", 9100)
    assert parse_listen_address(":9100") == ("0.0.0.0", 9100)
    for bad in ("9100", "host:", "host:http", "h:70000"):
        with pytest.raises(ConfigError):
            parse_listen_address(bad)


def test_the_default_is_loopback_and_the_listen_flag_wins() -> None:
    s = Settings.load(env={})
    assert Endpoint.from_settings(s, 9465).host == "127.0.0.1"
    e = Endpoint.from_settings(s, 9465, "0.0.0.0:9999")
    assert (e.host, e.port) == ("0.0.0.0", 9999)
    env = Settings.load(env={"STEPWATCH_METRICS_HOST": "10.1.2.3"})
    assert Endpoint.from_settings(env, 1).host == "10.1.2.3"


def test_plain_endpoint_serves_metrics_on_loopback(registry: CollectorRegistry) -> None:
    server = serve_metrics(registry, Endpoint(port=0))
    try:
        assert server.url.startswith("http://127.0.0.1:")
        status, body = get(server.url)
        assert status == 200 and "stepwatch_test_things_total 3.0" in body
    finally:
        server.shutdown()


def test_basic_auth_refuses_wrong_and_missing_credentials(registry: CollectorRegistry) -> None:
    server = serve_metrics(registry, Endpoint(port=0, user="prom", password="s3cret"))
    try:
        assert get(server.url)[0] == 401
        assert get(server.url, ("prom", "wrong"))[0] == 401
        assert get(server.url, ("other", "s3cret"))[0] == 401
        status, body = get(server.url, ("prom", "s3cret"))
        assert status == 200 and "stepwatch_test_things_total" in body
        assert "s3cret" not in repr(server.endpoint)
    finally:
        server.shutdown()


def test_tls_with_a_self_signed_certificate_and_auth(
    registry: CollectorRegistry, cert: tuple[str, str]
) -> None:
    crt, key = cert
    server = serve_metrics(
        registry, Endpoint(port=0, certfile=crt, keyfile=key, user="prom", password="pw")
    )
    try:
        assert server.url.startswith("https://")
        status, body = get(server.url, ("prom", "pw"), cafile=crt)
        assert status == 200 and "stepwatch_test_things_total" in body
        assert get(server.url, ("prom", "nope"), cafile=crt)[0] == 401
        with pytest.raises(urllib.error.URLError):  # an untrusted certificate is refused
            get(server.url, ("prom", "pw"), cafile=None)
        plain = server.url.replace("https://", "http://")
        with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
            get(plain, ("prom", "pw"))  # no plain HTTP on the TLS port
        assert get(server.url, ("prom", "pw"), cafile=crt)[0] == 200  # and it serves on
    finally:
        server.shutdown()


def test_bad_tls_files_and_busy_ports_are_config_errors(
    registry: CollectorRegistry, tmp_path: Path
) -> None:
    with pytest.raises(ConfigError):
        serve_metrics(
            registry,
            Endpoint(port=0, certfile=str(tmp_path / "no.pem"), keyfile=str(tmp_path / "no.key")),
        )
    server = serve_metrics(registry, Endpoint(port=0))
    try:
        with pytest.raises(ConfigError):
            serve_metrics(registry, Endpoint(port=server.port))
    finally:
        server.shutdown()
    with pytest.raises(ConfigError):
        Settings.load(env={}, metrics_tls_cert="c.pem")  # the key goes with it

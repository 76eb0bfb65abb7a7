"""The Prometheus and Alertmanager launchers against the real Debian binaries."""

from __future__ import annotations

import textwrap

import pytest
from prometheus_client import CollectorRegistry, Gauge, start_http_server

from stepwatch.daemons.prometheus import wait_for
from stepwatch.errors import DaemonError
from tests.support.alert_support import WebhookReceiver

RULES = textwrap.dedent("""\
    groups:
      - name: t
        rules:
          - alert: ValueHigh
            expr: t_value > 5
            labels: {severity: critical}
            annotations: {summary: "value is {{ $value }}"}
""")


@pytest.fixture()
def exporter():
    registry = CollectorRegistry()
    gauge = Gauge("t_value", "a test value", ["host"], registry=registry)
    server, thread = start_http_server(0, addr="127.0.0.1", registry=registry)
    yield gauge, f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    thread.join(5)


def test_prometheus_scrapes_evaluates_and_alertmanager_routes(
    tmp_path, exporter, prometheus_factory, alertmanager_factory
):
    gauge, target = exporter
    gauge.labels(host="n1").set(2.0)
    rules = tmp_path / "rules.yml"
    rules.write_text(RULES)
    with WebhookReceiver() as hook:
        am = alertmanager_factory(
            textwrap.dedent(f"""\
            route: {{receiver: hook, group_wait: 0s, group_interval: 1s}}
            receivers:
              - name: hook
                webhook_configs: [{{url: "{hook.url("/hook")}"}}]
        """)
        )
        prom = prometheus_factory(targets=[target], rule_files=[rules], alertmanagers=[am.address])
        assert wait_for(lambda: prom.query_value('t_value{host="n1"}'), 30, what="a scrape") == 2.0
        assert prom.firing() == []
        gauge.labels(host="n1").set(9.0)
        alert = wait_for(lambda: prom.firing("ValueHigh"), 30, what="ValueHigh firing")[0]
        assert alert.labels["host"] == "n1" and alert.annotations["summary"] == "value is 9"
        delivery = wait_for(lambda: hook.received("/hook"), 30, what="a webhook")[0]
        assert delivery.alertnames() == {"ValueHigh"}
        assert delivery.body["version"] == "4"
        assert any(a["labels"]["alertname"] == "ValueHigh" for a in am.alerts())


def test_stop_is_clean_and_idempotent(prometheus_factory):
    prom = prometheus_factory(scrape_jobs={"other": ["127.0.0.1:1"]})
    assert [c["job_name"] for c in prom.config()["scrape_configs"]] == ["stepwatch", "other"]
    prom.stop()
    prom.stop()
    with pytest.raises(DaemonError):
        prom.query("up")


def test_bad_config_is_a_clear_error(tmp_path, alertmanager_factory):
    with pytest.raises(DaemonError, match="alertmanager exited"):
        alertmanager_factory("route: [not a mapping\n")

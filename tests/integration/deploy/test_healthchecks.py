"""deploy/healthcheck.py (the compose healthchecks and the Kubernetes readiness probe)
against the real /metrics of the agent, a stream worker and the sink: each gauge that
docker-compose.yml names exists and reads ready; a missing gauge or a closed port is not."""

from __future__ import annotations

import importlib.util

import pytest
import yaml

from stepwatch.daemons.prometheus import wait_for
from tests.support import dash_metrics as M
from tests.support import paths

pytestmark = pytest.mark.integration
ROOT = paths.ROOT


def _healthcheck():
    spec = importlib.util.spec_from_file_location("healthcheck", ROOT / "deploy" / "healthcheck.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_compose_healthchecks_pass_on_the_real_services(tmp_path) -> None:
    check = _healthcheck()
    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    served = M.serve_all(str(tmp_path / "spool"))
    try:
        for service, job in (("stream", "stepwatch-stream"), ("sink", "stepwatch-sink")):
            gauge = services[service]["healthcheck"]["test"][3]
            port = served.targets[job].split(":")[1]
            assert wait_for(
                lambda p=port, g=gauge: check.main([p, g]) == 0 or None, 10, what=f"{service} ready"
            ), service
            assert check.main([port, gauge + "_missing"]) == 1
        assert check.main(["1", "stepwatch_stream_ready"]) == 1  # nothing listens
    finally:
        served.close()


def test_the_agent_is_ready_while_its_loop_runs(tmp_path) -> None:
    import threading

    from prometheus_client import start_http_server

    from stepwatch.agents.agent import Agent
    from stepwatch.agents.metrics import registry_for
    from stepwatch.settings import Settings

    check = _healthcheck()
    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    gauge = services["agent"]["healthcheck"]["test"][3]
    settings = Settings.load(
        env={}, host="node01", collectors="", tick_seconds=0.2, spool_dir=str(tmp_path / "spool")
    )
    agent = Agent(settings, [], M.NullSink())
    server, _ = start_http_server(0, addr="127.0.0.1", registry=registry_for(agent.snapshot))
    port = str(server.server_port)
    stop = threading.Event()
    loop = threading.Thread(target=agent.run, args=(stop,), daemon=True)
    try:
        assert check.main([port, gauge]) == 1  # not started
        loop.start()
        assert wait_for(lambda: check.main([port, gauge]) == 0 or None, 10, what="agent ready")
        stop.set()
        loop.join(10)
        assert check.main([port, gauge]) == 1  # stopped
    finally:
        stop.set()
        server.shutdown()
        server.server_close()


def test_ready_reads_only_the_unlabelled_gauge_at_one() -> None:
    check = _healthcheck()
    body = "# HELP x_ready r\n# TYPE x_ready gauge\nx_ready 1.0\nx_ready_total 0\n"
    assert check.ready(body, "x_ready")
    assert not check.ready(body.replace("x_ready 1.0", "x_ready 0.0"), "x_ready")
    assert not check.ready(body, "y_ready")

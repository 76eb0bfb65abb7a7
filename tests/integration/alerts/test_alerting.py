"""Real Prometheus evaluates stepwatch's rules over a real agent's /metrics; real
Alertmanager routes what fires with the shipped routing tree and inhibits by it."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from stepwatch.agents.agent import Agent
from stepwatch.agents.collectors.base import CollectorHealth, HealthState, HostContext
from stepwatch.agents.collectors.rdma import RdmaCollector
from stepwatch.agents.metrics import registry_for, serve
from stepwatch.alerts.config import Receivers, alertmanager_config, rule_files
from stepwatch.contract import EventMessage, EventType, GpuMessage, GpuReading, Message
from stepwatch.daemons.prometheus import wait_for
from stepwatch.settings import Settings
from tests.support import paths
from tests.support.alert_support import WebhookReceiver

SYSFS = paths.FIXTURES / "sysfs"
TOKEN = "test-token-not-a-secret"


class FakeGpus:
    """Eight healthy GPUs; ``xid(code, gpu)`` queues an XID event for the next tick."""

    name = "nvml"

    def __init__(self) -> None:
        self.pending: list[tuple[int, int]] = []
        self.lock = threading.Lock()

    def xid(self, code: int, gpu: int) -> None:
        with self.lock:
            self.pending.append((code, gpu))

    def collect(self, ctx: HostContext) -> list[Message]:
        gpus = [
            GpuReading(
                index=i,
                uuid=f"GPU-{i}",
                sm_clock_mhz=1980,
                sm_clock_max_mhz=1980,
                temp_gpu_c=60,
                throttle_reasons=0,
                ecc_dbe_total=0,
                remapped_rows_failure=False,
            )
            for i in range(8)
        ]
        with self.lock:
            events, self.pending = self.pending, []
        return [GpuMessage(host=ctx.host, ts=ctx.now, gpus=gpus)] + [
            EventMessage(host=ctx.host, ts=ctx.now, type=EventType.XID, gpu=g, code=c)
            for c, g in events
        ]

    def health(self) -> CollectorHealth:
        return CollectorHealth(HealthState.OK)

    def close(self) -> None:
        pass


class NullSink:
    def send(self, messages: list[Message]) -> None:
        pass

    def flush(self, timeout: float) -> int:
        return 0

    def close(self, timeout: float = 0) -> None:
        pass


@pytest.fixture()
def agent(tmp_path) -> Iterator[tuple[Agent, FakeGpus, str]]:
    """A real agent (fake NVML, the recorded sysfs tree) ticking every 0.5 s, serving /metrics."""
    settings = Settings.load(
        env={}, host="node02", collectors="", tick_seconds=0.5, spool_dir=str(tmp_path / "spool")
    )
    gpus = FakeGpus()
    agent = Agent(settings, [gpus, RdmaCollector(str(SYSFS))], NullSink())
    server = serve(registry_for(agent.snapshot), 0, addr="127.0.0.1")
    stop = threading.Event()
    thread = threading.Thread(target=agent.run, args=(stop,), daemon=True)
    thread.start()
    yield agent, gpus, f"127.0.0.1:{server.server_port}"
    stop.set()
    thread.join(10)
    server.shutdown()


def test_fatal_xid_on_a_real_agent_fires_and_reaches_the_remediator_and_the_pager(
    tmp_path, agent, prometheus_factory, alertmanager_factory
):
    _, gpus, target = agent
    token = tmp_path / "remediator.token"
    token.write_text(TOKEN + "\n")
    with WebhookReceiver() as hooks:
        config = alertmanager_config(
            Receivers(
                hooks.url("/remediator"), str(token), hooks.url("/page"), hooks.url("/ticket")
            ),
            fast=True,
        )
        am = alertmanager_factory(config)
        prom = prometheus_factory(
            targets=[target],
            rule_files=rule_files(),
            alertmanagers=[am.address],
            job_name="stepwatch-agent",
        )
        assert {g["name"] for g in prom.rule_groups()} >= {"stepwatch-gpu", "stepwatch-jobs"}
        wait_for(lambda: prom.query('stepwatch_gpu_sm_clock_hertz{gpu="3"}'), 30, what="a scrape")
        assert prom.query_value('stepwatch_infiniband_port_up{device="mlx5_0"}') == 1.0
        assert prom.firing() == []  # healthy node: nothing fires
        fault_at = time.monotonic()
        gpus.xid(79, gpu=3)
        # the first event creates the counter series; a second one is a plain increase
        wait_for(
            lambda: prom.query('stepwatch_gpu_xid_events_total{xid="79"}'),
            30,
            what="the XID counter",
        )
        gpus.xid(79, gpu=3)
        alert = wait_for(lambda: prom.firing("GpuXidFatal"), 60, what="GpuXidFatal firing")[0]
        assert alert.labels["host"] == "node02" and alert.labels["gpu"] == "3"
        assert alert.labels["remediation"] == "drain" and alert.labels["class"] == "system"
        delivery = wait_for(lambda: hooks.received("/remediator"), 60, what="the webhook")[0]
        elapsed = time.monotonic() - fault_at
        assert delivery.authorization == f"Bearer {TOKEN}"
        assert delivery.body["version"] == "4" and delivery.alertnames() == {"GpuXidFatal"}
        sent = delivery.body["alerts"][0]
        assert sent["labels"]["xid"] == "79" and sent["fingerprint"]
        assert sent["annotations"]["runbook_url"].endswith("#gpuxidfatal")
        wait_for(lambda: hooks.received("/page"), 30, what="the page")
        assert hooks.received("/ticket") == []
        print(
            f"\nXID to remediator webhook: {elapsed:.1f} s (scrape 1 s, evaluation 1 s, "
            "group_wait 1 s)"
        )


def posted(name: str, **labels: str) -> dict:
    return {"labels": {"alertname": name, **labels}, "annotations": {"summary": name}}


def test_inhibition_one_fault_one_notification(tmp_path, alertmanager_factory):
    token = tmp_path / "t"
    token.write_text(TOKEN)
    with WebhookReceiver() as hooks:
        am = alertmanager_factory(
            alertmanager_config(
                Receivers(hooks.url("/r"), str(token), hooks.url("/p"), hooks.url("/t")), fast=True
            )
        )
        sys = {"class": "system", "severity": "warning"}
        am.post_alerts(
            [
                posted("AgentDown", host="node02", scope="node", **{**sys, "severity": "critical"}),
                posted("GpuThermalThrottling", host="node02", gpu="1", scope="gpu", **sys),
                posted("GpuThermalThrottling", host="node03", gpu="1", scope="gpu", **sys),
                posted("JobHang", job_id="j1", scope="job", **sys),
                posted(
                    "StragglerPersistent",
                    job_id="j1",
                    host="node05",
                    rank="4",
                    cause="gpu",
                    scope="rank",
                    **sys,
                ),
                posted(
                    "StragglerPersistent",
                    job_id="j2",
                    host="node06",
                    rank="1",
                    cause="gpu",
                    scope="rank",
                    **sys,
                ),
                posted(
                    "NetworkFaultLocalized",
                    job_id="j3",
                    host="node07",
                    device="mlx5_1",
                    port="1",
                    scope="port",
                    **sys,
                ),
                posted("JobThroughputDrop", job_id="j3", scope="job", **sys),
            ]
        )

        def states() -> dict[tuple[str, str], bool]:
            out = {}
            for a in am.alerts():
                key = (a["labels"]["alertname"], a["labels"].get("host") or a["labels"]["job_id"])
                out[key] = bool(a["status"]["inhibitedBy"])
            return out if len(out) == 8 else {}

        want = {
            ("AgentDown", "node02"): False,
            ("GpuThermalThrottling", "node02"): True,  # node down silences its GPUs
            ("GpuThermalThrottling", "node03"): False,
            ("JobHang", "j1"): False,
            ("StragglerPersistent", "node05"): True,  # the hang silences its stragglers
            ("StragglerPersistent", "node06"): False,  # another job's straggler stays
            ("NetworkFaultLocalized", "node07"): False,
            ("JobThroughputDrop", "j3"): True,  # the network fault explains the slowdown
        }
        wait_for(states, 30, what="eight alerts processed")
        # Alertmanager marks an alert inhibited when its pipeline checks it, not when it
        # is received: all eight can be listed before every mark is set (a CI run on a
        # loaded machine read JobThroughputDrop unmarked). Wait for the marks to settle.
        deadline = time.monotonic() + 30
        got = states()
        while got != want and time.monotonic() < deadline:
            time.sleep(0.2)
            got = states()
        assert got == want

"""dcgm-exporter collector against a real HTTP server on a random loopback port."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from stepwatch.agents.collectors.base import HealthState, HostContext
from stepwatch.agents.collectors.dcgm import DcgmCollector
from stepwatch.agents.collectors.nvml import NvmlCollector
from stepwatch.agents.collectors.nvml_replay import ReplayNvml
from stepwatch.agents.collectors.promtext import Parser, parse
from stepwatch.contract import EventMessage, EventType, GpuMessage, decode, encode
from tests.support import paths

FIXTURES = paths.FIXTURES / "dcgm"
HOSTNAME_PAGE = (FIXTURES / "h100_8gpu_Hostname.prom").read_text()
K8S_PAGE = (FIXTURES / "h100_8gpu_hostname_k8s.prom").read_text()
NOW = 1_767_225_600.0


def nn(value: Any) -> Any:
    """The value, asserted present (readings are Optional)."""
    assert value is not None
    return value


class Exporter:
    """A stand-in dcgm-exporter: serves ``page`` at /metrics, optionally slowly."""

    def __init__(self) -> None:
        self.page = HOSTNAME_PAGE
        self.delay = 0.0
        self.requests = 0
        exporter = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                exporter.requests += 1
                time.sleep(exporter.delay)
                body = exporter.page.encode()
                self.send_response(200 if self.path == "/metrics" else 404)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                try:
                    self.wfile.write(body)
                except OSError:
                    pass  # the client gave up (the timeout test)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/metrics"
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture()
def exporter() -> Iterator[Exporter]:
    e = Exporter()
    yield e
    e.close()


def ctx(jobs: dict[int, str] | None = None) -> HostContext:
    return HostContext(host="gpu-node-017", now=NOW, job_of_gpu=jobs or {})


def split(messages: list[Any]) -> tuple[GpuMessage, list[EventMessage]]:
    gpus = [m for m in messages if isinstance(m, GpuMessage)]
    assert len(gpus) == 1
    return gpus[0], [m for m in messages if isinstance(m, EventMessage)]


def test_hostname_spelling_bare_metal_page(exporter: Exporter) -> None:
    collector = DcgmCollector(exporter.url, timeout=1.0)
    msg, events = split(collector.collect(ctx()))
    assert collector.health().state is HealthState.OK
    assert events == []  # GPU 2's old XID 13 is the baseline, not news
    assert [g.index for g in msg.gpus] == list(range(8))
    g0 = msg.gpus[0]
    assert g0.uuid == "GPU-5d0c3b2e-8f41-4b7a-9c26-1e7f0a3d9b10"
    assert g0.name == "NVIDIA H100 80GB HBM3" and g0.pci_bus_id == "00000000:18:00.0"
    assert g0.sm_clock_mhz == 1980.0 and g0.mem_clock_mhz == 2619.0
    assert nn(g0.fb_used_mib) + nn(g0.fb_free_mib) == 81559.0
    assert 0 < nn(g0.gr_engine_active) < 1 and 0 < nn(g0.tensor_active) < 1
    assert 0 < nn(g0.dram_active) < 1
    assert isinstance(g0.energy_mj_total, int) and g0.energy_mj_total > 10**11
    assert msg.gpus[2].xid_last == 13 and msg.gpus[0].xid_last == 0
    assert msg.gpus[5].ecc_sbe_total == 3 and msg.gpus[5].remapped_rows_correctable == 2
    assert msg.gpus[3].pcie_replay_total == 12
    assert all(g.throttle_reasons is not None for g in msg.gpus)
    assert msg.job_id == "48213"  # hpc_job label, the agent knowing no better
    assert collector.attribution()[0] == {
        "hpc_job": "48213",
        "hostname": "gpu-node-017",
        "device": "nvidia0",
    }
    decode(encode(msg), now=lambda: NOW)


def test_lowercase_hostname_and_kubernetes_labels(exporter: Exporter) -> None:
    exporter.page = K8S_PAGE
    collector = DcgmCollector(exporter.url)
    msg, _ = split(collector.collect(ctx()))
    assert len(msg.gpus) == 8 and collector.health().state is HealthState.OK
    assert collector.attribution()[7] == {
        "pod": "llama-70b-worker-3",
        "namespace": "llm",
        "container": "trainer",
        "hostname": "gpu-node-017",
        "device": "nvidia7",
    }
    assert msg.job_id is None  # no hpc_job and the agent knows no job
    assert all(g.throttle_reasons is not None for g in msg.gpus)  # CLOCKS_EVENT_REASONS name


def test_agent_job_mapping_wins_over_hpc_job(exporter: Exporter) -> None:
    msg, _ = split(DcgmCollector(exporter.url).collect(ctx({i: "run-9" for i in range(8)})))
    assert msg.job_id == "run-9"


def test_agrees_with_the_nvml_recording_it_was_made_from(exporter: Exporter) -> None:
    dcgm, _ = split(DcgmCollector(exporter.url).collect(ctx()))
    nvml = NvmlCollector(ReplayNvml.from_file(clock=lambda: 0.0)).collect(ctx())[0]
    assert isinstance(nvml, GpuMessage)
    for a, b in zip(dcgm.gpus, nvml.gpus, strict=True):
        for name in (
            "uuid",
            "sm_clock_mhz",
            "temp_gpu_c",
            "temp_mem_c",
            "energy_mj_total",
            "util_gpu_pct",
            "fb_used_mib",
            "fb_free_mib",
            "throttle_reasons",
        ):
            assert getattr(a, name) == getattr(b, name), name
        assert a.power_w == pytest.approx(b.power_w)


def test_xid_gauge_emits_only_on_change_to_nonzero(exporter: Exporter) -> None:
    collector = DcgmCollector(exporter.url)
    jobs = {i: "job-1" for i in range(8)}

    def xids(gpu2: int, gpu6: int = 0) -> list[tuple[int | None, int | None]]:
        page = HOSTNAME_PAGE
        lines = []
        for line in page.splitlines():
            if line.startswith('DCGM_FI_DEV_XID_ERRORS{gpu="2"'):
                line = line.rsplit(" ", 1)[0] + f" {gpu2}"
            if line.startswith('DCGM_FI_DEV_XID_ERRORS{gpu="6"'):
                line = line.rsplit(" ", 1)[0] + f" {gpu6}"
            lines.append(line)
        exporter.page = "\n".join(lines) + "\n"
        msg, events = split(collector.collect(ctx(jobs)))
        assert msg.gpus[2].xid_last == gpu2
        assert all(e.type is EventType.XID and e.job_id == "job-1" for e in events)
        return [(e.gpu, e.code) for e in events]

    assert xids(13) == []  # first sight: baseline
    assert xids(13) == []  # unchanged
    assert xids(79) == [(2, 79)]
    assert xids(79) == []  # the gauge holds its value: no repeat
    assert xids(0) == []  # a reset to 0 is not an XID
    assert xids(13, 48) == [(2, 13), (6, 48)]


def test_endpoint_down_is_down_logged_once_never_raises(caplog: pytest.LogCaptureFixture) -> None:
    probe = Exporter()
    url = probe.url
    probe.close()  # nothing listens there any more
    collector = DcgmCollector(url, timeout=0.5)
    caplog.set_level(logging.WARNING, logger="stepwatch.agents.collectors.dcgm")
    for _ in range(3):
        assert collector.collect(ctx()) == []
    health = collector.health()
    assert health.state is HealthState.DOWN and health.errors_total == 3
    assert collector.error_counts() == {"endpoint_down": 3}
    assert len([r for r in caplog.records if "unreachable" in r.getMessage()]) == 1


def test_http_error_and_non_http_peer_are_down(exporter: Exporter) -> None:
    collector = DcgmCollector(exporter.url.replace("/metrics", "/wrong"))
    assert collector.collect(ctx()) == []
    assert collector.health().state is HealthState.DOWN

    import socket

    peer = socket.socket()
    peer.bind(("127.0.0.1", 0))
    peer.listen(1)

    def babble() -> None:
        conn, _ = peer.accept()
        conn.recv(4096)
        conn.sendall(b"SSH-2.0-OpenSSH_9.2\r\n")
        conn.close()

    t = threading.Thread(target=babble, daemon=True)
    t.start()
    collector = DcgmCollector(f"http://127.0.0.1:{peer.getsockname()[1]}/metrics", timeout=1.0)
    assert collector.collect(ctx()) == []
    t.join(2)
    peer.close()
    assert collector.health().state is HealthState.DOWN
    assert collector.error_counts() == {"endpoint_down": 1}


@pytest.mark.timeout(20)
def test_slow_endpoint_times_out_quickly(exporter: Exporter) -> None:
    exporter.delay = 3.0
    collector = DcgmCollector(exporter.url, timeout=0.3)
    start = time.monotonic()
    assert collector.collect(ctx()) == []
    assert time.monotonic() - start < 2.0
    assert collector.health().state is HealthState.DOWN


def test_garbage_page_is_down(exporter: Exporter) -> None:
    exporter.page = "<html><body>502 Bad Gateway</body></html>\n"
    collector = DcgmCollector(exporter.url)
    assert collector.collect(ctx()) == []
    assert collector.health().state is HealthState.DOWN
    exporter.page = HOSTNAME_PAGE  # recovers on the next scrape
    split(collector.collect(ctx()))
    assert collector.health().state is HealthState.OK


def test_damaged_lines_degrade_but_good_samples_survive(exporter: Exporter) -> None:
    lines = HOSTNAME_PAGE.splitlines()
    bad = next(i for i, line in enumerate(lines) if line.startswith('DCGM_FI_DEV_GPU_TEMP{gpu="4"'))
    lines[bad] = lines[bad][:60]  # truncated mid-label
    lines.insert(5, "garbage here")
    exporter.page = "\n".join(lines) + "\n"
    collector = DcgmCollector(exporter.url)
    msg, _ = split(collector.collect(ctx()))
    assert len(msg.gpus) == 8
    assert msg.gpus[4].temp_gpu_c is None and msg.gpus[4].power_w is not None
    assert msg.gpus[3].temp_gpu_c is not None
    assert collector.health().state is HealthState.DEGRADED
    assert collector.error_counts() == {"garbled": 1}


def test_unusable_values_and_mig_samples(exporter: Exporter) -> None:
    mig = (
        'DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-5d0c3b2e-8f41-4b7a-9c26-1e7f0a3d9b10",'
        'device="nvidia0",modelName="NVIDIA H100 80GB HBM3",GPU_I_PROFILE="1g.10gb",'
        'GPU_I_ID="9",Hostname="gpu-node-017"} 99\n'
    )
    lines = []
    for line in HOSTNAME_PAGE.splitlines():
        if line.startswith('DCGM_FI_DEV_POWER_USAGE{gpu="1"'):
            line = line.rsplit(" ", 1)[0] + " NaN"
        if line.startswith('DCGM_FI_DEV_MEM_CLOCK{gpu="2"'):
            line = line.rsplit(" ", 1)[0] + " 2147483632"  # DCGM int32 blank
        lines.append(line)
    exporter.page = "\n".join(lines) + "\n" + mig
    collector = DcgmCollector(exporter.url)
    msg, _ = split(collector.collect(ctx()))
    assert msg.gpus[1].power_w is None
    assert msg.gpus[2].mem_clock_mhz is None  # blank: no data, not an error
    assert msg.gpus[0].temp_gpu_c != 99.0  # MIG instance sample ignored
    assert collector.error_counts() == {"bad_value": 1}


def test_promtext_keeps_counter_family_names() -> None:
    page = parse(HOSTNAME_PAGE)
    assert page.bad_lines == 0
    families = {s.family for s in page.samples}
    assert "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION" in families
    assert not any(f.endswith("_total") for f in families)
    assert len(page.samples) == 24 * 8


def test_promtext_edge_cases_and_label_cache() -> None:
    text = (
        "# HELP a help\n# TYPE a gauge\n"
        'a{b="}",c="x y"} 1 1767225600000\n'
        "b 2\n"
        "c{} 3\n"
        'd{x="\\"q\\"",y="\\\\"} NaN\n'
        "e{ 5\n"  # unterminated
        'f{a="1"}\n'  # no value
        "9bad 1\n"  # bad name
        'g{a="1"} 1 2 3\n'  # too many fields
    )
    page = parse(text)
    assert [(s.family, s.labels) for s in page.samples] == [
        ("a", {"b": "}", "c": "x y"}),
        ("b", {}),
        ("c", {}),
        ("d", {"x": '"q"', "y": "\\"}),
    ]
    assert page.samples[0].value == 1.0
    assert page.bad_lines == 4 and page.first_bad == "e{ 5"
    parser = Parser()
    first = parser.parse(HOSTNAME_PAGE)
    second = parser.parse(HOSTNAME_PAGE)
    assert first == second and len(parser._labels) == 8  # one label set per GPU

"""The names users already query work on stepwatch's series: every query of NVIDIA's
dcgm-exporter Grafana dashboard (grafana.com 12239, NVIDIA/dcgm-exporter
grafana/dcgm-exporter-dashboard.json) and node_exporter's InfiniBand names return data
from a real Prometheus that scraped a simulated run with alerts/rules/names.yml loaded."""

from __future__ import annotations

import pytest

from stepwatch.alerts.config import RULES_DIR
from stepwatch.daemons.prometheus import wait_for
from tests.support import dash_metrics as M

pytestmark = pytest.mark.integration
# Dashboard 12239's panels, as published (panel title -> expr); $instance and $gpu are
# its two query variables, $datasource the datasource variable.
DCGM_12239 = {
    "GPU Temperature": 'DCGM_FI_DEV_GPU_TEMP{instance=~"$instance", gpu=~"$gpu"}',
    "GPU Avg. Temp": 'avg(DCGM_FI_DEV_GPU_TEMP{instance=~"$instance", gpu=~"$gpu"})',
    "GPU Power Usage": 'DCGM_FI_DEV_POWER_USAGE{instance=~"$instance", gpu=~"$gpu"}',
    "GPU Power Total": 'sum(DCGM_FI_DEV_POWER_USAGE{instance=~"$instance", gpu=~"$gpu"})',
    "GPU SM Clocks": 'DCGM_FI_DEV_SM_CLOCK{instance=~"$instance", gpu=~"$gpu"} * 1000000',
    "GPU Utilization": 'DCGM_FI_DEV_GPU_UTIL{instance=~"$instance", gpu=~"$gpu"}',
    "Tensor Core Utilization": (
        'DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{instance=~"$instance", gpu=~"$gpu"}'
    ),
    "GPU Framebuffer Mem Used": 'DCGM_FI_DEV_FB_USED{instance=~"$instance", gpu=~"$gpu"}',
}
VARIABLES = {
    "instance": "label_values(DCGM_FI_DEV_GPU_TEMP, instance)",
    "gpu": "label_values(DCGM_FI_DEV_GPU_TEMP, gpu)",
}
NODE_EXPORTER = [
    'rate(node_infiniband_port_data_transmitted_bytes_total{device=~".+", port=~".+"}[30s]) > 0',
    "rate(node_infiniband_port_data_received_bytes_total[30s]) > 0",
    "node_infiniband_rate_bytes_per_second > 0",
    "node_infiniband_port_transmit_wait_total",
]


@pytest.fixture(scope="module")
def prom(tmp_path_factory):
    from stepwatch.daemons.prometheus import Prometheus

    served = M.serve_all(str(tmp_path_factory.mktemp("spool")))
    p = Prometheus(
        workdir=tmp_path_factory.mktemp("prom"),
        targets=[],
        scrape_jobs={job: [t] for job, t in served.targets.items()},
        rule_files=[RULES_DIR / "names.yml"],
    ).start()
    try:
        wait_for(
            lambda: p.query("count_over_time(DCGM_FI_DEV_GPU_TEMP[1m]) >= 4"),
            60,
            what="four evaluations of the dcgm names",
        )
        yield p
    finally:
        p.stop()
        served.close()


def _values(prom, variable: str) -> list[str]:
    metric, label = VARIABLES[variable][len("label_values(") : -1].split(", ")
    return sorted({s.labels[label] for s in prom.query(metric)})


def test_dashboard_12239_variables_list_values(prom) -> None:
    assert len(_values(prom, "gpu")) == 8
    assert len(_values(prom, "instance")) == 1


@pytest.mark.parametrize("panel", sorted(DCGM_12239))
def test_every_dashboard_12239_query_returns_data(prom, panel: str) -> None:
    # as Grafana runs it with "All" selected, and with one value of each variable chosen
    instance, gpu = _values(prom, "instance")[0], _values(prom, "gpu")[-1]
    for inst, g in ((".*", ".*"), (instance, gpu)):
        expr = DCGM_12239[panel].replace("$instance", inst).replace("$gpu", g)
        got = prom.query(expr)
        assert got, f"{panel}: {expr} returned nothing"
        if g != ".*" and "(" not in expr:
            assert {s.labels["gpu"] for s in got} == {g}


def test_units_are_dcgms(prom) -> None:
    # the recorded sample and the scraped one are taken at different instants of a moving
    # replay: the ratio tells the unit (1e-6 for Hz -> MHz, 100 for ratio -> %), not more
    clock = prom.query("max(DCGM_FI_DEV_SM_CLOCK) / max(stepwatch_gpu_sm_clock_hertz)")
    util = prom.query("max(DCGM_FI_DEV_GPU_UTIL) / max(stepwatch_gpu_utilization_ratio)")
    assert clock and clock[0].value == pytest.approx(1e-6, rel=0.1)
    assert util and util[0].value == pytest.approx(100, rel=0.1)
    labels = prom.query("DCGM_FI_DEV_POWER_USAGE")[0].labels
    assert {"gpu", "UUID", "Hostname", "host", "device", "instance"} <= set(labels)
    assert labels["Hostname"] == labels["host"] == M.HOST and labels["device"].startswith("nvidia")


def test_framebuffer_is_dcgms_mib(prom) -> None:
    ratio = prom.query("max(DCGM_FI_DEV_FB_USED) / max(stepwatch_gpu_framebuffer_used_bytes)")
    assert ratio and ratio[0].value == pytest.approx(2**-20, rel=0.1)


@pytest.mark.parametrize("expr", NODE_EXPORTER)
def test_node_exporter_infiniband_names_return_data(prom, expr: str) -> None:
    got = prom.query(expr)
    assert got, expr
    assert {"device", "port", "host"} <= set(got[0].labels)

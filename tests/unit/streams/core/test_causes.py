"""Cause attribution of stragglers from GPU and port samples, and counter handling."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from stepwatch.contract import DetectionMessage, Message, PortMessage, PortReading
from stepwatch.contract.counters import WRAP_32
from stepwatch.streams.core import Engine
from stepwatch.streams.core.hostwindow import HostWindow
from tests.support.detect_synth import (
    T0,
    Job,
    drive,
    gpu_message,
    interleave,
    num,
    opened,
    port_message,
)

GpuFn = Callable[[int], dict]  # seconds since the fault -> overrides of GPU 5 on h000
PortFn = Callable[[int], dict]  # seconds since the fault -> counters of NIC 5 on h000


def _run(gpu: GpuFn, port: PortFn, slow_data: bool = False) -> list[DetectionMessage]:
    fault_step = 20
    if slow_data:
        job = Job(world=16, steps=50, slow_data={5: (fault_step, 0.15)})
    else:
        job = Job(world=16, steps=50, slow={5: (fault_step, 1.15)})
    messages = job.messages()
    fault_ts = T0 + fault_step * 1.0
    samples: list[Message] = []
    for k in range(-30, 45):
        t = fault_ts + k
        after = max(k, 0) if k >= 0 else -1
        for h in job.hosts():
            own = h == "h000" and after >= 0
            gpu_over = {5: gpu(after)} if own else {}
            samples.append(gpu_message(h, t, gpu_over, job_id=job.job_id))
            counters = {5: port(after if own else -1)}
            samples.append(port_message(h, t, counters))
    return opened(drive(Engine(), interleave(messages, samples)), "straggler")


def _healthy(_: int) -> dict:
    return {}


def _healthy_port(k: int) -> dict:
    return {"np_cnp_sent_total": 10 + max(k, 0), "xmit_wait_total": 1000 + 100 * max(k, 0)}


CASES = {
    "thermal": (
        {"throttle_reasons": 0x40 | 0x20, "temp_gpu_c": 89.0, "sm_clock_mhz": 1700.0},
        None,
        "gpu",
        "throttled (HwThermal)",
    ),
    "low clock": ({"sm_clock_mhz": 1800.0}, None, "gpu", "SM clock below max"),
    "power cap": (
        {"throttle_reasons": 0x4, "power_w": 560.0, "power_limit_w": 560.0},
        None,
        "gpu",
        "throttled (SwPowerCap)",
    ),
    "double-bit ECC": (
        lambda k: {"ecc_dbe_total": 1 if k > 2 else 0},
        None,
        "hardware",
        "1 double-bit ECC errors",
    ),
    "congestion": (
        None,
        lambda k: {"np_cnp_sent_total": 10 + 5000 * k, "xmit_wait_total": 1000 + 10**7 * k},
        "network",
        "congestion (ECN/CNP) on mlx5_5",
    ),
    "link errors": (
        None,
        lambda k: {"symbol_error_total": 40 * k},
        "network",
        "link errors on mlx5_5",
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_straggler_cause_from_its_gpu_and_nic(name: str) -> None:
    gpu, port, cause, reason = CASES[name]
    gpu_fn = gpu if callable(gpu) else (lambda k, g=gpu: dict(g) if g else {})
    port_fn = port or _healthy_port
    found = _run(gpu_fn, port_fn)
    assert [d.rank for d in found] == [5]
    assert (found[0].cause, found[0].fault) == (cause, "system")
    assert found[0].evidence["cause_reason"] == reason


def test_slow_data_phase_with_healthy_gpu_and_nic_is_host_input() -> None:
    found = _run(_healthy, _healthy_port, slow_data=True)
    assert [(d.rank, d.cause) for d in found] == [(5, "host_input")]
    assert num(found[0], "data_share_of_excess") > 0.9


def test_slow_compute_with_healthy_signals_is_gpu_compute() -> None:
    """The phases point at the GPU: its compute is longer than its peers', data is not."""
    found = _run(_healthy, _healthy_port)
    assert [(d.rank, d.cause, d.fault) for d in found] == [(5, "gpu", "system")]
    assert num(found[0], "compute_share_of_excess") > 0.9
    assert found[0].evidence["gpu_reasons"] == "compute"


def test_power_cap_common_to_all_gpus_is_not_blamed() -> None:
    job = Job(world=16, steps=50, slow={5: (20, 1.15)})
    capped = {i: {"throttle_reasons": 0x4, "power_w": 700.0} for i in range(8)}
    samples = [gpu_message(h, T0 + k, capped) for k in range(60) for h in job.hosts()]
    found = opened(drive(Engine(), interleave(job.messages(), samples)), "straggler")
    assert [(d.rank, d.cause) for d in found] == [(5, "gpu")]
    assert "power" not in found[0].evidence["cause_reason"]  # the common cap is not the reason
    assert found[0].evidence["gpu_reasons"] == "compute"


def _port(ts: float, cnp: int | None = None, wait: int | None = None) -> PortMessage:
    reading = PortReading(device="mlx5_0", port=1, np_cnp_sent_total=cnp, xmit_wait_total=wait)
    return PortMessage(host="h", ts=ts, ports=[reading])


def test_counter_reset_in_the_window_never_gives_a_negative_or_huge_rate() -> None:
    win = HostWindow("h", 64)
    values = [5_000_000, 5_000_100, 5_000_200, 40, 140]  # the counter reset (driver reload)
    for i, v in enumerate(values):
        win.add(_port(T0 + i, cnp=v, wait=v))
    sig = win.port_signals(T0, T0 + 10)[0]
    assert sig.cnp_per_s == pytest.approx((100 + 100 + 40 + 100) / 4)
    assert sig.xmit_wait_per_s == pytest.approx(340 / 4)


def test_32_bit_counter_wrap_is_an_increase() -> None:
    """The mlx5 hw_counters (CNP, ECN) are 32-bit queue counters: they wrap."""
    win = HostWindow("h", 64)
    for i, v in enumerate([WRAP_32 - 300, WRAP_32 - 100, 100]):
        win.add(_port(T0 + i, cnp=v))
    assert win.port_signals(T0, T0 + 10)[0].cnp_per_s == pytest.approx(400 / 2)


@pytest.mark.parametrize("ends_only", [False, True])
def test_a_cleared_infiniband_counter_is_a_reset_not_a_wrap(ends_only: bool) -> None:
    """The IB PMA counters (port_xmit_wait, the error counters) saturate, never wrap: a
    decrease is a reset (``perfquery -R``). Read as a wrap, clearing a port whose
    port_xmit_wait stood at 3.5e9 was ~8e8 ticks of congestion in one second."""
    win = HostWindow("h", 64)
    top = 3_500_000_000
    for i, v in enumerate([top, top + 1000, 400]):
        win.add(_port(T0 + i, cnp=i, wait=v))
    sig = win.port_signals(T0, T0 + 10, ends_only=ends_only)[0]
    # the ends alone see only the reset: what grew since it (a reset costs the window)
    assert sig.xmit_wait_per_s == pytest.approx((400 if ends_only else 1000 + 400) / 2)


def test_link_down_in_port_samples_and_events_opens_one_link_flap() -> None:
    from stepwatch.contract import EventType
    from tests.support.detect_synth import event

    job = Job(world=16, steps=60)
    t = T0 + 30.2
    extra: list[Message] = [
        port_message("h001", T0 + k, {2: {"state": "DOWN"}} if 30 < k < 34 else None)
        for k in range(60)
    ]
    extra.append(
        event(
            EventType.LINK_STATE,
            "h001",
            t,
            job_id=job.job_id,
            device="mlx5_2",
            port=1,
            detail="ACTIVE->DOWN",
        )
    )
    extra.append(
        event(
            EventType.LINK_STATE,
            "h001",
            t + 3,
            job_id=job.job_id,
            device="mlx5_2",
            port=1,
            detail="DOWN->ACTIVE",
        )
    )
    found = drive(Engine(), interleave(job.messages(), extra))
    flaps = [(d.type, d.state, d.host, d.cause) for d in found]
    assert flaps == [
        ("link_flap", "open", "h001", "network"),
        ("link_flap", "resolved", "h001", "network"),
    ]
    assert found[0].ts == pytest.approx(t, abs=1e-3)
    # the NIC in the detection's own fields, not only its summary and evidence
    assert (found[0].device, found[0].port, len(found[0].ranks)) == ("mlx5_2", 1, 8)


def test_job_cpu_contention_needs_a_larger_waiting_share_not_more_seconds() -> None:
    from stepwatch.streams.core.causes import job_cpu_contention

    # baseline: 0.02 s waiting for 0.98 s on a CPU (2 %); the job lost 0.3 s per step
    contended = job_cpu_contention(((0.02, 0.98), (0.30, 0.98)), 0.3)
    assert contended is not None and contended["host_reasons"] == "cpu_contention"
    assert contended["cpu_wait_share_now"] == pytest.approx(0.234, abs=0.001)
    # the ranks computed 30 % more and waited 30 % more: the same share, no contention
    assert job_cpu_contention(((0.02, 0.98), (0.026, 1.274)), 0.3) is None
    # a rise too small for the time lost, no growth, no numbers: nothing said
    assert job_cpu_contention(((0.02, 0.98), (0.1, 0.98)), 0.3) is None
    assert job_cpu_contention(((0.02, 0.98), (0.30, 0.98)), 0.0) is None
    assert job_cpu_contention(None, 0.3) is None

"""Each injected fault produces its signals and a ground-truth label."""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pytest

from stepwatch.contract import (
    EventMessage,
    EventType,
    GpuMessage,
    GpuReading,
    Message,
    PortMessage,
    PortReading,
    StepMessage,
)
from stepwatch.errors import ConfigError
from stepwatch.sim import Fault, FaultKind, Label, Scenario, StepTable, ground_truth, simulate

START = 30


@dataclass
class Run:
    sc: Scenario
    messages: list[Message]
    label: Label

    @property
    def table(self) -> StepTable:
        return StepTable.from_messages(self.messages)

    def t(self, message: Message) -> float:
        return message.ts - self.label.start_ts

    def gpu(self, host: str, index: int) -> list[tuple[float, GpuReading | None]]:
        out = []
        for m in self.messages:
            if isinstance(m, GpuMessage) and m.host == host:
                out.append((self.t(m), next((g for g in m.gpus if g.index == index), None)))
        return out

    def port(self, host: str, device: str) -> list[tuple[float, PortReading]]:
        return [
            (self.t(m), next(p for p in m.ports if p.device == device))
            for m in self.messages
            if isinstance(m, PortMessage) and m.host == host
        ]

    def events(self, kind: EventType) -> list[EventMessage]:
        return [m for m in self.messages if isinstance(m, EventMessage) and m.type is kind]


def run(kind: FaultKind, steps: int = 70, **target: object) -> Run:
    fault = Fault(kind, start_step=START, **target)  # type: ignore[arg-type]
    sc = Scenario(nodes=2, steps=steps, eval_every=0, checkpoint_every=0, faults=(fault,))
    labels = ground_truth(sc)
    assert len(labels) == 1
    return Run(sc, list(simulate(sc)), labels[0])


def rate(samples: list[tuple[float, PortReading]], field: str, after: float) -> float:
    pts = [(t, getattr(p, field)) for t, p in samples if t >= after]
    (t0, v0), (t1, v1) = pts[0], pts[-1]
    return float((v1 - v0) / (t1 - t0))


@pytest.mark.parametrize(
    ("kind", "detection", "cause", "fault_class"),
    [
        (FaultKind.SLOW_GPU, "straggler", "gpu", "system"),
        (FaultKind.THERMAL_THROTTLE, "straggler", "gpu", "system"),
        (FaultKind.POWER_THROTTLE, "straggler", "gpu", "system"),
        (FaultKind.NIC_CONGESTION, "straggler", "network", "system"),
        (FaultKind.LINK_FLAP, "link_flap", "network", "system"),
        (FaultKind.XID79, "rank_missing", "hardware", "system"),
        (FaultKind.XID48, "rank_missing", "hardware", "system"),
        (FaultKind.DATALOADER_STALL, "straggler", "host_input", "system"),
        (FaultKind.JOB_HANG, "hang", "unknown", "system"),
        (FaultKind.RANK_CRASH, "rank_missing", "unknown", "system"),
        (FaultKind.SLOW_RANK, "straggler", "gpu", "system"),  # compute longer, telemetry healthy
        (FaultKind.NAN_LOSS, "user_error", "user", "user"),
    ],
)
def test_every_fault_kind_has_one_clear_expected_outcome(
    kind: FaultKind, detection: str, cause: str, fault_class: str
) -> None:
    sc = Scenario(nodes=2, steps=50, faults=(Fault(kind, start_step=START),))
    (label,) = ground_truth(sc)
    assert (label.kind, label.detection, label.cause, label.fault_class) == (
        kind.value,
        detection,
        cause,
        fault_class,
    )
    assert label.job_id == "job-1" and label.start_step == START
    assert label.start_ts > sc.start_ts
    data = json.loads(json.dumps(label.to_dict()))
    assert data["detection"] == detection and isinstance(data["ranks"], list)


def test_slow_gpu_runs_below_max_clock_without_a_throttle_reason() -> None:
    r = run(FaultKind.SLOW_GPU, rank=3, severity=0.1)
    assert r.label.ranks == (3,) and r.label.host == "node0000" and r.label.gpu == 3
    t = r.table
    assert (t.compute[t.rows(START + 1)].argmax(axis=1) == 3).mean() > 0.9
    busy = [g for ts, g in r.gpu("node0000", 3) if 3 < ts < 35 and g is not None]
    assert busy and all(g.sm_clock_mhz == 1800.0 and g.throttle_reasons == 0 for g in busy)
    before = [g for ts, g in r.gpu("node0000", 3) if -20 < ts < -2 and g is not None]
    assert all(g.sm_clock_mhz is not None and g.sm_clock_mhz >= 1935 for g in before)


def test_thermal_throttle_is_hot_with_thermal_reasons_and_a_low_clock() -> None:
    r = run(FaultKind.THERMAL_THROTTLE, rank=3, severity=0.2)
    late = [g for ts, g in r.gpu("node0000", 3) if 20 < ts < 35 and g is not None]
    assert all(g.temp_gpu_c is not None and g.temp_gpu_c >= 85 for g in late)
    assert all((g.throttle_reasons or 0) & 0x60 == 0x60 for g in late)
    assert all(g.sm_clock_mhz is not None and g.sm_clock_mhz < 1700 for g in late)
    peers = [g for ts, g in r.gpu("node0000", 4) if 20 < ts < 35 and g is not None]
    assert all(g.temp_gpu_c is not None and g.temp_gpu_c < 80 for g in peers)


def test_power_throttle_sits_at_its_power_limit_with_the_power_cap_reason() -> None:
    r = run(FaultKind.POWER_THROTTLE, rank=3, severity=0.1)
    late = [g for ts, g in r.gpu("node0000", 3) if 3 < ts < 35 and g is not None]
    for g in late:
        assert g.power_limit_w is not None and g.power_limit_w < 700
        assert g.power_w is not None and g.power_w >= 0.98 * g.power_limit_w
        assert (g.throttle_reasons or 0) & 0x4
    peer_caps = [g for ts, g in r.gpu("node0000", 4) if 3 < ts < 35 and g and g.throttle_reasons]
    assert len(peer_caps) <= 2  # healthy GPUs brush the cap only now and then


def test_nic_congestion_raises_ecn_cnp_and_xmit_wait_on_that_nic_and_its_rank_waits_least() -> None:
    r = run(FaultKind.NIC_CONGESTION, rank=10, severity=0.1)
    assert (r.label.host, r.label.device, r.label.port, r.label.ranks) == (
        "node0001",
        "mlx5_2",
        1,
        (10,),
    )
    hot, calm = r.port("node0001", "mlx5_2"), r.port("node0001", "mlx5_5")
    assert rate(hot, "np_ecn_marked_roce_packets_total", 2) > 500
    assert rate(hot, "np_cnp_sent_total", 2) > 400
    assert rate(hot, "rp_cnp_handled_total", 2) > 400
    assert rate(hot, "xmit_wait_total", 2) > 1e5
    assert rate(calm, "np_ecn_marked_roce_packets_total", 2) < 5
    assert rate(calm, "xmit_wait_total", 2) < 2e4
    assert rate(hot, "np_ecn_marked_roce_packets_total", -25) < rate(
        hot, "np_ecn_marked_roce_packets_total", 2
    )
    t = r.table
    after = t.rows(START + 1)
    assert (t.comm_wait[after].argmin(axis=1) == 10).mean() > 0.9
    steps = [s for m in r.messages if isinstance(m, StepMessage) for s in m.steps]
    assert all("comm_transfer" in s.phases.extra for s in steps if s.rank == 10 and s.step > START)  # type: ignore[union-attr]


def test_link_flap_goes_down_and_up_with_counters_and_a_stalled_step() -> None:
    r = run(FaultKind.LINK_FLAP, rank=10, duration_seconds=3.0)
    down, up = r.events(EventType.LINK_STATE)
    assert (down.host, down.device, down.port, down.detail) == (
        "node0001",
        "mlx5_2",
        1,
        "ACTIVE->DOWN",
    )
    assert up.detail == "DOWN->ACTIVE" and up.ts - down.ts == pytest.approx(3.0)
    samples = r.port("node0001", "mlx5_2")
    assert any(p.state == "DOWN" and p.phys_state == "Polling" for _, p in samples)
    first, last = samples[0][1], samples[-1][1]
    assert last.link_downed_total == (first.link_downed_total or 0) + 1
    assert (last.link_error_recovery_total or 0) > (first.link_error_recovery_total or 0)
    assert (last.symbol_error_total or 0) > (first.symbol_error_total or 0)
    t = r.table
    assert t.duration[t.steps == START].min() > 3.0  # everyone waited for the link
    assert np.median(t.duration[t.rows(START + 1)]) < 1.2  # and only that step
    assert r.label.end_step == START + 1 and r.label.end_ts == pytest.approx(up.ts, abs=1e-5)


@pytest.mark.parametrize("kind", [FaultKind.XID79, FaultKind.XID48, FaultKind.RANK_CRASH])
def test_a_dead_rank_is_missing_and_its_peers_block(kind: FaultKind) -> None:
    r = run(kind, rank=3)
    t = r.table
    assert t.steps.max() == START  # nobody finishes a step after the crash
    assert np.isnan(t.duration[t.steps == START][0, 3])  # rank 3 is missing from the last one
    assert (~np.isnan(np.delete(t.duration[t.steps == START][0], 3))).all()
    samples = r.gpu("node0000", 3)
    assert samples[-1][0] > 60  # the agents keep reporting: a hang is silence of steps only
    peers = [g for ts, g in r.gpu("node0000", 4) if ts > 10 and g is not None]
    assert all((g.util_gpu_pct or 0) > 90 and (g.power_w or 0) < 300 for g in peers)  # NCCL spin
    xids = r.events(EventType.XID)
    if kind is FaultKind.RANK_CRASH:
        assert not xids
        late = [g for ts, g in samples if ts > 5]
        assert all(g is not None and g.fb_used_mib is not None and g.fb_used_mib < 10 for g in late)
    else:
        (xid,) = xids
        assert (xid.code, xid.host, xid.gpu, xid.rank) == (int(kind.value[3:]), "node0000", 3, 3)
        assert xid.ts == pytest.approx(r.label.start_ts)
    if kind is FaultKind.XID79:
        assert all(g is None for ts, g in samples if ts > 2)  # fell off the bus
    if kind is FaultKind.XID48:
        assert [e.detail for e in r.events(EventType.ECC)] == ["double_bit"]
        late = [g for ts, g in samples if ts > 2]
        assert all(g is not None and g.ecc_dbe_total == 1 and g.remapped_rows_pending for g in late)


def test_dataloader_stall_shows_in_the_data_phase_with_healthy_gpus() -> None:
    r = run(FaultKind.DATALOADER_STALL, host="node0001", severity=0.3)
    assert r.label.ranks == tuple(range(8, 16)) and r.label.rank is None
    t = r.table
    after = t.rows(START + 1)
    assert np.median(t.data[after][:, 8:]) > 10 * np.median(t.data[after][:, :8])
    assert np.median(t.compute[after][:, 8:]) == pytest.approx(
        np.median(t.compute[after][:, :8]), rel=0.02
    )
    assert (t.comm_wait[after].argmin(axis=1) >= 8).mean() > 0.9
    gpus = [g for ts, g in r.gpu("node0001", 0) if 3 < ts < 30 and g is not None]
    assert all(g.throttle_reasons == 0 or g.throttle_reasons == 0x4 for g in gpus)
    assert np.median([g.util_gpu_pct for g in gpus]) < 90  # starved of input


def test_job_hang_stops_every_rank_and_gpus_go_idle() -> None:
    r = run(FaultKind.JOB_HANG)
    t = r.table
    assert t.steps.max() == START - 1
    assert r.label.start_ts == pytest.approx(float(np.nanmax(t.end[-1])), abs=1e-3)
    late = [g for ts, g in r.gpu("node0001", 2) if ts > 5]
    assert len(late) > 100  # the hosts keep reporting
    assert all(g is not None and g.util_gpu_pct == 0 and (g.fb_used_mib or 0) > 1000 for g in late)
    assert not r.events(EventType.JOB_END)


def test_nan_loss_is_a_user_error_that_ends_the_job() -> None:
    r = run(FaultKind.NAN_LOSS)
    steps = [s for m in r.messages if isinstance(m, StepMessage) for s in m.steps if s.rank == 15]
    assert all(s.loss_nonfinite and s.loss is None for s in steps if s.step >= START)
    assert all(not s.loss_nonfinite and s.loss is not None for s in steps if s.step < START)
    (exc,) = r.events(EventType.EXCEPTION)
    assert "nan" in exc.detail.lower() and exc.attrs["user_code"] is True
    (end,) = r.events(EventType.JOB_END)
    assert end.code == 1 and end.ts > exc.ts
    assert r.label.fault_class == "user" and r.label.action == "notify_user"


def test_slow_rank_has_no_explaining_signal() -> None:
    r = run(FaultKind.SLOW_RANK, rank=6, severity=0.1)
    t = r.table
    assert (t.compute[t.rows(START + 1)].argmax(axis=1) == 6).mean() > 0.9
    busy = [g for ts, g in r.gpu("node0000", 6) if 3 < ts < 35 and g is not None]
    assert all(g.sm_clock_mhz is not None and g.sm_clock_mhz >= 1935 for g in busy)


def test_end_step_ends_the_fault_and_the_label_says_when() -> None:
    fault = Fault(FaultKind.SLOW_GPU, rank=2, start_step=20, end_step=40)
    sc = Scenario(nodes=2, steps=70, eval_every=0, checkpoint_every=0, faults=(fault,))
    (label,) = ground_truth(sc)
    t = StepTable.from_messages(simulate(sc))
    assert label.end_step == 40
    assert label.end_ts == pytest.approx(float(np.nanmin(t.start[t.steps == 40])), abs=1e-3)
    assert (t.compute[t.rows(45)].argmax(axis=1) == 2).mean() < 0.3


def test_targets_resolve_to_hosts_gpus_and_nics() -> None:
    sc = Scenario(
        nodes=3,
        steps=30,
        faults=(
            Fault(FaultKind.SLOW_GPU, host="node0002", start_step=10),  # a lemon node: every GPU
            Fault(FaultKind.THERMAL_THROTTLE, host="node0001", gpu=4, start_step=10),
            Fault(
                FaultKind.NIC_CONGESTION, host="node0000", start_step=10
            ),  # every NIC of the host
            Fault(FaultKind.RANK_CRASH, start_step=25),  # a rank drawn from the seed
        ),
    )
    labels = {label.kind: label for label in ground_truth(sc)}
    assert labels["slow_gpu"].ranks == tuple(range(16, 24)) and labels["slow_gpu"].rank is None
    assert labels["thermal_throttle"].rank == 12 and labels["thermal_throttle"].gpu == 4
    assert (
        labels["nic_congestion"].ranks == tuple(range(8))
        and labels["nic_congestion"].device is None
    )
    crash = labels["rank_crash"]
    assert crash.rank is not None and crash.rank == ground_truth(sc)[-1].rank  # a stable draw
    with pytest.raises(ConfigError, match="not on host"):
        Scenario(nodes=2, faults=(Fault(FaultKind.SLOW_GPU, rank=3, host="node0001"),))
    with pytest.raises(ConfigError, match="not in the job"):
        Scenario(nodes=2, faults=(Fault(FaultKind.SLOW_GPU, host="nope"),))
    with pytest.raises(ConfigError, match="outside the job"):
        Scenario(nodes=2, faults=(Fault(FaultKind.XID79, rank=16),))
    with pytest.raises(ConfigError, match="before 2001-09-09"):  # every message refused
        Scenario(nodes=2, start_ts=1000.0)


def test_faults_after_the_job_stopped_have_no_label() -> None:
    sc = Scenario(
        nodes=1,
        steps=60,
        faults=(
            Fault(FaultKind.JOB_HANG, start_step=20),
            Fault(FaultKind.SLOW_GPU, rank=1, start_step=40),
        ),
    )
    assert [label.kind for label in ground_truth(sc)] == ["job_hang"]

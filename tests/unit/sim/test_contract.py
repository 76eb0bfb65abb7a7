"""Simulated messages satisfy the contract and look like a real fleet."""

from __future__ import annotations

from collections import defaultdict

import msgspec
import pytest

from stepwatch.contract import (
    EventMessage,
    EventType,
    GpuMessage,
    Message,
    PortMessage,
    StepMessage,
    decode,
    encode,
)
from stepwatch.sim import Fault, FaultKind, Scenario, simulate

FAULTS = (
    Fault(FaultKind.THERMAL_THROTTLE, rank=1, start_step=15),
    Fault(FaultKind.NIC_CONGESTION, rank=9, start_step=15),
    Fault(FaultKind.LINK_FLAP, rank=12, start_step=20),
    Fault(FaultKind.XID48, rank=6, start_step=40),
)
A = Scenario(nodes=2, steps=60, checkpoint_every=25, eval_every=20, faults=FAULTS)
B = Scenario(
    seed=7, job_id="job-2", nodes=2, steps=40, hosts=("gpu-a", "gpu-b"), start_ts=A.start_ts + 3.3
)


@pytest.fixture(scope="module")
def messages() -> list[Message]:
    return list(simulate(A, B))


def test_every_message_decodes_and_passes_the_value_checks(messages: list[Message]) -> None:
    far = A.start_ts + 1e6
    for message in messages:
        assert decode(encode(message), now=lambda: far) == message


def test_merged_stream_is_time_ordered_with_gap_free_sequences(messages: list[Message]) -> None:
    stamps = [m.ts for m in messages]
    assert stamps == sorted(stamps)
    seqs: dict[tuple[str, str], list[int]] = defaultdict(list)
    for m in messages:
        seqs[(m.host, type(m).__name__)].append(m.seq)
        assert m.inst.startswith("sim") and m.v == 1
    assert all(s == list(range(len(s))) for s in seqs.values())
    hosts = {m.host for m in messages}
    assert hosts == {"node0000", "node0001", "gpu-a", "gpu-b"}


def test_steps_are_batched_per_host_per_tick_and_placed_on_their_host(
    messages: list[Message],
) -> None:
    for m in messages:
        if isinstance(m, StepMessage):
            assert m.steps and all(r.end <= m.ts and r.host == m.host for r in m.steps)
            for r in m.steps:
                assert r.host == (A if r.job_id == "job-1" else B).host_of(r.rank)
                assert r.local_rank == r.gpu == r.rank % 8 and r.world_size == 16
    steps = [m for m in messages if isinstance(m, StepMessage) and m.job_id == "job-1"]
    per_host_tick = max(len(m.steps) for m in steps)
    assert 8 <= per_host_tick <= 24  # a 1 s tick holds about one step of each local rank


def test_gpu_readings_are_realistic_h100_values(messages: list[Message]) -> None:
    gpus = [(m, g) for m in messages if isinstance(m, GpuMessage) for g in m.gpus]
    assert all(
        len(m.gpus) == 8 for m in messages if isinstance(m, GpuMessage) and m.host != "node0000"
    )
    for _, g in gpus:
        assert g.name == "NVIDIA H100 80GB HBM3" and g.uuid.startswith("GPU-")
        assert (
            g.sm_clock_max_mhz == 1980
            and g.sm_clock_mhz is not None
            and 345 <= g.sm_clock_mhz <= 1980
        )
        assert g.power_w is not None and 50 <= g.power_w <= 700
        assert g.temp_gpu_c is not None and 30 <= g.temp_gpu_c <= 95
        assert g.util_gpu_pct is not None and 0 <= g.util_gpu_pct <= 100
        assert g.fb_used_mib is not None and g.fb_free_mib is not None
        assert g.fb_used_mib + g.fb_free_mib <= 81559
    busy = [g for _, g in gpus if (g.util_gpu_pct or 0) > 90]
    assert len(busy) > 0.6 * len(gpus)
    assert all(400 <= (g.power_w or 0) <= 700 for g in busy if (g.tensor_active or 0) > 0.4)
    warm = [g for m, g in gpus if m.ts - A.start_ts > 40 and (g.util_gpu_pct or 0) > 90]
    assert all(40 <= (g.temp_gpu_c or 0) <= 80 for g in warm if g.index != 1)  # 1 is throttling
    idle = [g for _, g in gpus if g.util_gpu_pct == 0]
    assert idle and all(g.sm_clock_mhz == 345 and g.throttle_reasons == 1 for g in idle)


COUNTERS_GPU = (
    "energy_mj_total",
    "ecc_sbe_total",
    "ecc_dbe_total",
    "nvlink_tx_bytes_total",
    "pcie_replay_total",
    "remapped_rows_uncorrectable",
)


def test_counters_only_go_up(messages: list[Message]) -> None:
    last: dict[tuple[str, object, str], int] = {}
    for m in messages:
        if isinstance(m, GpuMessage | PortMessage):
            readings = m.gpus if isinstance(m, GpuMessage) else m.ports
            for reading in readings:
                key = (
                    getattr(reading, "index", None) if isinstance(m, GpuMessage) else reading.device
                )  # type: ignore[union-attr]
                values = msgspec.structs.asdict(reading)
                for name, value in values.items():
                    if not (name.endswith("_total") and isinstance(value, int)):
                        continue
                    if isinstance(m, GpuMessage) and name not in COUNTERS_GPU:
                        continue
                    k = (m.host, key, name)
                    assert value >= last.get(k, 0), k
                    last[k] = value


def test_ports_are_eight_active_400g_roce_links_with_rising_traffic(
    messages: list[Message],
) -> None:
    ports = [m for m in messages if isinstance(m, PortMessage) and m.host == "gpu-a"]
    assert all([p.device for p in m.ports] == [f"mlx5_{i}" for i in range(8)] for m in ports)
    first, last = ports[0].ports[0], ports[-1].ports[0]
    assert all(
        p.state == "ACTIVE" and p.phys_state == "LinkUp" and p.rate_gbps == 400
        for p in ports[5].ports
    )
    seconds = ports[-1].ts - ports[0].ts
    moved = (last.xmit_bytes_total or 0) - (first.xmit_bytes_total or 0)
    assert 1e9 < moved / seconds < 5e10  # GB/s of gradient traffic, under the 50 GB/s line rate
    assert (last.xmit_packets_total or 0) > (first.xmit_packets_total or 0)
    cnp = (last.np_cnp_sent_total or 0) - (first.np_cnp_sent_total or 0)
    assert 0 <= cnp / seconds < 5  # a healthy fabric: a trickle of CNPs


def test_job_lifecycle_events(messages: list[Message]) -> None:
    events = [m for m in messages if isinstance(m, EventMessage)]
    starts = [e for e in events if e.type is EventType.JOB_START]
    assert {e.job_id for e in starts} == {"job-1", "job-2"}
    assert all(e.attrs["world_size"] == 16 for e in starts)
    ends = [e for e in events if e.type is EventType.JOB_END]
    assert [(e.job_id, e.code) for e in ends] == [("job-2", 0)]  # job-1 lost a rank to XID 48
    saves = [
        e.attrs["step"]
        for e in events
        if e.type is EventType.CHECKPOINT_SAVE and e.job_id == "job-1"
    ]
    assert saves == [24]
    kinds = {e.type for e in events if e.job_id == "job-1"}
    assert {EventType.XID, EventType.ECC, EventType.LINK_STATE} <= kinds


def test_optional_streams_can_be_left_out() -> None:
    sc = Scenario(nodes=1, steps=10, with_gpu=False, with_ports=False)
    kinds = {type(m) for m in simulate(sc)}
    assert kinds == {StepMessage, EventMessage}


def test_a_host_can_run_several_jobs_in_turn() -> None:
    first = Scenario(
        nodes=1,
        steps=20,
        hosts=("lemon",),
        faults=(Fault(FaultKind.SLOW_GPU, host="lemon", start_step=0),),
    )
    second = first.replace(job_id="job-b", seed=5, start_ts=first.start_ts + 100)
    messages = list(simulate(first, second))
    jobs = {
        r.job_id
        for m in messages
        if isinstance(m, StepMessage)
        for r in m.steps
        if r.host == "lemon"
    }
    assert jobs == {"job-1", "job-b"}
    gpu_seq = [m.seq for m in messages if isinstance(m, GpuMessage)]
    assert gpu_seq == list(range(len(gpu_seq)))  # one agent per host: one sequence

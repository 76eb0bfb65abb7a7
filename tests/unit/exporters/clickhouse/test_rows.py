"""Rows, column checks and counter rates of the historical store (no store needed)."""

from __future__ import annotations

import msgspec
import pytest

from stepwatch.contract import (
    EventMessage,
    EventType,
    GpuMessage,
    GpuReading,
    Phases,
    PortMessage,
    PortReading,
    StepMessage,
    StepRecord,
    encode,
)
from stepwatch.contract.counters import WRAP_32
from stepwatch.exporters.clickhouse import rows as R
from stepwatch.exporters.clickhouse.prepare import Preparer, Record
from stepwatch.exporters.clickhouse.rates import PORT_COUNTERS, CounterTracker

NOW = 1767225600.0


def step_msg(seq: int = 0, ranks: range = range(4), **rec: object) -> StepMessage:
    steps = [
        StepRecord(
            job_id="j",
            rank=r,
            world_size=8,
            step=seq,
            start=NOW + seq,
            end=NOW + seq + 1.0,
            local_rank=r,
            phases=Phases(data=0.1, forward=0.3, backward=0.4, optimizer=0.05, comm_wait=0.15),
            **rec,
        )  # type: ignore[arg-type]
        for r in ranks
    ]
    return StepMessage(host="h1", ts=NOW + seq + 1, inst="i1", seq=seq, job_id="j", steps=steps)


def record(message: object, offset: int = 0, topic: str = "t.steps") -> Record:
    value = message if isinstance(message, bytes) else encode(message)  # type: ignore[arg-type]
    return Record(topic, 0, offset, value, b"j")


def test_step_row_maps_phases_compute_and_gpu_default():
    msg = step_msg(ranks=range(1))
    row = dict(zip(R.STEPS.names, R.step_row(msg, msg.steps[0]), strict=True))
    assert row["compute_s"] == pytest.approx(0.75)
    assert row["duration_s"] == pytest.approx(1.0)
    assert row["gpu"] == 0 and row["host"] == "h1" and row["seq"] == 0 and row["inst"] == "i1"
    assert R.STEPS.check(tuple(row.values())) is None


def test_nan_loss_is_written_as_a_string_clickhouse_reads():
    msg = step_msg(ranks=range(1), loss=float("nan"))
    row = dict(zip(R.STEPS.names, R.step_row(msg, msg.steps[0]), strict=True))
    assert row["loss"] == "nan"
    assert R.f64(float("-inf")) == "-inf" and R.f64(1.5) == 1.5 and R.f64(None) is None


@pytest.mark.parametrize(
    ("column", "value", "expected"),
    [
        ("rank", 2**32, "overflows UInt32"),
        ("gpu", 70000, "overflows UInt16"),
        ("duration_s", 1e39, "overflows Float32"),
        ("duration_s", float("inf"), "not finite"),
        ("start_ts", -5.0, "timestamp"),
        ("seq", -1, "overflows UInt64"),
    ],
)
def test_check_rejects_values_that_do_not_fit_their_column(column, value, expected):
    msg = step_msg(ranks=range(1))
    row = list(R.step_row(msg, msg.steps[0]))
    row[R.STEPS.names.index(column)] = value
    problem = R.STEPS.check(tuple(row))
    assert problem is not None and expected in problem and column in problem


def test_check_rows_finds_the_bad_rows_among_good_ones():
    msg = step_msg(ranks=range(5))
    rows = [R.step_row(msg, s) for s in msg.steps]
    bad = list(rows[3])
    bad[R.STEPS.names.index("phases_extra")] = {"zero_grad": 5e38}
    rows[3] = tuple(bad)
    found = R.STEPS.check_rows(rows)
    assert list(found) == [3] and "phases_extra" in found[3]


def test_rows_of_one_record_refused_alike_make_one_dead_letter_naming_each():
    """Their dead letters shared the store's key (place, reason, CRC): the second
    replaced the first, and what was wrong with it was lost."""
    from stepwatch.exporters.clickhouse.prepare import Prepared

    msg = step_msg(ranks=range(4))
    source = record(msg, 7)
    out = Prepared()
    extra = R.STEPS.names.index("phases_extra")
    for i, step in enumerate(msg.steps):
        row = list(R.step_row(msg, step))
        if i in (1, 3):
            row[extra] = {"zero_grad": 5e38}
        out.add(R.STEPS, tuple(row), source, f"steps[{i}]")
    Preparer()._check(out, NOW)
    assert [r[R.STEPS.names.index("rank")] for r in out.tables["step_events"].rows] == [0, 2]
    ((offset, reason, detail),) = [(d[3], d[5], d[6]) for d in out.dead]
    assert (offset, reason) == (7, "overflow")
    assert detail.startswith("2 rows: steps[1]: ") and "; steps[3]: " in detail


def test_gpu_and_port_tables_cover_every_contract_field():
    gpu_fields = set(GpuReading.__struct_fields__) - {"index"}
    port_fields = set(PortReading.__struct_fields__) - {"device", "port"}
    assert gpu_fields <= set(R.GPUS.names)
    assert port_fields <= set(R.PORTS.names)
    assert len(PORT_COUNTERS) >= 20 and all(c + "" in R.PORTS.names for c in PORT_COUNTERS)


# --------------------------------------------------------------------------- rates
def test_tracker_rates_resets_wraps_gaps_and_out_of_order():
    t = CounterTracker(1)
    assert not t.update(("h",), 100.0, [1000]).known  # first reading: unknown
    change = t.update(("h",), 102.0, [1400])
    assert change.deltas == (400,) and change.rates() == (200.0,)
    assert t.update(("h",), 103.0, [50]).deltas == (50,)  # reset: the counter restarted from 0
    t.update(("h",), 104.0, [WRAP_32 - 10])
    assert t.update(("h",), 105.0, [5]).deltas == (15,)  # 32-bit wrap
    assert not t.update(("h",), 104.5, [9]).known  # out of order: no change
    assert not t.update(("h",), 105.0 + 301, [100]).known  # more than 5 minutes apart


def test_a_counter_a_sample_lacks_keeps_its_value_for_the_next_increase():
    """One reading without a counter (a failed NVML call) made the next increase unknown:
    a new double-bit ECC error in it was never counted."""
    t = CounterTracker(2)
    t.update(("g",), 100.0, [5, 1000])
    gap = t.update(("g",), 110.0, [None, 2000])
    assert gap.deltas == (None, 1000) and gap.rates() == (None, 100.0)
    after = t.update(("g",), 120.0, [6, 3000])
    assert after.deltas == (1, 1000)
    # the whole increase in the last tick: the rollups total rate x interval, so it counts
    assert after.rates() == (pytest.approx(1 / 10), pytest.approx(100.0))
    assert t.update(("g",), 130.0, [6, 4000]).rates() == (0.0, 100.0)
    # a value carried longer than the gap limit is no baseline
    t.update(("g",), 140.0, [None, 5000])
    for k in range(1, 31):
        t.update(("g",), 140.0 + 10 * k, [None, 5000 + k])
    assert t.update(("g",), 450.0, [9, 6000]).deltas[0] is None


def test_tracker_seed_is_used_only_for_unseen_keys():
    from stepwatch.exporters.clickhouse.rates import Reading

    t = CounterTracker(1)
    assert t.needs_seed(("a",))
    t.seed(("a",), Reading(10.0, (100,)))
    assert not t.needs_seed(("a",))
    assert t.update(("a",), 11.0, [150]).deltas == (50,)
    t.seed(("b",), None)
    assert not t.needs_seed(("b",)) and ("b",) not in t


# --------------------------------------------------------------------------- preparer
def port_msg(seq: int, xmit: int, downed: int = 0) -> PortMessage:
    return PortMessage(
        host="h1",
        ts=NOW + seq,
        inst="i1",
        seq=seq,
        ports=[
            PortReading(
                device="mlx5_0",
                port=1,
                state="ACTIVE",
                xmit_bytes_total=xmit,
                link_downed_total=downed,
            )
        ],
    )


def test_preparer_computes_port_rates_between_batches():
    prep = Preparer()
    first = prep.prepare([record(port_msg(0, 1000), 0, "t.ports")])
    second = prep.prepare([record(port_msg(1, 5000, downed=1), 1, "t.ports")])
    names = R.PORTS.names
    row0 = dict(zip(names, first.tables["port_samples"].rows[0], strict=True))
    row1 = dict(zip(names, second.tables["port_samples"].rows[0], strict=True))
    assert row0["ver"] == 0 and row0["xmit_bytes_per_s"] is None
    assert row1["ver"] == 1 and row1["dt_s"] == pytest.approx(1.0)
    assert row1["xmit_bytes_per_s"] == pytest.approx(4000.0)
    assert row1["link_downed_per_s"] == pytest.approx(1.0)


def test_a_gpu_sample_without_its_ecc_counter_loses_no_error():
    prep = Preparer()
    col = R.GPUS.names.index("ecc_dbe_new")
    new = []
    for seq, dbe in enumerate([5, None, 6, 6]):
        m = GpuMessage(host="n1", ts=NOW + 10 * seq, inst="a", seq=seq,
                       gpus=[GpuReading(index=0, ecc_dbe_total=dbe, power_w=300.0)])  # fmt: skip
        new.append(prep.prepare([record(m, seq, "t.gpu")]).tables["gpu_samples"].rows[0][col])
    assert new == [None, None, 1, 0]


def test_preparer_dead_letters_bad_records_with_their_reason():
    good = step_msg(0)
    future = encode(step_msg(1)).replace(b'"v":1', b'"v":2')
    overflow = step_msg(2, ranks=range(1), samples=2**64)
    wrong_type = encode(step_msg(3)).replace(b'"world_size":8', b'"world_size":"eight"')
    absurd = step_msg(4, ranks=range(1))
    absurd = msgspec.structs.replace(absurd, ts=NOW * 10)  # far in the future
    records = [
        record(good, 0),
        record(future, 1),
        record(b"{not json", 2),
        record(overflow, 3),
        record(wrong_type, 4),
        record(absurd, 5),
        Record("t.steps", 0, 6, None),
    ]
    out = Preparer(now=lambda: NOW + 100).prepare(records)
    assert len(out.tables["step_events"].rows) == 4
    reasons = {row[3]: row[5] for row in out.dead}  # offset -> reason
    assert reasons == {
        1: "unsupported_version",
        2: "malformed_json",
        3: "overflow",
        4: "schema",
        5: "absurd_value",
        6: "malformed_json",
    }
    by_offset = {row[3]: row for row in out.dead}
    assert by_offset[1][8:12] == ("step", "h1", "i1", 1)  # header read leniently
    assert "samples" in by_offset[3][6] and by_offset[3][7].startswith("{")


def test_preparer_drops_a_message_seen_before():
    prep = Preparer()
    first = prep.prepare([record(step_msg(0), 0)])
    again = prep.prepare([record(step_msg(0), 1), record(step_msg(1), 2)])
    assert len(first.tables["step_events"].rows) == 4
    assert again.duplicates == 1 and len(again.tables["step_events"].rows) == 4


def test_event_and_gpu_rows_fit_their_tables():
    ev = EventMessage(
        host="h1",
        ts=NOW,
        inst="i",
        seq=0,
        type=EventType.XID,
        gpu=3,
        code=79,
        attrs={"pci": "0000:9A:00.0", "fatal": True},
    )
    gm = GpuMessage(host="h1", ts=NOW, inst="i", seq=0, gpus=[GpuReading(index=0, ecc_sbe_total=3)])
    out = Preparer().prepare([record(ev, 0, "t.events"), record(gm, 0, "t.gpu")])
    assert not out.dead
    event = dict(zip(R.EVENTS.names, out.tables["events"].rows[0], strict=True))
    assert event["attrs"] == {"pci": "0000:9A:00.0", "fatal": "true"} and event["type"] == "xid"
    assert len(out.tables["gpu_samples"].rows[0]) == len(R.GPUS.columns)


def test_detection_rows_keep_where_a_network_or_host_incident_is() -> None:
    from stepwatch.contract import DetectionMessage

    msg = DetectionMessage(
        host="gpu-02",
        ts=1_767_225_600.0,
        id="j-job_slowdown-1",
        job_id="j",
        type="job_slowdown",
        state="open",
        cause="network",
        fault="system",
        summary="congested NIC",
        device="mlx5_3",
        port=1,
        ranks=[8, 9],
        related="j-straggler-0",
    )
    row = dict(zip(R.DETECTIONS.names, R.detection_row(msg), strict=True))
    assert (row["device"], row["port"], row["ranks"], row["related"]) == (
        "mlx5_3",
        1,
        [8, 9],
        "j-straggler-0",
    )
    assert row["host"] == "gpu-02"


# --------------------------------------------------------------------------- what the sink refuses
def xmit_msg(ts: float, xmit: int, inst: str = "agentA", seq: int = 0) -> PortMessage:
    reading = PortReading(device="mlx5_0", port=1, state="ACTIVE", xmit_bytes_total=xmit)
    return PortMessage(host="r0", ts=ts, inst=inst, seq=seq, ports=[reading])


def port_rows(out: object) -> list[dict[str, object]]:
    bucket = out.tables.get("port_samples")  # type: ignore[attr-defined]
    return [dict(zip(R.PORTS.names, row, strict=True)) for row in (bucket.rows if bucket else [])]


def test_another_senders_reading_of_a_host_is_not_its_counters_baseline():
    """One sample of host r0 from another agent instance (a forged or reused host name, a
    second agent) with its counters at 0: before, the reset rule counted agentA's whole
    counter (5e14 bytes) as new traffic at its next sample, and 100 ECC errors as new."""
    prep = Preparer(now=lambda: NOW + 100)
    rows = []
    for k in range(4):
        if k == 2:
            prep.prepare([record(xmit_msg(NOW + k - 0.5, 0, inst="evil"), 100, "t.ports")])
        out = prep.prepare([record(xmit_msg(NOW + k, 5 * 10**14 + k * 10**9, seq=k), k, "t.ports")])
        rows += port_rows(out)
    assert [r["xmit_bytes_per_s"] for r in rows[1:]] == [pytest.approx(1e9)] * 3

    def gpu(ts: float, sbe: int, inst: str, seq: int) -> GpuMessage:
        return GpuMessage(
            host="r0", ts=ts, inst=inst, seq=seq, gpus=[GpuReading(index=0, ecc_sbe_total=sbe)]
        )

    prep.prepare([record(gpu(NOW, 100, "agentA", 0), 0, "t.gpu")])
    prep.prepare([record(gpu(NOW + 0.5, 0, "evil", 0), 1, "t.gpu")])
    out = prep.prepare([record(gpu(NOW + 1, 100, "agentA", 1), 2, "t.gpu")])
    row = dict(zip(R.GPUS.names, out.tables["gpu_samples"].rows[0], strict=True))
    assert row["ecc_sbe_new"] == 0


def test_a_sample_stamped_far_ahead_is_a_dead_letter_and_leaves_the_rates_alone():
    """A port sample 250 s ahead (inside the contract's 300 s) became the counter's last
    reading: every real sample after it, stamped earlier, had no rate until real time caught
    up (74% of the traffic missing from the rollups in a red-team run)."""
    clock = [NOW]
    prep = Preparer(now=lambda: clock[0])
    rates = []
    for k in range(5):
        clock[0] = NOW + k
        batch = [record(xmit_msg(NOW + k, k * 10**9, seq=k), k, "t.ports")]
        if k == 1:
            batch.append(record(xmit_msg(NOW + 250, 10**15, seq=99), 99, "t.ports"))
        out = prep.prepare(batch)
        rates += [r["xmit_bytes_per_s"] for r in port_rows(out)]
        if k == 1:
            assert [(d[3], d[5]) for d in out.dead] == [(99, "future_timestamp")]
            assert "249 s ahead" in out.dead[0][6]
    assert rates[1:] == [pytest.approx(1e9)] * 4


def test_a_step_record_ending_far_ahead_is_left_out_alone():
    msg = step_msg(0, ranks=range(3))
    ahead = msgspec.structs.replace(msg.steps[1], end=NOW + 200.0)
    msg = msgspec.structs.replace(msg, steps=[msg.steps[0], ahead, msg.steps[2]])
    out = Preparer(now=lambda: NOW + 1).prepare([record(msg, 7)])
    assert [r[R.STEPS.names.index("rank")] for r in out.tables["step_events"].rows] == [0, 2]
    assert [(d[3], d[5]) for d in out.dead] == [(7, "future_timestamp")]
    assert "steps[1]" in out.dead[0][6]
    off = Preparer(now=lambda: NOW + 1, future_seconds=0).prepare([record(msg, 7)])
    assert len(off.tables["step_events"].rows) == 3 and not off.dead


def test_a_message_of_another_kind_than_its_topic_is_a_dead_letter():
    """The worker refuses it (wrong_topic); the sink stored it: the store held GPU rows the
    detectors never saw."""
    from stepwatch.contract.topics import message_kinds

    gm = GpuMessage(host="h1", ts=NOW, inst="i", seq=0, gpus=[GpuReading(index=0)])
    kinds = message_kinds(["t.steps", "t.gpu", "t.ports", "t.events", "t.detections", "t.x"])
    assert set(kinds) == {"t.steps", "t.gpu", "t.ports", "t.events", "t.detections"}
    prep = Preparer(kinds=kinds)
    out = prep.prepare([record(gm, 3, "t.steps"), record(step_msg(0), 4, "t.steps")])
    assert "gpu_samples" not in out.tables and len(out.tables["step_events"].rows) == 4
    assert [(d[3], d[5], d[6]) for d in out.dead] == [
        (3, "wrong_topic", "a gpu message on the step topic")
    ]
    assert not prep.prepare([record(gm, 5, "t.gpu")]).dead


def test_a_dead_letters_payload_is_kept_byte_for_byte():
    """Decoded as UTF-8 with replacement, 00 FF was stored as 00 EF BF BD: lost."""
    import base64

    from stepwatch.exporters.clickhouse.prepare import MAX_PAYLOAD, dead_row

    names = R.DEAD_LETTERS.names

    def row(value: bytes) -> dict[str, object]:
        out = dict(zip(names, dead_row(Record("t.steps", 0, 0, value), "x", "", NOW), strict=True))
        assert R.DEAD_LETTERS.check(tuple(out.values())) is None
        return out

    binary = row(b"\x00\xff{garbage")
    assert binary["payload_encoding"] == "base64" and not binary["payload_truncated"]
    assert base64.b64decode(str(binary["payload"])) == b"\x00\xff{garbage"
    text = row('{"host":"nœud-1"}'.encode())
    assert (text["payload"], text["payload_encoding"]) == ('{"host":"nœud-1"}', "utf-8")
    big = "é".encode() * MAX_PAYLOAD  # the 1 MiB cut splits a character
    cut = row(big)
    assert cut["payload_truncated"] and cut["payload_encoding"] == "utf-8"
    assert cut["payload"] == "é" * (MAX_PAYLOAD // 2)


def port_reading_msg(seq: int, **counters: int) -> PortMessage:
    return PortMessage(
        host="h1",
        ts=NOW + seq,
        inst="i1",
        seq=seq,
        ports=[PortReading(device="mlx5_0", port=1, rate_gbps=400.0, **counters)],  # type: ignore[arg-type]
    )


def rows_of(prep: Preparer, *msgs: PortMessage) -> list[dict[str, object]]:
    out = []
    for m in msgs:
        rows = prep.prepare([record(m, m.seq, "t.ports")]).tables["port_samples"].rows
        out.append(dict(zip(R.PORTS.names, rows[0], strict=True)))
    return out


def test_a_cleared_infiniband_counter_is_a_reset_not_a_32_bit_wrap() -> None:
    """perfquery -R on a port whose port_xmit_wait was at 3.5e9 (top quarter of 32 bits):
    read as a wrap it stored 7.9e8 ticks of congestion; the IB PMA counters saturate, they
    never wrap. mlx5 hw_counters (32-bit queue counters) still wrap."""
    top = 3_500_000_000
    rows = rows_of(
        Preparer(),
        port_reading_msg(0, xmit_wait_total=top, out_of_buffer_total=WRAP_32 - 10),
        port_reading_msg(1, xmit_wait_total=top + 1000, out_of_buffer_total=WRAP_32 - 5),
        port_reading_msg(2, xmit_wait_total=400, out_of_buffer_total=5),
    )
    assert rows[1]["xmit_wait_per_s"] == pytest.approx(1000.0)
    assert rows[2]["xmit_wait_per_s"] == pytest.approx(400.0)
    assert rows[2]["out_of_buffer_per_s"] == pytest.approx(10.0)  # a 32-bit wrap


def test_a_byte_counter_growing_faster_than_its_link_invents_no_traffic() -> None:
    """A 64-bit port_xmit_data 10 words back (or a device renamed under the agent) was a
    'reset': its whole value, 4.7e15 bytes, stored as one second's traffic on a 400 Gb/s
    port and summed into the rollup. Such an increase is unknown, and the next one counts
    from the new value."""
    big = 4_720_000_000_000_000
    rows = rows_of(
        Preparer(),
        port_reading_msg(0, xmit_bytes_total=big, xmit_wait_total=5),
        port_reading_msg(1, xmit_bytes_total=big - 40, xmit_wait_total=7),
        port_reading_msg(2, xmit_bytes_total=big + 4_000_000_000, xmit_wait_total=9),
        port_reading_msg(3, xmit_bytes_total=big + 10**15, xmit_wait_total=11),
    )
    assert rows[1]["xmit_bytes_per_s"] is None and rows[1]["xmit_wait_per_s"] is None
    assert rows[1]["dt_s"] == pytest.approx(1.0)
    assert rows[2]["xmit_bytes_per_s"] == pytest.approx(4_000_000_040.0)
    assert rows[2]["xmit_wait_per_s"] == pytest.approx(2.0)
    assert rows[3]["xmit_bytes_per_s"] is None  # 8 PB/s on 400 Gb/s: not traffic


def test_a_byte_counter_carried_over_failed_reads_is_bounded_over_its_own_span() -> None:
    """A counter unreadable for 3 ticks at full line rate grows 4 s worth in the next
    1 s interval: that increase is real (its span is 4 s), not beyond the link."""
    line = 50_000_000_000  # 400 Gb/s in bytes
    rows = rows_of(
        Preparer(),
        port_reading_msg(0, xmit_bytes_total=0, xmit_wait_total=0),
        port_reading_msg(1, xmit_wait_total=1),
        port_reading_msg(2, xmit_wait_total=2),
        port_reading_msg(3, xmit_wait_total=3),
        port_reading_msg(4, xmit_bytes_total=4 * line, xmit_wait_total=4),
    )
    assert rows[4]["xmit_bytes_per_s"] == pytest.approx(4 * line)


def test_a_saturated_infiniband_counter_has_an_unknown_rate_not_zero() -> None:
    """The IB PMA's legacy counters stop at 2^32-1 (the data counters' bytes at 4 x that):
    stuck there, a congested port's port_xmit_wait read as a rate of 0, an idle port. Its
    rate is unknown until it is cleared; the 32-bit mlx5 hw_counters wrap instead."""
    stuck, words = WRAP_32 - 1, 4 * (WRAP_32 - 1)
    rows = rows_of(
        Preparer(),
        port_reading_msg(0, xmit_wait_total=stuck - 500, rcv_bytes_total=words - 8),
        port_reading_msg(1, xmit_wait_total=stuck, rcv_bytes_total=words),
        port_reading_msg(2, xmit_wait_total=stuck, rcv_bytes_total=words),
        port_reading_msg(3, xmit_wait_total=30, rcv_bytes_total=40, np_cnp_sent_total=stuck),
    )
    for r in rows[1:3]:
        assert r["xmit_wait_per_s"] is None and r["rcv_bytes_per_s"] is None
    assert rows[3]["xmit_wait_per_s"] == pytest.approx(30.0)  # cleared: counts again
    assert rows[3]["rcv_bytes_per_s"] == pytest.approx(40.0)

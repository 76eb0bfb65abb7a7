"""Event contract v1: good and bad messages, version skew, keys and topics."""

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
    Topics,
    decode,
    encode,
    message_key,
    read_jsonl,
)
from stepwatch.errors import ContractError, StepwatchError

NOW = 1_750_000_000.0


def _step(**kw: object) -> StepRecord:
    base = dict(
        job_id="j1",
        rank=3,
        world_size=8,
        step=10,
        start=NOW - 2,
        end=NOW - 1,
        phases=Phases(forward=0.3, backward=0.5, comm_wait=0.1),
    )
    base.update(kw)
    return StepRecord(**base)  # type: ignore[arg-type]


def _decode(data: bytes) -> object:
    return decode(data, now=lambda: NOW)


def test_round_trip_every_kind() -> None:
    messages = [
        StepMessage(host="n1", ts=NOW, job_id="j1", steps=[_step()]),
        GpuMessage(
            host="n1", ts=NOW, gpus=[GpuReading(index=0, power_w=650.5, throttle_reasons=0x40)]
        ),
        PortMessage(
            host="n1", ts=NOW, ports=[PortReading(device="mlx5_0", port=1, xmit_bytes_total=4 * 10)]
        ),
        EventMessage(host="n1", ts=NOW, type=EventType.XID, gpu=2, code=79),
    ]
    for message in messages:
        assert _decode(encode(message)) == message


def test_every_message_states_kind_and_version() -> None:
    raw = msgspec.json.decode(encode(StepMessage(host="n1", ts=NOW, job_id="j1")))
    assert raw["kind"] == "step"
    assert raw["v"] == 1


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (b"{not json", "malformed_json"),
        (b"", "malformed_json"),
        (b"[1,2]", "schema"),
        (b'{"v":1,"host":"a","ts":1}', "schema"),
        (b'{"kind":"metrics","v":1}', "unknown_kind"),
        (b'{"kind":"step","v":2,"host":"a","ts":1.7e9}', "unsupported_version"),
        (b'{"kind":"step","v":1,"ts":1.7e9}', "schema"),
        (b'{"kind":"step","v":1,"host":"a","ts":"yesterday"}', "schema"),
        # seconds since boot (time.monotonic), not the epoch: what would be filed under 1970
        (b'{"kind":"step","v":1,"host":"a","ts":86400.5}', "absurd_value"),
        (b'{"kind":"event","v":1,"host":"a","ts":0.001,"type":"restart"}', "absurd_value"),
        (b'{"kind":"gpu","v":1,"host":"a","ts":1.7e9,"gpus":[{"index":"zero"}]}', "schema"),
    ],
)
def test_bad_messages_are_rejected_with_reason(payload: bytes, reason: str) -> None:
    with pytest.raises(ContractError) as info:
        _decode(payload)
    assert info.value.reason == reason
    assert isinstance(info.value, StepwatchError)


def test_schema_error_names_the_field() -> None:
    bad = b'{"kind":"step","v":1,"host":"a","ts":1.7e9,"steps":[{"job_id":"j","rank":"x"}]}'
    with pytest.raises(ContractError, match=r"\$\.steps\[0\]\.rank"):
        _decode(bad)


@pytest.mark.parametrize(
    "record",
    [
        _step(end=NOW - 3),  # negative duration
        _step(rank=8),  # rank >= world_size
        _step(step=-1),
        _step(start=NOW + 3600, end=NOW + 3601),  # far future
        _step(phases=Phases(forward=-0.1)),
        _step(samples=-5),
    ],
)
def test_absurd_values_rejected(record: StepRecord) -> None:
    data = encode(StepMessage(host="n1", ts=NOW, job_id="j1", steps=[record]))
    with pytest.raises(ContractError) as info:
        _decode(data)
    assert info.value.reason == "absurd_value"


def test_nan_literal_is_not_json() -> None:
    bad = encode(StepMessage(host="n1", ts=NOW, job_id="j1", steps=[_step(loss=1.0)]))
    with pytest.raises(ContractError) as info:
        _decode(bad.replace(b'"loss":1.0', b'"loss":NaN'))
    assert info.value.reason == "malformed_json"


def test_nonfinite_loss_travels_as_flag() -> None:
    record = _step(loss=None, loss_nonfinite=True)
    message = _decode(encode(StepMessage(host="n1", ts=NOW, job_id="j1", steps=[record])))
    assert isinstance(message, StepMessage)
    assert message.steps[0].loss_nonfinite is True


def test_negative_counter_rejected() -> None:
    data = encode(GpuMessage(host="n1", ts=NOW, gpus=[GpuReading(index=0, ecc_dbe_total=-1)]))
    with pytest.raises(ContractError, match="ecc_dbe_total"):
        _decode(data)


def test_unknown_fields_are_ignored_within_v1() -> None:
    data = b'{"kind":"event","v":1,"host":"a","ts":1.7e9,"type":"restart","new_field":42}'
    message = _decode(data)
    assert isinstance(message, EventMessage)
    assert message.type is EventType.RESTART


def test_keys_job_else_host() -> None:
    assert message_key(StepMessage(host="n1", ts=NOW, job_id="j9")) == b"j9"
    assert message_key(GpuMessage(host="n1", ts=NOW, job_id=None)) == b"n1"
    assert message_key(GpuMessage(host="n1", ts=NOW, job_id="j9")) == b"j9"


def test_topics_per_kind() -> None:
    topics = Topics("sw")
    assert topics.for_kind("step") == "sw.steps"
    assert topics.for_kind("port") == "sw.ports"
    assert set(topics.telemetry()) == {"sw.steps", "sw.gpu", "sw.ports", "sw.events"}
    assert topics.dlq in topics.all()


def test_jsonl_reader_reports_bad_lines_in_place() -> None:
    good = encode(StepMessage(host="n1", ts=NOW, job_id="j1"))
    items = list(read_jsonl([good, b"garbage", b"", good]))
    assert len(items) == 3
    assert isinstance(items[1], ContractError)
    assert isinstance(items[0], StepMessage) and isinstance(items[2], StepMessage)


def test_json_schema_carries_kinds_and_value_constraints() -> None:
    from stepwatch.contract.schema import json_schema

    schema = json_schema()
    defs = schema["$defs"]
    assert {"StepMessage", "GpuMessage", "PortMessage", "EventMessage", "DetectionMessage"} <= set(
        defs
    )
    assert defs["StepMessage"]["properties"]["kind"]["enum"] == ["step"]
    rank = defs["StepRecord"]["properties"]["rank"]
    assert rank == {"type": "integer", "minimum": 0, "maximum": 2**32 - 1}


def test_constraint_violation_names_field_and_reason() -> None:
    data = encode(GpuMessage(host="n1", ts=NOW, gpus=[GpuReading(index=0, power_w=-3.0)]))
    with pytest.raises(ContractError) as info:
        _decode(data)
    assert info.value.reason == "absurd_value"
    assert "$.gpus[0].power_w" in str(info.value)


def test_decoded_records_are_out_of_the_cycle_collectors_sight() -> None:
    """Contract records hold data only (no cycles): untracked, a 16,384-rank job's records
    cost the worker no garbage-collection passes (a third of its CPU when they were)."""
    import gc

    from stepwatch.contract import StepMessage, StepRecord, decode, encode

    msg = StepMessage(
        host="h",
        ts=NOW,
        job_id="j",
        steps=[StepRecord(job_id="j", rank=0, world_size=1, step=0, start=NOW - 1, end=NOW)],
    )
    back = decode(encode(msg))
    assert isinstance(back, StepMessage)
    assert not gc.is_tracked(back) and not gc.is_tracked(back.steps[0])

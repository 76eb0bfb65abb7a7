"""The decode fast paths the stream worker relies on reject exactly what the slow path rejects."""

from __future__ import annotations

import math

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stepwatch.contract import (
    GpuMessage,
    GpuReading,
    Phases,
    PortMessage,
    PortReading,
    StepMessage,
    StepRecord,
    check_step,
    check_values,
)
from stepwatch.contract.codec import _check_numbers, _check_time
from stepwatch.errors import ContractError

NOW = 1_800_000_000.0
odd_floats = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True, width=64),
    st.sampled_from([0.0, -0.0, 1.0, -1e-9, math.nan, math.inf, -math.inf, 1e308]),
)
maybe = st.one_of(st.none(), odd_floats)


def slow_ok(message: object) -> bool:
    """The record-by-record reference: does it raise?"""
    try:
        _check_time("ts", message.ts, NOW)  # type: ignore[attr-defined]
        if isinstance(message, StepMessage):
            for r in message.steps:
                check_step(r, NOW)
        else:
            for item in getattr(message, "gpus", None) or getattr(message, "ports", []):
                _check_numbers("x", msgspec.structs.asdict(item))
    except ContractError:
        return False
    return True


def fast_ok(message: object) -> bool:
    try:
        check_values(message, NOW)  # type: ignore[arg-type]
    except ContractError:
        return False
    return True


def mostly(valid: object, odd: st.SearchStrategy) -> st.SearchStrategy:
    """Usually the valid value, sometimes an odd one: most records reach every check."""
    return st.one_of(st.just(valid), st.just(valid), st.just(valid), odd)


@st.composite
def step_records(draw: st.DrawFn) -> StepRecord:
    start = draw(mostly(NOW - 10, st.one_of(odd_floats, st.just(NOW + 1000))))
    end = draw(mostly(NOW - 9, st.one_of(odd_floats, st.just(start + 1e9))))
    phase = mostly(0.5, maybe)
    phases = draw(
        st.one_of(
            st.none(),
            st.builds(
                Phases,
                data=phase,
                forward=phase,
                backward=phase,
                comm_wait=phase,
                extra=st.dictionaries(
                    st.sampled_from(["a", "b"]), mostly(0.1, odd_floats), max_size=2
                ),
            ),
        )
    )
    return StepRecord(
        job_id="j",
        rank=draw(mostly(1, st.integers(-1, 4))),
        world_size=draw(mostly(4, st.integers(-1, 4))),
        step=draw(mostly(3, st.integers(-1, 3))),
        start=start,
        end=end,
        phases=phases,
        samples=draw(mostly(2, st.integers(-1, 2))),
        tokens=draw(mostly(2, st.integers(-1, 2))),
        loss=draw(st.one_of(st.none(), odd_floats)),
    )


@settings(max_examples=200, deadline=None)
@given(st.lists(step_records(), min_size=0, max_size=4))
def test_step_fast_path_agrees_with_check_step(records: list[StepRecord]) -> None:
    message = StepMessage(host="h", ts=NOW, steps=records)
    assert fast_ok(message) == slow_ok(message)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.builds(
            GpuReading,
            index=st.integers(-1, 8),
            power_w=maybe,
            temp_gpu_c=maybe,
            ecc_dbe_total=st.one_of(st.none(), st.integers(-2, 2**63)),
            remapped_rows_pending=st.one_of(st.none(), st.booleans()),
        ),
        max_size=4,
    )
)
def test_gpu_fast_path_agrees(gpus: list[GpuReading]) -> None:
    message = GpuMessage(host="h", ts=NOW, gpus=gpus)
    assert fast_ok(message) == slow_ok(message)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.builds(
            PortReading,
            device=st.just("mlx5_0"),
            port=st.integers(-1, 2),
            rate_gbps=maybe,
            xmit_wait_total=st.one_of(st.none(), st.integers(-1, 2**64)),
        ),
        max_size=4,
    )
)
def test_port_fast_path_agrees(ports: list[PortReading]) -> None:
    message = PortMessage(host="h", ts=NOW, ports=ports)
    assert fast_ok(message) == slow_ok(message)


@pytest.mark.parametrize("value", [math.nan, math.inf, -1.0])
def test_bad_gpu_value_still_names_the_field(value: float) -> None:
    message = GpuMessage(
        host="h", ts=NOW, gpus=[GpuReading(index=0), GpuReading(index=3, power_w=value)]
    )
    with pytest.raises(ContractError) as err:
        check_values(message, NOW)
    assert err.value.reason == "absurd_value"
    assert "gpus[3]" in err.value.detail and "power_w" in err.value.detail


ODD = [0.0, -0.0, -1.0, -1e-9, math.nan, math.inf, -math.inf, 1e308, NOW + 1000, 2**63]
PHASES = Phases(data=0.1, forward=0.2, extra={"x": 0.1})
VALID = StepRecord(
    job_id="j",
    rank=1,
    world_size=4,
    step=3,
    start=NOW - 10,
    end=NOW - 9,
    phases=PHASES,
    samples=2,
    tokens=2,
    loss=1.0,
)
STEP_FIELDS = ["rank", "world_size", "step", "start", "end", "samples", "tokens", "loss"]


@pytest.mark.parametrize("field", [*STEP_FIELDS, "phases.data", "phases.extra"])
def test_every_step_field_perturbed_alone(field: str) -> None:
    for value in ODD:
        if field == "phases.data":
            record = msgspec.structs.replace(
                VALID, phases=msgspec.structs.replace(PHASES, data=value)
            )
        elif field == "phases.extra":
            record = msgspec.structs.replace(
                VALID, phases=msgspec.structs.replace(PHASES, extra={"x": value})
            )
        else:
            if field in {"rank", "world_size", "step", "samples", "tokens"}:
                if not math.isfinite(value) or value != int(value):
                    continue
                value = int(value)
            record = msgspec.structs.replace(VALID, **{field: value})
        message = StepMessage(host="h", ts=NOW, steps=[VALID, record])
        assert fast_ok(message) == slow_ok(message), (field, value)


@pytest.mark.parametrize("field", ["power_w", "temp_gpu_c", "ecc_dbe_total", "index"])
def test_every_gpu_field_perturbed_alone(field: str) -> None:
    for value in ODD:
        if field in {"ecc_dbe_total", "index"}:
            if not math.isfinite(value):
                continue
            value = int(value)
        reading = msgspec.structs.replace(GpuReading(index=0), **{field: value})
        message = GpuMessage(host="h", ts=NOW, gpus=[GpuReading(index=1, power_w=300.0), reading])
        assert fast_ok(message) == slow_ok(message), (field, value)


@pytest.mark.parametrize(
    "text",
    [
        b'{"kind":"gpu","host":"h","ts":1700000000,"gpus":[{"index":0,"power_w":-5}]}',
        b'{"kind":"gpu","host":"h","ts":1700000000,"gpus":[{"index":0, "power_w": -0.5}]}',
        b'{"kind":"port","host":"h","ts":1700000000,"ports":[{"device":"m","port":1,'
        b'"xmit_wait_total":\n  -7}]}',
    ],
)
def test_negative_sample_values_are_caught_by_decode(text: bytes) -> None:
    from stepwatch.contract import decode

    with pytest.raises(ContractError) as err:
        decode(text, now=lambda: NOW)
    assert err.value.reason == "absurd_value"
    with pytest.raises(ContractError):
        decode(text.decode(), now=lambda: NOW)


def test_samples_without_negative_numbers_only_need_the_timestamp_check() -> None:
    from stepwatch.contract import decode, encode

    message = GpuMessage(host="h", ts=NOW, gpus=[GpuReading(index=0, uuid="GPU-a:-b", power_w=0.0)])
    assert decode(encode(message), now=lambda: NOW) == message  # "a:-b": full check, passes
    future = msgspec.structs.replace(message, ts=NOW + 10_000)
    with pytest.raises(ContractError, match="future"):
        decode(encode(future), now=lambda: NOW)

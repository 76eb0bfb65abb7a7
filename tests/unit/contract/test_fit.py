"""A producer's readings fitted to the contract value by value (contract/fit.py)."""

from __future__ import annotations

from stepwatch.contract import GpuMessage, GpuReading, PortMessage, PortReading, decode, encode
from stepwatch.contract.fit import fit_message, fit_reading

T0 = 1_767_225_600.0


def test_a_reading_that_fits_is_passed_as_it_is() -> None:
    reading = GpuReading(index=3, power_w=300.0, ecc_sbe_total=7)
    assert fit_reading(reading) == (reading, [])
    message = GpuMessage(host="h", ts=T0, gpus=[reading])
    assert fit_message(message) == (message, [])


def test_each_refused_value_is_left_out_and_named() -> None:
    reading = GpuReading(
        index=0, power_w=float("nan"), ecc_sbe_total=2**41, temp_gpu_c=-3.0, sm_clock_mhz=1980.0
    )
    fitted, left_out = fit_reading(reading)
    assert sorted(left_out) == ["ecc_sbe_total", "power_w", "temp_gpu_c"]
    assert fitted is not None and fitted.sm_clock_mhz == 1980.0
    assert (fitted.power_w, fitted.ecc_sbe_total, fitted.temp_gpu_c) == (None, None, None)


def test_a_reading_whose_key_is_refused_is_dropped_and_the_others_go_on() -> None:
    message = PortMessage(
        host="h",
        ts=T0,
        ports=[
            PortReading(device="mlx5_0", port=70_000, xmit_bytes_total=1),
            PortReading(device="mlx5_1", port=1, xmit_bytes_total=2**64),
        ],
    )
    fitted, left_out = fit_message(message)
    assert left_out == ["port", "xmit_bytes_total"]
    back = decode(encode(fitted), now=lambda: T0)
    assert isinstance(back, PortMessage)
    assert [(p.device, p.xmit_bytes_total) for p in back.ports] == [("mlx5_1", None)]


def test_a_text_field_is_made_a_plain_name_not_left_null() -> None:
    """A too-long or control-character name fell back to None, which a str field cannot
    hold, or passed unchecked (the name rule is not decoding's): the whole message was
    still refused."""
    message = GpuMessage(
        host="h",
        ts=T0,
        gpus=[GpuReading(index=0, name="N" * 300, uuid="GPU-\x01ab", power_w=100.0)],
    )
    fitted, changed = fit_message(message)
    assert sorted(changed) == ["name", "uuid"]
    back = decode(encode(fitted), now=lambda: T0)
    assert isinstance(back, GpuMessage)
    (gpu,) = back.gpus
    assert gpu.uuid == "GPU-\ufffdab" and len(gpu.name) == 256 and gpu.power_w == 100.0

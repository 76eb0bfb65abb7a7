"""A producer's own readings made to fit the contract, value by value.

A device can answer with a number the contract refuses (an ECC count beyond
its ceiling, a driver's sentinel): the consumers then refuse the whole
message, every GPU or port of the host with it. A producer (the node agent)
passes each reading through :func:`fit_reading` before it sends: a value the
contract refuses is left out (the field is None: not measured), the
reading's other values go on, and the producer counts what it left out. A
reading whose key itself is refused (a GPU index beyond 65535) is dropped.
"""

from __future__ import annotations

import re
from typing import TypeVar

import msgspec

from stepwatch.contract.codec import decode_unchecked, encode
from stepwatch.contract.records import (
    GpuMessage,
    GpuReading,
    Message,
    PortMessage,
    PortReading,
    plain_name,
)
from stepwatch.errors import ContractError

R = TypeVar("R", GpuReading, PortReading)

_AT = re.compile(r"at `\$\.(\w+)`")
_KEYS = frozenset({"index", "device", "port"})


def fit_reading(reading: R) -> tuple[R | None, list[str]]:
    """(the reading with every refused value left out, or None; the fields changed).

    A text field is made a plain name (a control character as U+FFFD, clipped: the name
    rule, which decoding alone does not check); any other refused value falls back to
    its field's default (None: not measured)."""
    cls = type(reading)
    data: dict[str, object] = msgspec.to_builtins(reading)
    changed: list[str] = []
    for key, value in data.items():
        if isinstance(value, str) and plain_name(value) != value:
            data[key] = plain_name(value)
            changed.append(key)
    for _ in range(len(cls.__struct_fields__)):
        try:
            fitted = msgspec.convert(data, cls)
        except msgspec.ValidationError as err:
            field = _field_of(err)
            if field is None or field in _KEYS or field not in data:
                return None, [*changed, field or "?"]
            del data[field]  # its default
            changed.append(field)
            continue
        return (fitted if changed else reading), changed
    return None, changed


def _field_of(err: msgspec.ValidationError) -> str | None:
    found = _AT.search(str(err))
    return found.group(1) if found else None


def fit_message(message: Message) -> tuple[Message, list[str]]:
    """A GPU or port message with each reading fitted (:func:`fit_reading`); other kinds,
    and a message all of whose readings fit, as they are. Whether they all fit is asked
    first of the message's wire form, as a consumer reads it: one encode and one decode,
    a few times cheaper than fitting reading by reading (``bench/bench_agent_fit.py``)."""
    if not isinstance(message, GpuMessage | PortMessage):
        return message, []
    try:
        decode_unchecked(encode(message))
        return message, []
    except ContractError:
        pass
    if isinstance(message, GpuMessage):
        gpus, left_out = _fit_all(message.gpus)
        return (message if gpus is None else msgspec.structs.replace(message, gpus=gpus)), left_out
    ports, left_out = _fit_all(message.ports)
    return (message if ports is None else msgspec.structs.replace(message, ports=ports)), left_out


def _fit_all(readings: list[R]) -> tuple[list[R] | None, list[str]]:
    """(the fitted readings, None when all fit as they were; the fields left out)."""
    fitted: list[R] = []
    left_out: list[str] = []
    for reading in readings:
        fit, names = fit_reading(reading)
        left_out.extend(names)
        if fit is not None:
            fitted.append(fit)
    return (None if not left_out else fitted), left_out

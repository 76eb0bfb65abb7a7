"""Encode and validate contract messages: the one entry point for bytes <-> records.

``decode`` returns a typed message or raises :class:`ContractError` with a
precise reason; it never returns something half-read. Newer versions than this
code understands are rejected (``unsupported_version``), never misread.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Iterator

import msgspec

from stepwatch.contract.names import check_names, may_break_names
from stepwatch.contract.records import (
    CONTRACT_VERSION,
    MAX_STEP_SECONDS,
    MIN_EPOCH,
    EventMessage,
    GpuMessage,
    Message,
    PortMessage,
    PortReading,
    StepMessage,
    StepRecord,
)
from stepwatch.errors import ContractError

FUTURE_SKEW_SECONDS = 300.0  # a timestamp further ahead than this is absurd
MAX_MESSAGE_BYTES = 1 << 20  # a larger message is refused (``too_large``); see Settings
KINDS = ("step", "gpu", "port", "event", "detection")


class _Header(msgspec.Struct):
    kind: str | None = None
    v: int | None = None


_header = msgspec.json.Decoder(_Header)
_decoder: msgspec.json.Decoder[Message] = msgspec.json.Decoder(Message)
_encoder = msgspec.json.Encoder()


def encode(message: Message) -> bytes:
    """The wire form of a message: compact JSON, no newline."""
    return _encoder.encode(message)


def decode(
    data: bytes | str,
    *,
    now: Callable[[], float] = time.time,
    max_bytes: int = MAX_MESSAGE_BYTES,
) -> Message:
    """Parse and validate one message; raise ContractError with the reason.

    A message longer than ``max_bytes`` is refused unread (``too_large``): a
    node tick is a few kB, so a megabyte is a bug or an attack, and every
    consumer should refuse it the same way.

    Non-negativity is checked by msgspec while decoding (schema constraints in
    records.py) and decoded JSON numbers are always finite, so what is left is
    what needs the clock or two fields at once: timestamps in the future, rank
    below world size, step duration. Any doubt goes to :func:`check_values`,
    the authority, for the precise reason.
    """
    if len(data) > max_bytes:
        raise ContractError("too_large", f"{len(data)} bytes, more than the limit of {max_bytes}")
    message = decode_unchecked(data)
    t = now()
    if message.ts > t + FUTURE_SKEW_SECONDS or (
        isinstance(message, StepMessage) and not _steps_plausible(message.steps, t)
    ):
        check_values(message, t)
    return message


def _steps_plausible(steps: list[StepRecord], now: float) -> bool:
    limit = now + FUTURE_SKEW_SECONDS
    for r in steps:
        if not (
            r.rank < r.world_size and r.end <= limit and 0 <= r.end - r.start <= MAX_STEP_SECONDS
        ):
            return False
    return True


def decode_unchecked(data: bytes | str) -> Message:
    """Parse one message against the schema, without the absurd-value checks."""
    # Fast path: one parse. A message that decodes with a version this reader
    # knows is exactly what the checked path below returns; anything else goes
    # through it for the precise reason.
    try:
        message = _decoder.decode(data)
    except (msgspec.DecodeError, UnicodeDecodeError) as err:  # ValidationError included
        return _decode_with_header(data, err)
    if 1 <= message.v <= CONTRACT_VERSION:
        if may_break_names(data):
            check_names(message)
        return message
    return _decode_with_header(data)


def _decode_with_header(data: bytes | str, failed: Exception | None = None) -> Message:
    """The precise reason: the header first (kind, version), then the whole message
    (``failed``: how the whole message's parse already failed; the same parse again
    would fail the same way)."""
    try:
        header = _header.decode(data)
    except msgspec.ValidationError as err:  # (a subclass of DecodeError: first)
        raise ContractError("schema", str(err)) from err
    except msgspec.DecodeError as err:
        raise ContractError("malformed_json", str(err)) from err
    except UnicodeDecodeError as err:
        raise not_utf8(err) from err
    if header.kind is None:
        raise ContractError("schema", "missing field `kind`")
    if header.kind not in KINDS:
        raise ContractError("unknown_kind", f"kind {header.kind!r} is not one of {KINDS}")
    if header.v is not None and header.v > CONTRACT_VERSION:
        raise ContractError(
            "unsupported_version",
            f"{header.kind} v{header.v} is newer than this reader (v{CONTRACT_VERSION})",
        )
    if header.v is not None and header.v < 1:
        raise ContractError("schema", f"version must be >= 1, got {header.v}")
    try:
        if failed is not None:
            raise failed
        message = _decoder.decode(data)
    except msgspec.ValidationError as err:
        raise ContractError(_validation_reason(err), str(err)) from err
    except msgspec.DecodeError as err:
        raise ContractError("malformed_json", str(err)) from err
    except UnicodeDecodeError as err:
        raise not_utf8(err) from err
    check_names(message)
    return message


def not_utf8(err: UnicodeDecodeError) -> ContractError:
    """A string that is not UTF-8: malformed JSON (RFC 8259: JSON text is UTF-8). msgspec
    raises UnicodeDecodeError for it, not DecodeError: without this it escaped every
    caller's ``except ContractError`` (one bad byte in a host name lost a worker's whole
    batch)."""
    return ContractError("malformed_json", f"a string is not UTF-8: {err}")


def _validation_reason(err: msgspec.ValidationError) -> str:
    """Which contract reason a schema violation is.

    Above a value's ceiling (``Expected `int` <= ...``, or a number no float
    can hold) is ``overflow``, below its floor (``Expected `int` >= 0``) is
    ``absurd_value``; the rest is ``schema``.
    """
    text = str(err)
    if "` <= " in text or "` < " in text or text.startswith("Number out of range"):
        return "overflow"
    return "absurd_value" if "` >= " in text or "` > " in text else "schema"


def check_values(message: Message, now: float) -> None:
    """Reject values no real system produces: NaN, negative durations, the future."""
    _check_time("ts", message.ts, now)
    # Each branch first runs a cheap pre-check over the whole message; only when
    # it fails does the record-by-record check run, to raise with the precise
    # reason (it is the authority: the pre-check may fail where it would pass).
    if isinstance(message, StepMessage):
        if _sane_steps(message.steps, now):
            return
        for record in message.steps:
            check_step(record, now)
    elif isinstance(message, GpuMessage):
        if _sane_readings(message.gpus):
            return
        for gpu in message.gpus:
            _check_numbers(f"gpus[{gpu.index}]", msgspec.structs.asdict(gpu))
    elif isinstance(message, PortMessage):
        if _sane_readings(message.ports):
            return
        for port in message.ports:
            _check_numbers(f"ports[{port.device}:{port.port}]", msgspec.structs.asdict(port))
    elif isinstance(message, EventMessage):
        _check_numbers("event", {"code": message.code})


def check_step(record: StepRecord, now: float) -> None:
    where = f"step job={record.job_id} rank={record.rank} step={record.step}"
    if record.rank < 0 or record.world_size < 1 or record.rank >= record.world_size:
        raise ContractError("absurd_value", f"{where}: rank outside [0, world_size)")
    if record.step < 0:
        raise ContractError("absurd_value", f"{where}: negative step number")
    _check_time(f"{where} start", record.start, now)
    _check_time(f"{where} end", record.end, now)
    duration = record.end - record.start
    if not 0 <= duration <= MAX_STEP_SECONDS:
        raise ContractError("absurd_value", f"{where}: duration {duration!r} s")
    if record.samples < 0 or record.tokens < 0:
        raise ContractError("absurd_value", f"{where}: negative samples or tokens")
    if record.phases is not None:
        phases = msgspec.structs.asdict(record.phases)
        extra = phases.pop("extra")
        for name, value in {**phases, **extra}.items():
            if value is not None and (not math.isfinite(value) or value < 0):
                raise ContractError("absurd_value", f"{where}: phase {name}={value!r}")
    if record.loss is not None and math.isinf(record.loss) and record.loss < 0:
        raise ContractError("absurd_value", f"{where}: loss is -inf")


def _finite_non_negative(values: list[float]) -> bool:
    return not values or (min(values) >= 0 and math.isfinite(sum(values)))


def _sane_readings(readings: Iterable[msgspec.Struct]) -> bool:
    """True when no reading has a negative or non-finite number (fast path)."""
    astuple = msgspec.structs.astuple
    return _finite_non_negative(
        [v for r in readings for v in astuple(r) if type(v) is float or type(v) is int]
    )


def _sane_steps(steps: Iterable[StepRecord], now: float) -> bool:
    """True when every record would pass :func:`check_step` (fast path)."""
    limit = now + FUTURE_SKEW_SECONDS
    astuple = msgspec.structs.astuple
    for r in steps:
        start, end = r.start, r.end
        if not (
            0 <= r.rank < r.world_size
            and r.step >= 0
            and r.samples >= 0
            and r.tokens >= 0
            and MIN_EPOCH <= start <= limit
            and MIN_EPOCH <= end <= limit
            and 0 <= end - start <= MAX_STEP_SECONDS
        ):
            return False
        if r.phases is not None:
            values = [v for v in astuple(r.phases) if type(v) is float or type(v) is int]
            values.extend(r.phases.extra.values())
            if not _finite_non_negative(values):
                return False
        if r.loss is not None and r.loss == -math.inf:
            return False
    return True


def _sane_nonnegative_steps(steps: Iterable[StepRecord], now: float) -> bool:
    """:func:`_sane_steps` for records known to hold no negative or non-finite number."""
    limit = now + FUTURE_SKEW_SECONDS
    return all(
        MIN_EPOCH <= r.start <= r.end <= limit
        and r.end - r.start <= MAX_STEP_SECONDS
        and r.rank < r.world_size
        for r in steps
    )


def _check_time(what: str, value: float, now: float) -> None:
    if not math.isfinite(value) or value < MIN_EPOCH:
        raise ContractError(
            "absurd_value",
            f"{what}: timestamp {value!r} is not epoch seconds (before 2001-09-09; "
            "a clock since boot?)",
        )
    if value > now + FUTURE_SKEW_SECONDS:
        raise ContractError("absurd_value", f"{what}: timestamp {value!r} is in the future")


def _check_struct(where: str, record: msgspec.Struct) -> None:
    """Fast path: only on a bad value build the precise message."""
    for name in record.__struct_fields__:
        value = getattr(record, name)
        if value is None or value.__class__ is str or value.__class__ is bool:
            continue
        if not value >= 0 or value == math.inf:  # negative, NaN or inf
            _check_numbers(f"{where}[{_ident(record)}]", msgspec.structs.asdict(record))


def _ident(record: msgspec.Struct) -> str:
    if isinstance(record, PortReading):
        return f"{record.device}:{record.port}"
    return str(getattr(record, "index", "?"))


def _check_numbers(where: str, fields: dict[str, object]) -> None:
    for name, value in fields.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            continue
        if isinstance(value, float) and not math.isfinite(value):
            raise ContractError("absurd_value", f"{where}: {name}={value!r}")
        if value < 0:
            raise ContractError("absurd_value", f"{where}: {name}={value!r} is negative")


def read_jsonl(lines: Iterable[bytes | str]) -> Iterator[Message | ContractError]:
    """Decode a JSON Lines stream; bad lines come back as errors, in place."""
    for line in lines:
        if not line.strip():
            continue
        try:
            yield decode_unchecked(line)
        except ContractError as err:
            yield err


def write_jsonl(messages: Iterable[Message]) -> Iterator[bytes]:
    for message in messages:
        yield encode(message) + b"\n"

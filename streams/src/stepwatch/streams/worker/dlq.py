"""Validation outcome of one input record, and the dead-letter record for a bad one.

A Kafka record the worker cannot use goes to ``<prefix>.dlq`` with the reason,
the decoder's detail, where it came from (topic, partition, offset, key) and
the original payload, so that nothing is lost silently and the sender can be
found. The payload is kept as UTF-8 text when it is valid UTF-8, else base64;
payloads above ``MAX_PAYLOAD_BYTES`` are truncated (``payload_truncated``).

Reasons are the contract's (``malformed_json``, ``schema``, ``unknown_kind``,
``unsupported_version``, ``absurd_value``, ``overflow``, ``too_large``) plus the worker's own:
``wrong_topic`` (a valid message of another kind, e.g. a GPU sample on the
steps topic, or a detection on an input topic), ``wrong_partition`` (a message
whose key belongs on another partition: :mod:`stepwatch.streams.worker.placement`),
``processing_error`` (the
detection core raised on a valid message; the worker carries on) and the
admission reasons ``future_timestamp``, ``too_old``, ``step_jump`` and
``foreign_lifecycle`` (:mod:`stepwatch.streams.worker.admission`).
"""

from __future__ import annotations

import base64
import binascii
import enum
import time

import msgspec

from stepwatch.errors import ContractError

MAX_PAYLOAD_BYTES = 256 * 1024
MAX_DETAIL_CHARS = 1000


class DlqReason(enum.StrEnum):
    MALFORMED_JSON = "malformed_json"
    SCHEMA = "schema"
    UNKNOWN_KIND = "unknown_kind"
    UNSUPPORTED_VERSION = "unsupported_version"
    ABSURD_VALUE = "absurd_value"
    OVERFLOW = "overflow"
    TOO_LARGE = "too_large"
    WRONG_TOPIC = "wrong_topic"
    WRONG_PARTITION = "wrong_partition"  # its key belongs on another partition (placement.py)
    PROCESSING_ERROR = "processing_error"
    # an output (detection) the producer or the broker refused for what it is (its
    # size): stepwatch.streams.worker.publisher
    UNDELIVERABLE = "undeliverable"
    # admission (stepwatch.streams.worker.admission): valid alone, refused against the
    # job's progress
    FUTURE_TIMESTAMP = "future_timestamp"
    TOO_OLD = "too_old"
    STEP_JUMP = "step_jump"
    FOREIGN_LIFECYCLE = "foreign_lifecycle"
    FOREIGN_JOB = "foreign_job"
    WORLD_SIZE = "world_size"
    CAPACITY = "capacity"

    @classmethod
    def of(cls, err: ContractError) -> DlqReason:
        try:
            return cls(err.reason)
        except ValueError:
            return cls.SCHEMA


class DeadLetter(msgspec.Struct, frozen=True, kw_only=True):
    """The value of a DLQ record (JSON)."""

    reason: str
    detail: str
    topic: str
    partition: int
    offset: int
    key: str | None
    payload: str
    payload_encoding: str  # "utf-8" or "base64"
    payload_bytes: int
    payload_truncated: bool = False
    worker: str = ""
    ts: float = 0.0  # wall clock when dead-lettered
    kind: str = "dlq"
    v: int = 1


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(DeadLetter)


def dead_letter(
    reason: DlqReason,
    detail: str,
    *,
    topic: str,
    partition: int,
    offset: int,
    key: bytes | None,
    payload: bytes | None,
    worker: str = "",
    now: float | None = None,
) -> DeadLetter:
    raw = payload or b""
    truncated = len(raw) > MAX_PAYLOAD_BYTES
    body = raw[:MAX_PAYLOAD_BYTES]
    try:
        text, encoding = body.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        text, encoding = base64.b64encode(body).decode("ascii"), "base64"
    return DeadLetter(
        reason=str(reason),
        detail=detail[:MAX_DETAIL_CHARS],
        topic=topic,
        partition=partition,
        offset=offset,
        key=None if key is None else key.decode("utf-8", "replace"),
        payload=text,
        payload_encoding=encoding,
        payload_bytes=len(raw),
        payload_truncated=truncated,
        worker=worker,
        ts=time.time() if now is None else now,
    )


def encode_dead_letter(letter: DeadLetter) -> bytes:
    return _encoder.encode(letter)


def decode_dead_letter(data: bytes) -> DeadLetter:
    """A DLQ record's value. Anything else on the topic (whoever can produce to it can
    write there) raises :class:`ContractError` with the contract's reason, as a bad
    message does: ``schema`` or ``malformed_json`` (not UTF-8 included)."""
    try:
        return _decoder.decode(data)
    except msgspec.ValidationError as err:
        raise ContractError("schema", str(err)) from err
    except (msgspec.DecodeError, UnicodeDecodeError) as err:
        raise ContractError("malformed_json", str(err)) from err


def original_payload(letter: DeadLetter) -> bytes:
    """The payload as it was received (possibly truncated); :class:`ContractError`
    (``schema``) when a letter that says base64 does not hold it."""
    if letter.payload_encoding == "base64":
        try:
            return base64.b64decode(letter.payload, validate=True)
        except binascii.Error as err:
            raise ContractError("schema", f"payload is not base64: {err}") from err
    return letter.payload.encode("utf-8")

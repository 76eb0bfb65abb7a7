"""Reading the DLQ back: a real dead letter round-trips; anything else on the topic
raises ContractError with the contract's reason, never a decoder's own error."""

from __future__ import annotations

import pytest

from stepwatch.errors import ContractError
from stepwatch.streams.worker.dlq import (
    DlqReason,
    dead_letter,
    decode_dead_letter,
    encode_dead_letter,
    original_payload,
)

pytestmark = pytest.mark.unit


def _letter(payload: bytes) -> bytes:
    return encode_dead_letter(
        dead_letter(
            DlqReason.MALFORMED_JSON, "bad", topic="t", partition=0, offset=7, key=b"k",
            payload=payload, now=1.0,
        )
    )  # fmt: skip


@pytest.mark.parametrize("payload", [b'{"kind": "st', b"\xff\xfe binary \x00", b""])
def test_a_dead_letter_gives_back_its_payload(payload: bytes) -> None:
    letter = decode_dead_letter(_letter(payload))
    assert letter.offset == 7 and original_payload(letter) == payload


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"{not json", "malformed_json"),
        (b'{"reason": "x", "detail": "\xff"}', "malformed_json"),  # a string not UTF-8
        (b"[1, 2]", "schema"),
        (b'{"reason": "x"}', "schema"),  # fields missing
        (_letter(b"x").replace(b'"offset":7', b'"offset":"7"'), "schema"),
    ],
)
def test_anything_else_on_the_topic_is_a_contract_error(data: bytes, reason: str) -> None:
    with pytest.raises(ContractError) as err:
        decode_dead_letter(data)
    assert err.value.reason == reason


def test_a_letter_whose_base64_is_broken_is_a_contract_error() -> None:
    data = _letter(b"\xff\xfe")  # not UTF-8: kept as base64
    assert b'"payload_encoding":"base64"' in data
    letter = decode_dead_letter(data.replace(b'"payload":"', b'"payload":"!!'))
    with pytest.raises(ContractError) as err:
        original_payload(letter)
    assert err.value.reason == "schema"

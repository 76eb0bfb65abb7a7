"""Any bytes in, a message or a ContractError out, at every decoder of the contract.

msgspec raises ``UnicodeDecodeError`` (not ``DecodeError``) for a JSON string that
is not UTF-8: before it was mapped, one flipped byte inside a host name escaped
every ``except ContractError`` (the stream worker dropped the whole batch around
it). Random byte changes to valid messages, datagrams and operations records.
"""

from __future__ import annotations

import random

import pytest

from stepwatch.contract import decode, encode
from stepwatch.contract.ops import AlertRecord, decode_alert, encode_ops
from stepwatch.contract.wire import RankStep, decode_datagram, encode_datagram
from stepwatch.errors import ContractError
from stepwatch.sim import Scenario, simulate

pytestmark = pytest.mark.unit


def _mutants(rng: random.Random, value: bytes, n: int) -> list[bytes]:
    out = []
    for _ in range(n):
        b = bytearray(value)
        for _ in range(rng.choice((1, 1, 2, 4))):
            b[rng.randrange(len(b))] = rng.choice((rng.randrange(256), 0xFF, 0xC3, 0xED))
        out.append(bytes(b))
    return out


def _only_contract_errors(decoder: object, payloads: list[bytes]) -> set[str]:
    reasons = set()
    for p in payloads:
        try:
            decoder(p)  # type: ignore[operator]
            reasons.add("ok")
        except ContractError as err:
            reasons.add(err.reason)
    return reasons


def test_messages_with_changed_bytes_decode_or_give_a_reason() -> None:
    rng = random.Random(11)
    scenario = Scenario(seed=2, nodes=1, steps=4, job_id="j", start_ts=1_700_000_000.0)
    payloads = [m for msg in simulate(scenario) for m in _mutants(rng, encode(msg), 60)]
    reasons = _only_contract_errors(lambda p: decode(p, now=lambda: 1_700_000_100.0), payloads)
    assert "malformed_json" in reasons and "ok" in reasons


def test_datagrams_and_ops_records_with_changed_bytes_give_a_reason() -> None:
    from stepwatch.contract import StepRecord

    rng = random.Random(12)
    step = StepRecord(job_id="job", rank=1, world_size=8, step=3, start=1.0, end=2.0)
    datagram = encode_datagram(RankStep(step=step))
    alert = encode_ops(
        AlertRecord(
            received_at=1.0,
            fingerprint="f0",
            status="firing",
            alertname="StepwatchStraggler",
            starts_at=1.0,
            job_id="job",
            labels={"host": "gpu-001"},
        )
    )
    assert _only_contract_errors(decode_datagram, _mutants(rng, datagram, 400)) >= {
        "malformed_json"
    }
    assert _only_contract_errors(decode_alert, _mutants(rng, alert, 400)) >= {"malformed_json"}

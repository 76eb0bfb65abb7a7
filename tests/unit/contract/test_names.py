"""Names a sender chooses (job id, host, group, agent instance) are bounded and plain.

Before: any string passed, so a job id like ``"42\\n2026-11-25 INFO remediation
executed node=gpu-001"`` forged a line in the stream worker's log
(``detection opened ... job_id=%s``), an ANSI escape repainted an operator's
terminal, and a 100 kB job id became a Prometheus label and a store key.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import pytest

from stepwatch.agents.collectors.base import HostContext
from stepwatch.agents.collectors.steps import StepsCollector
from stepwatch.contract import KIND_OF, EventMessage, EventType, StepMessage, decode, encode
from stepwatch.contract.wire import decode_datagram
from stepwatch.errors import ContractError

NOW = time.time()
NAME_MAX = 256  # stepwatch.contract.records.NAME_MAX
BAD = [
    "42\n2026-11-25 INFO remediation executed node=gpu-001",
    "42\n",
    "42\r",
    "\x1b[2J\x1b[31mjob",
    "job\x00",
    "job\x85",
    "job\u2028x",
    "\u202e24",
    "j" * (NAME_MAX + 1),
]
GOOD = ["42", "", "run-7f3a.b_c:1", "gpu-[001-004],x", "jöb-ünïcode", "j" * NAME_MAX]


def _step(job: str = "42", host: str = "h", group: str = "all") -> dict:
    return {
        "job_id": job,
        "rank": 0,
        "world_size": 1,
        "step": 1,
        "start": NOW - 1,
        "end": NOW,
        "host": host,
        "group": group,
    }


def _message(field: str, value: str) -> bytes:
    msg = {
        "kind": "step",
        "v": 1,
        "host": "h",
        "ts": NOW,
        "inst": "i",
        "job_id": "42",
        "steps": [_step()],
    }
    if field in ("host", "inst", "job_id"):
        msg[field] = value
    else:
        msg["steps"] = [_step(**{field: value})]
    return json.dumps(msg).encode()


def _raw(field: str, value: str) -> bytes:
    """As _message, with non-ASCII characters sent raw (UTF-8), not \\u-escaped."""
    return json.dumps(json.loads(_message(field, value)), ensure_ascii=False).encode()


# the rule is checked after decoding (stepwatch.contract.names), only when the raw bytes
# could hold a forbidden character: the same verdicts for escaped and raw UTF-8 names,
# given as bytes or as str
@pytest.mark.parametrize("encoded", [_message, _raw])
@pytest.mark.parametrize("field", ["host", "inst", "job_id", "job", "group"])
@pytest.mark.parametrize("value", BAD)
def test_a_name_with_control_characters_or_too_long_is_refused(
    encoded: Callable[[str, str], bytes], field: str, value: str
) -> None:
    with pytest.raises(ContractError) as err:
        decode(encoded(field, value))
    assert err.value.reason == "schema"
    with pytest.raises(ContractError):
        decode(encoded(field, value).decode())


@pytest.mark.parametrize("value", GOOD)
def test_plain_names_pass_brackets_included(value: str) -> None:
    # host lists are the remediator's to refuse (alerts/remediate/identity.py), not the contract's
    assert isinstance(decode(_message("job", value)), StepMessage)


@pytest.mark.parametrize("kind", ["gpu", "port", "event", "detection"])
def test_every_message_kind_checks_its_job_id_and_host(kind: str) -> None:
    for field in ("job_id", "host"):
        msg = {"kind": kind, "v": 1, "host": "h", "ts": NOW, field: "x\n[fake]"}
        if kind == "event":
            msg["type"] = "xid"
        with pytest.raises(ContractError):
            decode(json.dumps(msg).encode())


def test_the_agent_drops_a_datagram_whose_job_id_forges_a_log_line(tmp_path) -> None:
    forged = {"kind": "rank_step", "step": _step(job=BAD[0], host="")}
    event = {"kind": "rank_event", "type": "job_end", "ts": NOW, "job_id": BAD[3]}
    for item in (forged, event):
        with pytest.raises(ContractError):
            decode_datagram(json.dumps(item).encode())
    c = StepsCollector(str(tmp_path / "s" / "agent.sock"), clock=lambda: NOW)
    try:
        c.feed(json.dumps(forged).encode())
        c.feed(json.dumps({"kind": "rank_step", "step": _step(host="")}).encode())
        out = c.collect(HostContext("node07", NOW, {}))
    finally:
        c.close()
    assert [m.job_id for m in out if isinstance(m, StepMessage)] == ["42"]
    assert c.rejected["schema"] == 1


def test_the_refusal_says_which_name_and_where() -> None:
    with pytest.raises(ContractError) as err:
        decode(_raw("group", "\u202e24"))
    assert err.value.detail.startswith("Expected `str` matching regex '^[^")
    assert err.value.detail.endswith("- at `$.steps[0].group`")


def test_the_byte_screen_passes_only_what_cannot_break_the_rule() -> None:
    from stepwatch.contract.names import may_break_names

    assert not may_break_names(b'{"job_id":"run-7f3a.b_c:1"}')
    assert not may_break_names('{"job_id":"plain"}')
    assert not may_break_names(bytearray(b'{"job_id":"plain"}'))
    assert may_break_names(memoryview(b'{"job_id":"plain"}'))  # type: ignore[arg-type]
    for data in (b'{"a":"\\n"}', b'{"a":"\x7f"}', b'{"a":"\\u0041"}'):
        assert may_break_names(data) and may_break_names(data.decode())
    for text in ("ö", "中", "𝄞"):  # allowed outside ASCII: the bytes pass, the str is checked
        data = f'{{"a":"{text}"}}'
        assert not may_break_names(data.encode()) and may_break_names(data)


def test_every_forbidden_character_outside_ascii_trips_the_byte_screen() -> None:
    """Every code point the rules refuse (records.NAME_PATTERN and TEXT_PATTERN), in
    UTF-8, holds a byte the screen looks for; a bad byte sequence never reaches it
    (the decoder refuses it first)."""
    import re

    from stepwatch.contract.names import may_break_names
    from stepwatch.contract.records import NAME_PATTERN

    rule = re.compile(NAME_PATTERN)  # TEXT_PATTERN refuses a subset of these
    refused = [
        chr(cp)
        for cp in range(0x80, 0x110000)
        if not 0xD800 <= cp < 0xE000 and rule.match(chr(cp)) is None
    ]
    assert len(refused) > 40  # C1, the line separators, the bidi overrides
    assert all(may_break_names(c.encode()) for c in refused)
    for bad in (b"\xe0\x82\x85", b"\xc0\x85", b"\xed\xa0\x80", b"\x85"):  # overlong, lone
        with pytest.raises(ContractError):
            decode(_raw("job", "42").replace(b'"42"', b'"' + bad + b'"', 1))


def test_random_names_get_the_patterns_verdict_whatever_the_encoding() -> None:
    """Names drawn from plain, non-ASCII and forbidden characters: refused exactly when
    the pattern (records.NAME_PATTERN, as msgspec applied it) refuses them."""
    import random
    import re

    from stepwatch.contract.records import NAME_PATTERN

    alphabet = "ab9-_.:[]ö€𝄞 \t\n\r\x00\x1b\x7f\x85\x9f\u2028\u2029\u202a\u202e\u2066\u2069\u200f"
    rng = random.Random(7)
    refused = 0
    for _ in range(400):
        name = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 6)))
        ok = re.match(NAME_PATTERN, name) is not None
        for data in (_message("job", name), _raw("job", name)):
            try:
                decode(data)
                got = True
            except ContractError as err:
                assert err.reason == "schema", err
                got = False
            assert got == ok, (name, data)
        refused += not ok
    assert 50 < refused < 350  # both verdicts were exercised


# Identifiers a device or driver gives, and free text, reach the same logs, summaries,
# labels and terminals. Before: a NIC device "\x1b[2J\r\nlevel=INFO msg=..." + 300 "A"
# passed the contract and came out in a published detection's evidence and summary,
# and a device of 200,000 characters broke the sink's counter-seed query.
IDENTIFIERS = [
    ("gpu", "gpus", {"index": 0}, "uuid"),
    ("gpu", "gpus", {"index": 0}, "name"),
    ("gpu", "gpus", {"index": 0}, "pci_bus_id"),
    ("port", "ports", {"device": "mlx5_0", "port": 1}, "device"),
    ("port", "ports", {"device": "mlx5_0", "port": 1}, "netdev"),
    ("port", "ports", {"device": "mlx5_0", "port": 1}, "state"),
    ("port", "ports", {"device": "mlx5_0", "port": 1}, "phys_state"),
    ("port", "ports", {"device": "mlx5_0", "port": 1}, "link_layer"),
    ("event", None, {"type": "link_state"}, "device"),
    ("detection", None, {}, "type"),
    ("detection", None, {}, "cause"),
    ("detection", None, {}, "device"),
    ("detection", None, {}, "related"),
]


def _with(kind: str, items: str | None, base: dict, field: str, value: str) -> bytes:
    msg: dict = {"kind": kind, "v": 1, "host": "h", "ts": NOW}
    if items is None:
        msg.update(base)
        msg[field] = value
    else:
        msg[items] = [{**base, field: value}]
    return json.dumps(msg, ensure_ascii=False).encode()


@pytest.mark.parametrize(("kind", "items", "base", "field"), IDENTIFIERS)
def test_device_and_driver_identifiers_follow_the_name_rule(
    kind: str, items: str | None, base: dict, field: str
) -> None:
    forged = "\x1b[2J\r\nlevel=INFO msg=remediation executed node=gpu-002\u202e" + "A" * 300
    for value in (forged, "mlx5\x1b[31m", "x" * (NAME_MAX + 1), "mlx5_0\n"):
        with pytest.raises(ContractError) as err:
            decode(_with(kind, items, base, field, value))
        assert err.value.reason == "schema"
    assert KIND_OF[type(decode(_with(kind, items, base, field, "mlx5_0 ö")))] == kind


@pytest.mark.parametrize(
    ("kind", "field", "extra"),
    [("event", "detail", {"type": "exception"}), ("detection", "summary", {})],
)
def test_free_text_keeps_line_breaks_and_tabs_but_no_other_control_character(
    kind: str, field: str, extra: dict
) -> None:
    traceback = 'Traceback (most recent call last):\n\tFile "train.py", line 3\nRuntimeError: x'
    assert getattr(decode(_with(kind, None, extra, field, traceback)), field) == traceback
    for value in ("ok\x1b[2Jrepainted", "ok\r", "ok\x00", "\u202eok", "x" * 4097):
        with pytest.raises(ContractError) as err:
            decode(_with(kind, None, extra, field, value))
        assert err.value.reason == "schema"


def test_an_exception_text_with_colour_codes_is_kept_made_plain_not_refused(tmp_path) -> None:
    # an SDK (ours or another) sends an exception's text as it came: colour codes, CRLF
    coloured = "\x1b[31mCUDA error: out of memory\x1b[0m\r\nat step 7"
    event = {"kind": "rank_event", "type": "exception", "ts": NOW, "job_id": "42"}
    c = StepsCollector(str(tmp_path / "s" / "agent.sock"), clock=lambda: NOW)
    try:
        c.feed(json.dumps({**event, "detail": coloured}).encode())
        (out,) = c.collect(HostContext("node07", NOW, {}))
    finally:
        c.close()
    back = decode(encode(out))  # as the worker and the sink read it
    assert isinstance(back, EventMessage)
    assert back.detail == "\ufffd[31mCUDA error: out of memory\ufffd[0m\nat step 7"


def test_the_sdk_sends_exception_text_already_plain() -> None:
    from stepwatch.sdk.events import custom_event
    from stepwatch.sdk.identity import Identity

    ident = Identity(job_id="42", rank=0, world_size=1)
    ev = custom_event(ident, EventType.EXCEPTION, "boom\x1b[0m\u202e", {})
    assert ev.detail == "boom\ufffd[0m\ufffd"


@pytest.mark.parametrize("key", BAD)
@pytest.mark.parametrize(
    ("kind", "where"),
    [
        ("event", lambda k: {"attrs": {k: 1}}),
        ("detection", lambda k: {"evidence": {k: 1.5}}),
        ("step", lambda k: {"steps": [{**_step(), "phases": {"extra": {k: 0.1}}}]}),
        ("datagram", lambda k: {"attrs": {k: "v"}}),
    ],
)
def test_a_maps_keys_follow_the_name_rule(kind: str, where: Callable, key: str) -> None:
    """Before: ``attrs``, ``evidence`` and ``extra`` keys were any string: a NUL, a bidi
    override or a 100,000-character key reached the store's Map columns and logs."""
    if kind == "datagram":
        raw = {"kind": "rank_event", "type": "xid", "ts": NOW, "job_id": "42", **where(key)}
        with pytest.raises(ContractError, match="schema"):
            decode_datagram(json.dumps(raw).encode())
        return
    body = {"kind": kind, "host": "h", "ts": NOW, **where(key)}
    with pytest.raises(ContractError, match=r"schema.*at `key` in `\$\.(attrs|evidence|steps)"):
        decode(json.dumps(body).encode())


def test_a_maps_values_are_data_and_pass_as_they_came() -> None:
    """An exception's message (an old SDK's, with colour codes) stays an event's value."""
    attrs = {"message": "\x1b[31mCUDA error\x1b[0m", "oom": True, "step": 7}
    body = {"kind": "event", "host": "h", "ts": NOW, "type": "exception", "attrs": attrs}
    back = decode(json.dumps(body).encode())
    assert isinstance(back, EventMessage) and back.attrs == attrs

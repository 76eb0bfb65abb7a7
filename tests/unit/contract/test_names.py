"""Names a sender chooses (job id, host, group, agent instance) are bounded and plain.

Before: any string passed, so a job id like ``"42\\n2026-11-25 INFO remediation
executed node=gpu-001"`` forged a line in the stream worker's log
(``detection opened ... job_id=%s``), an ANSI escape repainted an operator's
terminal, and a 100 kB job id became a Prometheus label and a store key.
"""

from __future__ import annotations

import json
import time

import pytest

from stepwatch.agents.collectors.base import HostContext
from stepwatch.agents.collectors.steps import StepsCollector
from stepwatch.contract import StepMessage, decode
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


@pytest.mark.parametrize("field", ["host", "inst", "job_id", "job", "group"])
@pytest.mark.parametrize("value", BAD)
def test_a_name_with_control_characters_or_too_long_is_refused(field: str, value: str) -> None:
    with pytest.raises(ContractError) as err:
        decode(_message(field, value))
    assert err.value.reason == "schema"


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

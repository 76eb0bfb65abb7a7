"""The local datagram format between a training rank (the SDK) and its node agent.

One datagram = one compact JSON object, tagged by ``kind``:

* ``{"kind": "rank_step", "v": 1, "step": {<StepRecord>}}``: one step of one rank;
* ``{"kind": "rank_event", "v": 1, ...}``: a discrete event the rank saw
  (an exception in user code, a checkpoint save/load, a restart, and from rank 0
  the job's start and end).

The agent wraps these into contract messages (StepMessage / EventMessage) with
its host, instance id and sequence numbers. Datagrams larger than
:data:`MAX_DATAGRAM_BYTES` are never sent.
"""

from __future__ import annotations

import msgspec

from stepwatch.contract.codec import not_utf8
from stepwatch.contract.names import check_names, may_break_names
from stepwatch.contract.records import EventType, Index16, Index32, Name, StepRecord, Value
from stepwatch.errors import ContractError

WIRE_VERSION = 1
MAX_DATAGRAM_BYTES = 16 * 1024


class RankStep(msgspec.Struct, frozen=True, tag="rank_step", tag_field="kind"):
    step: StepRecord
    v: int = WIRE_VERSION


# What a rank may say about itself. ``xid``, ``ecc`` and ``link_state`` are facts about the
# host's hardware: only the agent's own collectors (NVML/DCGM, sysfs) state them. One forged
# XID 79 from any user of the socket paged GpuXidFatal, whose policy drains the node.
RANK_EVENT_TYPES = frozenset(
    {
        EventType.JOB_START,
        EventType.JOB_END,
        EventType.CHECKPOINT_SAVE,
        EventType.CHECKPOINT_BEGIN,
        EventType.CHECKPOINT_LOAD,
        EventType.RESTART,
        EventType.EXCEPTION,
    }
)


class RankEvent(
    msgspec.Struct, frozen=True, tag="rank_event", tag_field="kind", omit_defaults=True
):
    type: EventType
    ts: float
    job_id: Name  # bounded, no control characters (as in the contract's messages)
    rank: Index32 | None = None  # the contract's bounds: what the worker refuses never leaves
    gpu: Index16 | None = None
    detail: str = ""
    attrs: dict[Name, Value] = {}
    v: int = WIRE_VERSION
    code: int | None = None  # added in v1, optional: an exit code (job_end), as EventMessage.code


Datagram = RankStep | RankEvent

_encoder = msgspec.json.Encoder()
_decoder: msgspec.json.Decoder[Datagram] = msgspec.json.Decoder(Datagram)


def encode_datagram(item: Datagram) -> bytes:
    return _encoder.encode(item)


def decode_datagram(data: bytes) -> Datagram:
    """Parse one datagram; raise ContractError with the reason when it is not one."""
    if len(data) > MAX_DATAGRAM_BYTES:
        raise ContractError("schema", f"datagram of {len(data)} bytes exceeds {MAX_DATAGRAM_BYTES}")
    try:
        item = _decoder.decode(data)
    except msgspec.ValidationError as err:
        raise ContractError("schema", f"datagram: {err}") from err
    except msgspec.DecodeError as err:
        raise ContractError("malformed_json", f"datagram: {err}") from err
    except UnicodeDecodeError as err:
        raise ContractError("malformed_json", f"datagram: {not_utf8(err).detail}") from err
    if item.v > WIRE_VERSION:
        raise ContractError("unsupported_version", f"datagram v{item.v} > v{WIRE_VERSION}")
    if may_break_names(data):
        try:
            check_names(item)
        except ContractError as err:
            raise ContractError("schema", f"datagram: {err.detail}") from err
    if isinstance(item, RankEvent) and item.type not in RANK_EVENT_TYPES:
        raise ContractError(
            "host_fact",
            f"datagram: a rank cannot report a {item.type.value} event (the host's hardware "
            "events come from the agent's own collectors)",
        )
    return item

"""Operations records: alert state changes and remediation decisions on Kafka.

They are not telemetry (no ``host``/``inst``/``seq`` header): the alert
receiver publishes one :class:`AlertRecord` per alert of an Alertmanager
webhook on ``<prefix>.alerts`` (keyed by fingerprint), the remediator's audit
one :class:`RemediationRecord` per decision on ``<prefix>.remediations``
(keyed by action id). The store's sink consumes both topics into the
``alerts`` and ``remediation_actions`` tables: the sink stays the store's only
writer. A repeat of a record (a webhook re-sent, a replayed batch) is the same
row: both tables are ReplacingMergeTree on the record's identity.
"""

from __future__ import annotations

from typing import TypeVar

import msgspec

from stepwatch.contract.codec import not_utf8
from stepwatch.contract.names import check_names, may_break_names
from stepwatch.contract.records import Name
from stepwatch.errors import ContractError

OPS_VERSION = 1
_T = TypeVar("_T")
MAX_OPS_BYTES = 1 << 20


class AlertRecord(msgspec.Struct, frozen=True, forbid_unknown_fields=False):
    """One alert of one Alertmanager webhook (payload v4), as it was received: its names
    follow the contract's name rule (the receiver makes them plain: ``plain_name``), as
    they reach the store, logs and terminals as telemetry's names do."""

    received_at: float  # epoch seconds
    fingerprint: Name
    status: Name  # firing | resolved
    alertname: Name
    starts_at: float  # epoch seconds
    ends_at: float | None = None  # None while firing (Alertmanager sends 0001-01-01)
    severity: Name = ""
    job_id: Name = ""
    host: Name = ""
    labels: dict[Name, str] = msgspec.field(default_factory=dict)
    annotations: dict[Name, str] = msgspec.field(default_factory=dict)
    v: int = OPS_VERSION


class RemediationRecord(
    msgspec.Struct, frozen=True, forbid_unknown_fields=False, rename={"alert_class": "class"}
):
    """One remediator decision (the remediator's ``Decision.as_dict()``)."""

    ts: float
    id: str
    action: str
    outcome: str
    mode: str = ""
    reason: str = ""
    host: str = ""
    job_id: str = ""
    alertname: str = ""
    fingerprint: str = ""
    cause: str = ""
    alert_class: str = ""
    detail: str = ""


_alert_decoder = msgspec.json.Decoder(AlertRecord)
_remediation_decoder = msgspec.json.Decoder(RemediationRecord)
_encoder = msgspec.json.Encoder()


def encode_ops(record: AlertRecord | RemediationRecord) -> bytes:
    return _encoder.encode(record)


def decode_alert(payload: bytes) -> AlertRecord:
    record = _decode(_alert_decoder, payload)
    if may_break_names(payload):
        check_names(record)
    return record


def decode_remediation(payload: bytes) -> RemediationRecord:
    return _decode(_remediation_decoder, payload)


def _decode(decoder: msgspec.json.Decoder[_T], payload: bytes) -> _T:
    if len(payload) > MAX_OPS_BYTES:
        raise ContractError("too_large", f"{len(payload)} bytes (at most {MAX_OPS_BYTES})")
    try:
        return decoder.decode(payload)
    except msgspec.ValidationError as err:
        raise ContractError("schema", str(err)) from err
    except msgspec.DecodeError as err:
        raise ContractError("malformed_json", str(err)) from err
    except UnicodeDecodeError as err:
        raise not_utf8(err) from err

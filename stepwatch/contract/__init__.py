"""The event contract v1 (see docs/events.md)."""

from stepwatch.contract.codec import (
    check_step,
    check_values,
    decode,
    decode_unchecked,
    encode,
    read_jsonl,
    write_jsonl,
)
from stepwatch.contract.records import (
    CONTRACT_VERSION,
    KIND_OF,
    DetectionMessage,
    EventMessage,
    EventType,
    GpuMessage,
    GpuReading,
    Kind,
    Message,
    Phases,
    PortMessage,
    PortReading,
    StepMessage,
    StepRecord,
)
from stepwatch.contract.topics import Topics, message_key

__all__ = [
    "CONTRACT_VERSION",
    "KIND_OF",
    "DetectionMessage",
    "EventMessage",
    "EventType",
    "GpuMessage",
    "GpuReading",
    "Kind",
    "Message",
    "Phases",
    "PortMessage",
    "PortReading",
    "StepMessage",
    "StepRecord",
    "Topics",
    "check_step",
    "check_values",
    "decode",
    "decode_unchecked",
    "encode",
    "message_key",
    "read_jsonl",
    "write_jsonl",
]

"""Where the agent (or the simulator) hands finished messages.

``MessageSink`` is the one interface; :class:`JsonlSink` writes the offline form
of a topic; the Kafka publisher with its on-disk spool lives in
:mod:`stepwatch.agents.publisher`. :class:`Sequencer` stamps each message with its
per-(host, kind) sequence number and the sender's instance id before it is sent.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from typing import IO, Protocol, runtime_checkable

import msgspec

from stepwatch.contract import KIND_OF, Message, encode


@runtime_checkable
class MessageSink(Protocol):
    def send(self, messages: Sequence[Message]) -> None:
        """Accept messages for delivery. Must not block on the network."""
        ...

    def flush(self, timeout: float = 10.0) -> int:
        """Wait for delivery; return how many are still undelivered."""
        ...

    def close(self, timeout: float = 10.0) -> None: ...


class Sequencer:
    """Stamps ``inst`` and a gap-free ``seq`` per (host, kind)."""

    def __init__(self, inst: str | None = None) -> None:
        self.inst = inst or secrets.token_hex(4)
        self._next: dict[tuple[str, str], int] = {}

    def stamp(self, message: Message) -> Message:
        key = (message.host, KIND_OF[type(message)].value)
        seq = self._next.get(key, 0)
        self._next[key] = seq + 1
        return msgspec.structs.replace(message, inst=self.inst, seq=seq)


class JsonlSink:
    """Writes messages as JSON Lines: the same bytes a producer would send."""

    def __init__(self, stream: IO[bytes]) -> None:
        self._stream = stream
        self.sent = 0

    def send(self, messages: Sequence[Message]) -> None:
        for message in messages:
            self._stream.write(encode(message) + b"\n")
        self.sent += len(messages)

    def flush(self, timeout: float = 10.0) -> int:
        self._stream.flush()
        return 0

    def close(self, timeout: float = 10.0) -> None:
        self._stream.flush()

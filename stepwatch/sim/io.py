"""Files: messages as JSON Lines (the offline form of the topics), labels as JSON."""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import IO

import msgspec

from stepwatch.contract import Message, encode
from stepwatch.errors import StepwatchError
from stepwatch.sim.labels import Label

_CHUNK = 1 << 20


def write_jsonl(path: str | os.PathLike[str] | IO[bytes], messages: Iterable[Message]) -> int:
    """Write messages one per line (``path`` may be an open binary stream); return the count."""
    if hasattr(path, "write"):
        return _write(path, messages)  # type: ignore[arg-type]
    try:
        with open(path, "wb") as stream:
            return _write(stream, messages)
    except OSError as err:
        raise StepwatchError(f"cannot write {path}: {err}") from err


def _write(stream: IO[bytes], messages: Iterable[Message]) -> int:
    count, buf = 0, bytearray()
    for message in messages:
        buf += encode(message)
        buf += b"\n"
        count += 1
        if len(buf) >= _CHUNK:
            stream.write(buf)
            buf.clear()
    stream.write(buf)
    return count


def write_labels(path: str | os.PathLike[str], labels: Sequence[Label]) -> None:
    """Write the ground truth as a JSON array (indented, stable key order)."""
    data = msgspec.json.format(msgspec.json.encode(list(labels)), indent=2)
    try:
        with open(path, "wb") as stream:
            stream.write(data + b"\n")
    except OSError as err:
        raise StepwatchError(f"cannot write {path}: {err}") from err


def read_labels(path: str | os.PathLike[str]) -> list[Label]:
    try:
        with open(path, "rb") as stream:
            return msgspec.json.decode(stream.read(), type=list[Label])
    except (OSError, msgspec.DecodeError) as err:
        raise StepwatchError(f"cannot read labels from {path}: {err}") from err

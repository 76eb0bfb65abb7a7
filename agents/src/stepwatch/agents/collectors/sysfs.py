"""Cheap reads and strict parsing of small sysfs attribute files.

Reads go straight through ``os.open``/``os.read``/``os.close`` on prebuilt
string paths (no pathlib, no text decoding for numbers): the RDMA collector
reads a few hundred of these every tick. Parsers raise ``ValueError`` on
anything that is not the expected shape; :func:`failure_reason` names an
``OSError`` for counting and logging.
"""

from __future__ import annotations

import errno
import os

READ_SIZE = 256
_MISSING = frozenset({errno.ENOENT, errno.ENODEV, errno.ENXIO, errno.ENOTDIR})
_DENIED = frozenset({errno.EACCES, errno.EPERM})


def read_raw(path: str) -> bytes:
    """The first bytes of a sysfs file; raises OSError."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.read(fd, READ_SIZE)
    finally:
        os.close(fd)


def failure_reason(err: OSError) -> str:
    """``missing`` (file or device gone), ``permission_denied`` or ``io_error``."""
    if err.errno in _MISSING:
        return "missing"
    if err.errno in _DENIED:
        return "permission_denied"
    return "io_error"


def parse_counter(raw: bytes) -> int:
    """``b"123\\n"`` -> 123; empty, negative or non-numeric text raises ValueError."""
    value = int(raw)  # int() accepts surrounding whitespace, rejects b"" and garbage
    if value < 0:
        raise ValueError(f"negative counter {raw!r}")
    return value


def parse_state(raw: bytes) -> str:
    """``b"4: ACTIVE\\n"`` -> ``"ACTIVE"``; ``b"5: LinkUp\\n"`` -> ``"LinkUp"``."""
    code, sep, name = raw.decode("ascii").partition(":")
    name = name.strip()
    int(code)
    if not sep or not name or not name.replace("_", "").isalnum():
        raise ValueError(f"not a sysfs state {raw!r}")
    return name


def parse_rate(raw: bytes) -> float:
    """``b"400 Gb/sec (4X NDR)\\n"`` -> 400.0 (Gb/s)."""
    text = raw.decode("ascii").strip()
    number, _, unit = text.partition(" ")
    if not unit.startswith("Gb/sec"):
        raise ValueError(f"not a sysfs rate {raw!r}")
    value = float(number)
    if value < 0 or value != value:
        raise ValueError(f"not a sysfs rate {raw!r}")
    return value


def parse_word(raw: bytes) -> str:
    """``b"InfiniBand\\n"`` -> ``"InfiniBand"``; empty or non-printable raises ValueError."""
    text = raw.decode("ascii").strip()
    if not text or not text.isprintable():
        raise ValueError(f"not a sysfs word {raw!r}")
    return text


def list_dir(path: str) -> list[str]:
    """Sorted entries of a directory, or [] when it cannot be listed."""
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []

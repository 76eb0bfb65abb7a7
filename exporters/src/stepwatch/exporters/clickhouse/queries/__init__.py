"""Saved queries: one ``.sql`` file each, described by its header.

Header format (see docs/queries.md)::

    -- name: one-line summary
    --
    -- what it computes and how to read it (any number of lines)
    -- @param job String  the job                        (no default: required)
    -- @param since DateTime64(3, 'UTC') = -30d  help    (default after ' = ')

Parameters are bound server-side (``{name:Type}``), never formatted into the
SQL. ``DateTime64`` values accept ``0`` (the epoch), a relative age (``30d``,
``-12h``, ``15m``, ``2w``, ``90s``: that long before now), an ISO date or time
(UTC unless it says otherwise) or epoch seconds.
"""

from __future__ import annotations

import functools
import math
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from stepwatch.errors import ConfigError

QUERY_DIR = Path(__file__).parent
_PARAM = re.compile(r"^--\s*@param\s+(\w+)\s+(.+?)(?:\s+=\s+(\S*))?(?:\s{2,}(.*))?$")
_AGE = re.compile(r"^-?(\d+(?:\.\d+)?)\s*([smhdw])$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
MAX_EPOCH = 253402300799.0  # 9999-12-31T23:59:59Z, the last time Python's datetime holds


@dataclass(frozen=True)
class Param:
    name: str
    type: str
    default: str | None
    help: str

    @property
    def required(self) -> bool:
        return self.default is None


@dataclass(frozen=True)
class SavedQuery:
    name: str
    summary: str
    doc: str
    params: tuple[Param, ...]
    sql: str

    def param(self, name: str) -> Param | None:
        return next((p for p in self.params if p.name == name), None)

    def bind(self, values: Mapping[str, str | None], now: float | None = None) -> dict[str, str]:
        """Parameter values as strings ClickHouse parses: defaults applied, times resolved."""
        unknown = sorted(k for k, v in values.items() if v is not None and self.param(k) is None)
        if unknown:
            raise ConfigError(f"query {self.name} takes no parameter {', '.join(unknown)}")
        now = time.time() if now is None else now
        out: dict[str, str] = {}
        for p in self.params:
            raw = values.get(p.name)
            if raw is None:
                if p.required:
                    raise ConfigError(f"query {self.name} needs --{p.name.replace('_', '-')}")
                raw = p.default
            out[p.name] = convert(p, str(raw), now)
        return out


def convert(param: Param, raw: str, now: float) -> str:
    if raw == "''":
        raw = ""
    if param.type.startswith("DateTime"):
        return format_time(parse_time(raw, now))
    if param.type.startswith(("UInt", "Int")):
        try:
            value = int(raw)
        except ValueError as err:
            raise ConfigError(f"{param.name}: {raw!r} is not an integer") from err
        low, high = int_range(param.type)
        if not low <= value <= high:  # ClickHouse would wrap it silently (2^32 + 1 -> 1)
            raise ConfigError(f"{param.name}: {raw} is outside {param.type} ({low} to {high})")
    elif param.type.startswith("Float"):
        try:
            number = float(raw)
        except ValueError as err:
            raise ConfigError(f"{param.name}: {raw!r} is not a number") from err
        if not math.isfinite(number):
            raise ConfigError(f"{param.name}: {raw!r} is not a finite number")
    return raw


def int_range(type_name: str) -> tuple[int, int]:
    """The values a ClickHouse integer type holds (``UInt32``: 0 to 2^32 - 1)."""
    match = re.match(r"(U?)Int(\d+)", type_name)
    bits = int(match.group(2)) if match else 64
    if match and match.group(1):
        return 0, 2**bits - 1
    return -(2 ** (bits - 1)), 2 ** (bits - 1) - 1


def parse_time(text: str, now: float) -> float:
    """Epoch seconds from ``0``, an age (``30d``), ISO date/time or epoch seconds."""
    text = text.strip()
    match = _AGE.match(text)
    if match:
        return now - float(match.group(1)) * _UNITS[match.group(2)]
    try:
        epoch = float(text)
    except ValueError:
        pass
    else:
        if not 0.0 <= epoch <= MAX_EPOCH:  # nan and inf included
            raise ConfigError(f"{text!r}: epoch seconds must be 0 to {MAX_EPOCH:.0f} (year 9999)")
        return epoch
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError as err:
        raise ConfigError(
            f"cannot read {text!r} as a time (30d, 2026-01-31, 2026-01-31T12:00Z)"
        ) from err
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.timestamp()


def format_time(epoch: float) -> str:
    return datetime.fromtimestamp(min(max(0.0, epoch), MAX_EPOCH), UTC).strftime(
        "%Y-%m-%d %H:%M:%S.%f"
    )[:-3]


def parse(path: Path) -> SavedQuery:
    text = path.read_text()
    lines = text.splitlines()
    first = lines[0] if lines else ""
    name, _, summary = first.lstrip("-").strip().partition(":")
    if name.strip() != path.stem:
        raise ConfigError(f"{path.name}: the first line must be '-- {path.stem}: summary'")
    doc: list[str] = []
    params: list[Param] = []
    for line in lines[1:]:
        if not line.startswith("--"):
            break
        match = _PARAM.match(line)
        if match:
            pname, ptype, default, help_text = match.groups()
            params.append(Param(pname, ptype.strip(), default, (help_text or "").strip()))
        elif not params:
            doc.append(line[2:].strip())
    return SavedQuery(path.stem, summary.strip(), "\n".join(doc).strip(), tuple(params), text)


@functools.cache
def registry() -> dict[str, SavedQuery]:
    """Every saved query by name."""
    return {q.name: q for q in (parse(p) for p in sorted(QUERY_DIR.glob("*.sql")))}


def get(name: str) -> SavedQuery:
    try:
        return registry()[name]
    except KeyError:
        known = ", ".join(registry())
        raise ConfigError(f"no saved query {name!r}; known: {known}") from None

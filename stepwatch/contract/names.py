"""The control-character rule on names (``records.Name``) and free text
(``records.Text``: tabs and line breaks allowed), checked after decoding.

A name a sender chooses must hold no control character (C0, DEL, C1, line
separators, bidi overrides; see ``records.NAME_PATTERN``). msgspec could check
the pattern while decoding, but it then runs a regular expression on every name
of every record: about a third of the decode time of a step message. The rule
is checked here instead, only when the raw message *could* hold such a
character, which a scan of the bytes decides at memchr speed:

* JSON allows no raw C0 character in a string (msgspec refuses them as
  malformed), so a C0 character can only arrive escaped, behind a backslash;
* DEL is the one ASCII byte left (0x7f);
* every other forbidden character is outside ASCII: C1 (U+0080-U+009F) is
  ``C2 80``-``C2 9F`` in UTF-8, the line separators and bidi overrides
  (U+2028-U+202E, U+2066-U+2069) start with ``E2``; in valid UTF-8 (msgspec
  refuses anything else) these bytes only ever lead a character.

So a message that holds no backslash, DEL, ``C2`` or ``E2`` byte cannot break
the rule, and skips the check: four ``memchr`` scans (``bytes.find``), about
half the instructions of the ``bytes.isascii`` loop and two scans they replace
(callgrind on bench_stream's messages, a throwaway profile). Otherwise
every name field is walked and the first one that breaks the rule raises
:class:`~stepwatch.errors.ContractError` (``schema``) with the words msgspec used
for it, path included.
"""

from __future__ import annotations

import functools
import re
import types
import typing
from typing import Any

import msgspec

from stepwatch.contract.records import NAME_PATTERN, TEXT_PATTERN, Name, Text
from stepwatch.errors import ContractError

# per kind of field: its rule, and the words msgspec would use for a breach
_RULES = {
    "name": (re.compile(NAME_PATTERN), f"Expected `str` matching regex {NAME_PATTERN!r}"),
    "text": (re.compile(TEXT_PATTERN), f"Expected `str` matching regex {TEXT_PATTERN!r}"),
}


_BYTES = (bytes, bytearray)


def may_break_names(data: bytes | str) -> bool:
    """False only when no string in ``data`` can hold a forbidden character."""
    if isinstance(data, str):
        return not data.isascii() or "\\" in data or "\x7f" in data
    if isinstance(data, _BYTES):  # a tuple: ``bytes | bytearray`` builds a union per call
        # find, not ``in``: ``bytes in bytes`` first tries the operand as an int and
        # builds (and drops) a TypeError each time, more than the scans themselves cost
        return (
            data.find(b"\\") >= 0
            or data.find(b"\x7f") >= 0
            or data.find(b"\xc2") >= 0
            or data.find(b"\xe2") >= 0
        )
    return True  # another buffer type: check every name


def check_names(obj: msgspec.Struct, path: str = "$") -> None:
    """Raise ContractError at the first name of ``obj`` (and of the structs it holds)
    that breaks the rule."""
    for field, kind in _plan(type(obj)):
        value = getattr(obj, field)
        if value is None:
            continue
        where = f"{path}.{field}"
        rule = _RULES.get(kind)
        if rule is not None:
            if rule[0].match(value) is None:
                raise ContractError("schema", f"{rule[1]} - at `{where}`")
        elif kind == "struct":
            check_names(value, where)
        elif kind == "map":
            _check_map(value, where)
        else:  # a list of structs
            for i, item in enumerate(value):
                if isinstance(item, msgspec.Struct):
                    check_names(item, f"{where}[{i}]")


def _check_map(value: dict[str, object], where: str) -> None:
    """A map's keys by the name rule (its values are data: see ``records.Value``)."""
    rule, words = _RULES["name"]
    for key in value:
        if rule.match(key) is None:
            raise ContractError("schema", f"{words} - at `key` in `{where}`")


@functools.cache
def _plan(cls: type) -> tuple[tuple[str, str], ...]:
    """The fields of ``cls`` to look at: names, structs, lists of structs, maps keyed by
    name (in field order)."""
    hints = typing.get_type_hints(cls, include_extras=True)
    out: list[tuple[str, str]] = []
    for field in cls.__struct_fields__:  # type: ignore[attr-defined]
        kind = _kind(hints[field])
        if kind:
            out.append((field, kind))
    return tuple(out)


def _kind(hint: Any) -> str:
    if hint == Name:
        return "name"
    if hint == Text:
        return "text"
    if typing.get_origin(hint) is typing.Annotated:
        return _kind(typing.get_args(hint)[0])  # a bounded list of structs, say
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType) and len(args) == 1:
        return _kind(args[0])  # Optional[...]
    if isinstance(hint, type) and issubclass(hint, msgspec.Struct):
        return "struct" if _plan(hint) else ""
    if origin is dict and args and args[0] == Name:
        return "map"  # its keys are names
    item = args[0] if origin is list and args else None
    if isinstance(item, type) and issubclass(item, msgspec.Struct) and _plan(item):
        return "list"
    return ""

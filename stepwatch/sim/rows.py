"""Build many msgspec structs from columns at once (positional, in field order)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any, TypeVar

import msgspec

T = TypeVar("T", bound=msgspec.Struct)


def build_rows(cls: type[T], columns: dict[str, Any], n: int) -> list[T]:
    """``n`` instances of ``cls``; a column is a sequence of ``n`` values or one scalar.

    Fields not given take their default; unknown column names are an error, so
    a renamed contract field fails loudly here rather than silently.
    """
    fields: Sequence[str] = cls.__struct_fields__
    unknown = set(columns) - set(fields)
    if unknown:
        raise KeyError(f"{cls.__name__} has no field(s) {sorted(unknown)}")
    defaults = cls.__struct_defaults__
    first_default = len(fields) - len(defaults)
    last = max(fields.index(name) for name in columns)
    cols: list[Any] = []
    for i, name in enumerate(fields[: last + 1]):
        if name in columns:
            value = columns[name]
        elif i >= first_default:
            value = defaults[i - first_default]
        else:
            raise KeyError(f"{cls.__name__}.{name} is required")
        is_column = isinstance(value, list | tuple)
        cols.append(value if is_column else itertools.repeat(value, n))
    return list(itertools.starmap(cls, zip(*cols, strict=False)))

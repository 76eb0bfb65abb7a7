"""Query results as text: an aligned table, CSV, JSON or JSON Lines."""

from __future__ import annotations

import csv
import io
import json
from typing import Any

from stepwatch.contract.records import NOT_NAME
from stepwatch.errors import ConfigError
from stepwatch.exporters.clickhouse.store import Result

FORMATS = ("table", "csv", "json", "jsonl")


def render(result: Result, fmt: str = "table", max_width: int = 60) -> str:
    if fmt == "table":
        return table(result, max_width)
    if fmt == "csv":
        return to_csv(result)
    if fmt == "json":
        return json.dumps(result.dicts(), indent=1, default=str) + "\n"
    if fmt == "jsonl":
        return "".join(json.dumps(row, default=str) + "\n" for row in result.dicts())
    raise ConfigError(f"unknown format {fmt!r}; one of {', '.join(FORMATS)}")


def cell(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:.6g}" if abs(value) < 1e15 else f"{value:.4e}"
    if isinstance(value, list | dict):
        return json.dumps(value, default=str, separators=(",", ":"))
    return str(value)


def table(result: Result, max_width: int = 60) -> str:
    if not result.columns:
        return "OK\n"
    cells = [[_clip(cell(v), max_width) for v in row] for row in result.rows]
    widths = [len(c) for c in result.columns]
    for row in cells:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]
    numeric = [_is_numeric(t) for t in result.types]

    def line(values: list[str]) -> str:
        parts = [
            v.rjust(w) if num else v.ljust(w)
            for v, w, num in zip(values, widths, numeric, strict=True)
        ]
        return "  ".join(parts).rstrip()

    out = [line(list(result.columns)), "  ".join("-" * w for w in widths)]
    out.extend(line(row) for row in cells)
    out.append(f"({len(result.rows)} row{'s' if len(result.rows) != 1 else ''})")
    return "\n".join(out) + "\n"


def to_csv(result: Result) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(result.columns)
    for row in result.rows:
        writer.writerow(["" if v is None else _inert(v, cell(v)) for v in row])
    return buf.getvalue()


FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def _inert(value: Any, text: str) -> str:
    """A stored text that a spreadsheet would run as a formula, led by ``'`` (OWASP's
    advice): a host named ``=HYPERLINK("http://evil.example/","x")`` came out as a live
    formula in ``--format csv``. Numbers (``-3``) stay numbers."""
    if isinstance(value, str) and text.startswith(FORMULA_START):
        return "'" + text
    return text


def _clip(text: str, width: int) -> str:
    # a table is for a person's terminal; stored values are data (an exception's message
    # with colour codes, a label an alert sender chose): what the name rule forbids (what a
    # terminal would act on) is shown inert
    text = NOT_NAME.sub("\ufffd", text.replace("\n", " ").replace("\t", " "))
    return text if len(text) <= width else text[: width - 1] + "…"


def _is_numeric(type_name: str) -> bool:
    inner = type_name.removeprefix("Nullable(").rstrip(")")
    return inner.startswith(("UInt", "Int", "Float", "Decimal"))

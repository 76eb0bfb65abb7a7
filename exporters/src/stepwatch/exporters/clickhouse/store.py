"""The historical store interface: one SQL dialect, two transports.

:class:`Store` is the one extension point. Its sibling backends run the same
DDL, inserts and queries:

* :class:`~stepwatch.exporters.clickhouse.chdb_backend.ChdbStore`: the ClickHouse engine
  in-process (chdb), persistent at ``Settings.store_path``. The default.
* :class:`~stepwatch.exporters.clickhouse.connect_backend.ClickHouseConnectStore`: a
  ClickHouse server over HTTP(S) (clickhouse-connect). Production, and also how
  readers reach an embedded store that another process owns (see
  :mod:`stepwatch.exporters.clickhouse.service`).

Rows go in as ``JSONCompactEachRow`` and results come back as ``JSONCompact`` on
both transports, so the bytes are the same whichever runs underneath.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import msgspec

from stepwatch.errors import StoreError

# Settings that make JSON output identical on chdb and on a server.
OUTPUT_SETTINGS: dict[str, Any] = {
    "output_format_json_quote_64bit_integers": 0,
    "output_format_json_quote_decimals": 0,
    "output_format_json_named_tuples_as_objects": 1,
}

# ClickHouse error codes that mean "a value in this data is wrong" (parse
# errors, type mismatches, out-of-range values): retrying the same insert
# cannot help, so the sink bisects the batch down to the bad rows instead. Any
# other error (store down, unknown table, memory) is retried with backoff: a
# schema problem must stall the sink loudly, not dead-letter every row.
# 469 (a CHECK constraint) is the data's too: halves of the block go in. 252 is the
# data's only as "too many partitions for single INSERT block" (rows from many months);
# the same code also means TOO_MANY_PARTS, the server's back-pressure while merges catch
# up, which a retry outlasts and a bisection would turn into dead letters.
DATA_ERROR_CODES = frozenset(
    {6, 26, 27, 32, 33, 38, 41, 53, 69, 70, 72, 117, 130, 131, 190, 321, 386, 395, 469}
)
_PARTITIONS_PER_BLOCK = "too many partitions for single insert block"
_CODE = re.compile(r"Code:\s*(\d+)")


class ClickHouseError(StoreError):
    """A statement the store refused, with ClickHouse's error code when known.

    ``data_error`` is true when a value in the data caused it (see
    ``DATA_ERROR_CODES``); other errors may go away on retry.
    """

    def __init__(self, message: str, code: int | None = None, *, data_error: bool | None = None):
        super().__init__(message)
        self.code = code
        if data_error is None:
            data_error = code in DATA_ERROR_CODES or (
                code == 252 and _PARTITIONS_PER_BLOCK in message.lower()
            )
        self.data_error = data_error

    @property
    def retryable(self) -> bool:
        return not self.data_error


def error_from(err: BaseException, what: str) -> ClickHouseError:
    """Wrap a backend exception, keeping ClickHouse's error code."""
    text = str(err).strip()
    match = _CODE.search(text)
    code = int(match.group(1)) if match else None
    first = text.splitlines()[0] if text else type(err).__name__
    return ClickHouseError(f"{what}: {first}", code)


@dataclass(frozen=True)
class Result:
    """A query result: column names and types, rows as tuples."""

    columns: tuple[str, ...]
    types: tuple[str, ...]
    rows: list[tuple[Any, ...]] = field(default_factory=list)

    def dicts(self) -> list[dict[str, Any]]:
        return [dict(zip(self.columns, row, strict=True)) for row in self.rows]

    def scalar(self) -> Any:
        """The first column of the first row (None when there are no rows)."""
        return self.rows[0][0] if self.rows else None

    def column(self, name: str) -> list[Any]:
        i = self.columns.index(name)
        return [row[i] for row in self.rows]


class _Meta(msgspec.Struct):
    name: str
    type: str


class _JsonCompact(msgspec.Struct):
    meta: list[_Meta] = []
    data: list[list[Any]] = []


_json_compact = msgspec.json.Decoder(_JsonCompact)
_row_encoder = msgspec.json.Encoder()


def parse_json_compact(body: bytes) -> Result:
    """Parse ClickHouse ``JSONCompact`` output (empty body: no result set)."""
    if not body.strip():
        return Result((), ())
    try:
        parsed = _json_compact.decode(body)
    except msgspec.DecodeError as err:
        raise ClickHouseError(f"unreadable result: {err}", data_error=True) from err
    return Result(
        tuple(m.name for m in parsed.meta),
        tuple(m.type for m in parsed.meta),
        [tuple(row) for row in parsed.data],
    )


def encode_rows(rows: Iterable[Sequence[Any]]) -> bytes:
    """Rows as ``JSONCompactEachRow``: one JSON array per line."""
    return b"\n".join(_row_encoder.encode(row) for row in rows)


def strip_sql(sql: str) -> str:
    """Trailing whitespace and semicolons removed (a FORMAT clause is appended)."""
    return sql.strip().rstrip(";").rstrip()


def dedup_settings(token: str | None) -> dict[str, Any]:
    if not token:
        return {}
    return {"insert_deduplicate": 1, "insert_deduplication_token": token}


class ParamText:
    """A ``{name:Type}`` value in ClickHouse's text form, as ``clickhouse-client
    --param_name`` takes it (``['a','b']`` for an Array): sent as it is on every path.
    A plain ``str`` is data, escaped by the client (clickhouse-connect) and by the
    embedded backend alike."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text

    def __str__(self) -> str:  # clickhouse-connect sends a value it does not know as str()
        return self.text

    def __repr__(self) -> str:
        return f"ParamText({self.text!r})"


@runtime_checkable
class Store(Protocol):
    """What the sink, the migrations and the CLIs need from ClickHouse."""

    backend: str
    database: str

    def command(self, sql: str, params: Mapping[str, Any] | None = None) -> None:
        """Run a statement that returns nothing (DDL, ALTER, INSERT ... SELECT)."""
        ...

    def query(self, sql: str, params: Mapping[str, Any] | None = None) -> Result:
        """Run a SELECT; ``{name:Type}`` placeholders are bound from ``params``."""
        ...

    def insert(
        self,
        table: str,
        columns: Sequence[str],
        rows: Sequence[Sequence[Any]],
        token: str | None = None,
    ) -> int:
        """Insert rows (one atomic block); ``token`` deduplicates a repeated insert."""
        ...

    def close(self) -> None: ...

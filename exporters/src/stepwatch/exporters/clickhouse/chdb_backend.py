"""The embedded backend: the ClickHouse engine in this process (chdb).

chdb keeps one embedded server per process, bound to one database path; a
second process opening the same path fails to lock it. So exactly one process
owns a path (the sink, or ``stepwatch db serve``) and every other reader goes
through the owner's query endpoint (:mod:`stepwatch.exporters.clickhouse.service`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from clickhouse_connect.driver.binding import format_bind_value

from stepwatch.errors import StoreError, StoreLockedError
from stepwatch.exporters.clickhouse.permissions import private_umask, secure_store_dir
from stepwatch.exporters.clickhouse.store import (
    OUTPUT_SETTINGS,
    ClickHouseError,
    Result,
    dedup_settings,
    encode_rows,
    error_from,
    parse_json_compact,
    strip_sql,
)

log = logging.getLogger(__name__)

_LOCKED_HINT = (
    "another process owns this store (a running `stepwatch db sink` or `db serve`?); "
    "readers reach it through its endpoint file, writers must stop it first"
)


USER_FILES_DIR = "user_files"

# The engine's caches, bounded for a process that is a sink first: the server
# defaults (5 GiB each for marks, index marks and primary indexes, capped at
# half the RAM) suit a dedicated ClickHouse host, not an embedded store whose
# owner also serves dashboards from the same heap. The ingest path itself
# fills none of them (docs/streams.md, the soak); reads through the endpoint do.
CACHE_LIMITS: dict[str, int] = {
    "mark_cache_size": 256 << 20,
    "index_mark_cache_size": 64 << 20,
    "primary_index_cache_size": 64 << 20,
    "query_condition_cache_size": 64 << 20,
}


def connection_string(path: str) -> str:
    """The engine's connection string for ``path``: user files inside the store, caches bounded.

    ClickHouse resolves ``file()``-style relative paths and ``INTO OUTFILE``
    under ``user_files_path``; the engine's default is a system directory. The
    endpoint refuses those functions outright (see ``guard``); this keeps the
    engine's own default inside the store as a second line.
    """
    user_files = os.path.join(path, USER_FILES_DIR)
    if os.path.isdir(path):
        with contextlib.suppress(OSError):  # a reader without write access: the engine copes
            os.makedirs(user_files, mode=0o700, exist_ok=True)
    limits = "".join(f"&{name}={value}" for name, value in CACHE_LIMITS.items())
    return f"{path}?user_files_path={user_files}{limits}"


def _open_session(path: str) -> Any:
    private_umask()  # the engine writes parts from now on: owner-only
    try:
        from chdb import session
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise StoreError("the embedded store needs chdb: pip install 'stepwatch[dev]'") from err
    try:
        return session.Session(connection_string(path))
    except Exception as err:
        text = str(err)
        if "Cannot lock file" in text or "another server instance" in text.lower():
            raise StoreLockedError(f"store {path}: {_LOCKED_HINT}") from err
        if "already initialized with path" in text:
            raise StoreError(
                f"store {path}: this process already has another chdb path open "
                "(chdb allows one path per process; close that store first)"
            ) from err
        raise StoreError(f"cannot open store {path}: {text.splitlines()[0]}") from err


class ChdbStore:
    """A :class:`~stepwatch.exporters.clickhouse.store.Store` on an embedded chdb database."""

    backend = "chdb"

    def __init__(self, path: str, database: str = "stepwatch", *, readonly: bool = False):
        self.path = os.path.abspath(path)
        self.database = database
        self.readonly = readonly
        self._lock = threading.Lock()  # a chdb connection runs one statement at a time
        if not readonly:
            secure_store_dir(self.path, create=True)
        elif not os.path.isdir(os.path.join(self.path, "metadata")):
            # not even the engine's own folders: opening it would write them (a reader
            # pointed at another directory left tmp/ and user_files/ in it)
            raise StoreError(f"no store at {self.path}: run `stepwatch db migrate` first")
        self._session = _open_session(self.path)
        try:
            self._prepare()
        except StoreError:
            self.close()
            raise

    def _prepare(self) -> None:
        if not self.readonly:
            self._raw(f"CREATE DATABASE IF NOT EXISTS `{self.database}`")
        try:
            self._raw(f"USE `{self.database}`")
        except ClickHouseError as err:
            raise StoreError(
                f"store {self.path} has no database {self.database!r}: run `stepwatch db migrate`"
            ) from err
        for name, value in OUTPUT_SETTINGS.items():
            self._raw(f"SET {name} = {value}")
        if self.readonly:
            self._raw("SET readonly = 2")

    def _raw(self, sql: str, fmt: str = "CSV", params: Mapping[str, Any] | None = None) -> Any:
        with self._lock:
            if self._session is None:
                raise StoreError(f"store {self.path} is closed")
            try:
                return self._session.query(sql, fmt, params=_bound(params) if params else None)
            except Exception as err:
                raise error_from(err, "chdb") from err

    def command(self, sql: str, params: Mapping[str, Any] | None = None) -> None:
        self._raw(strip_sql(sql), "CSV", params)

    def query(self, sql: str, params: Mapping[str, Any] | None = None) -> Result:
        out = self._raw(strip_sql(sql), "JSONCompact", params)
        return parse_json_compact(out.bytes())

    def insert(
        self,
        table: str,
        columns: Sequence[str],
        rows: Sequence[Sequence[Any]],
        token: str | None = None,
    ) -> int:
        if not rows:
            return 0
        settings = dedup_settings(token)
        clause = ""
        if settings:
            clause = " SETTINGS " + ", ".join(f"{k} = {_literal(v)}" for k, v in settings.items())
        cols = ", ".join(f"`{c}`" for c in columns)
        sql = f"INSERT INTO `{self.database}`.`{table}` ({cols}){clause}"
        data = encode_rows(rows)
        with self._lock:
            if self._session is None:
                raise StoreError(f"store {self.path} is closed")
            try:
                insert_data(self._session, sql, "JSONCompactEachRow", data)
            except Exception as err:
                raise error_from(err, f"insert into {table}") from err
        return len(rows)

    def close(self) -> None:
        with self._lock:
            session, self._session = self._session, None
        if session is not None:
            session.close()

    def __enter__(self) -> ChdbStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def insert_data(session: Any, head: str, fmt: str, data: bytes) -> Any:
    """``INSERT ... FORMAT fmt`` with ``data``, as one statement whose errors are raised.

    Not ``session.send_insert``: its ``finish()`` raises a parse error only; one raised
    while the block is written (a full disk, more than 100 partitions in one block, a
    CHECK constraint, a materialized view) was dropped and the insert reported whole,
    so the sink committed rows the store never held. The data follows the ``FORMAT``
    clause and is read by the format's parser, not the SQL parser (nor counted in
    ``max_query_size``)."""
    return session.query(f"{head} FORMAT {fmt}\n".encode() + data, "TSVRaw")


def _literal(value: Any) -> str:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    return "'" + str(value).replace("\\", "\\\\").replace("'", "\\'") + "'"


def _bound(params: Mapping[str, Any]) -> dict[str, str]:
    """Parameters in the text clickhouse-connect sends for them (``param_x=text``: a string
    escaped, a list as an Array literal, a :class:`ParamText` as it is), so that a value
    binds the same here and through a client."""
    return {k: format_bind_value(v) for k, v in params.items()}

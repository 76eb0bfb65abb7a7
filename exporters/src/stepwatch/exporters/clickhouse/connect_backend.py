"""The server backend: a ClickHouse server over HTTP(S) with clickhouse-connect.

``Settings.clickhouse_url`` picks it (``https://`` for TLS, user and password
from the settings or the URL). The same class talks to the query endpoint an
embedded store's owner serves on loopback (:mod:`stepwatch.exporters.clickhouse.service`),
which speaks the subset of ClickHouse's HTTP interface this client uses.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from stepwatch.errors import ConfigError, StoreError
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

_TRUE = {"1", "true", "yes", "on"}


def client_args(url: str, user: str = "", password: str = "") -> dict[str, Any]:
    """Keyword arguments for ``clickhouse_connect.get_client`` from a URL.

    ``http://host:8123`` or ``https://host:8443`` (TLS); ``user:password@`` in
    the URL is used when ``user``/``password`` are not given; a path is kept as
    a proxy path; ``?verify=false`` and ``?ca_cert=PATH`` tune TLS checks.
    """
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"clickhouse_url must be http(s)://host[:port], got {url!r}")
    secure = parts.scheme == "https"
    args: dict[str, Any] = {
        "host": parts.hostname,
        "port": parts.port or (8443 if secure else 8123),
        "interface": parts.scheme,
        "secure": secure,
        "username": user or unquote(parts.username or "") or "default",
        "password": password or unquote(parts.password or ""),
        "autogenerate_session_id": False,  # the sink and the endpoint share clients across threads
        "connect_timeout": 10,
        "send_receive_timeout": 300,
        "query_retries": 0,  # the sink retries with its own backoff and dedup token
    }
    if parts.path and parts.path != "/":
        args["proxy_path"] = parts.path.rstrip("/")
    query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    if "verify" in query:
        args["verify"] = query["verify"].lower() in _TRUE
    if "ca_cert" in query:
        args["ca_cert"] = query["ca_cert"]
    return args


def _wrap(err: Exception, what: str) -> ClickHouseError:
    from clickhouse_connect.driver.exceptions import DatabaseError, OperationalError

    if isinstance(err, OperationalError):
        return ClickHouseError(f"{what}: {err}".splitlines()[0], data_error=False)
    if isinstance(err, DatabaseError):
        return error_from(err, what)
    return ClickHouseError(f"{what}: {err}".splitlines()[0], data_error=False)


class ClickHouseConnectStore:
    """A :class:`~stepwatch.exporters.clickhouse.store.Store` on a ClickHouse server."""

    backend = "clickhouse-connect"

    def __init__(
        self,
        url: str,
        user: str = "",
        password: str = "",
        database: str = "stepwatch",
        *,
        create_database: bool = True,
        settings: Mapping[str, Any] | None = None,
    ):
        self.url = url
        self.database = database
        try:
            import clickhouse_connect
        except ImportError as err:  # pragma: no cover - depends on the environment
            raise StoreError(
                "the server store needs clickhouse-connect: pip install 'stepwatch[store]'"
            ) from err
        args = client_args(url, user, password)
        if settings:
            args["settings"] = dict(settings)  # sent with every query of this client
        try:
            self._client: Any = clickhouse_connect.get_client(**args)
        except Exception as err:
            raise StoreError(
                f"cannot connect to ClickHouse at {_safe(url)}: {_first(err)}"
            ) from err
        if create_database:
            self.command(f"CREATE DATABASE IF NOT EXISTS `{database}`")
        self._client.database = database

    def command(self, sql: str, params: Mapping[str, Any] | None = None) -> None:
        try:
            self._client.command(strip_sql(sql), parameters=dict(params) if params else None)
        except Exception as err:
            raise _wrap(err, "clickhouse") from err

    def query(self, sql: str, params: Mapping[str, Any] | None = None) -> Result:
        try:
            body = self._client.raw_query(
                strip_sql(sql),
                parameters=dict(params) if params else None,
                settings=dict(OUTPUT_SETTINGS),
                fmt="JSONCompact",
            )
        except Exception as err:
            raise _wrap(err, "clickhouse") from err
        return parse_json_compact(body)

    def insert(
        self,
        table: str,
        columns: Sequence[str],
        rows: Sequence[Sequence[Any]],
        token: str | None = None,
    ) -> int:
        if not rows:
            return 0
        try:
            self._client.raw_insert(
                table,
                column_names=list(columns),
                insert_block=encode_rows(rows),
                settings=dedup_settings(token) or None,
                fmt="JSONCompactEachRow",
            )
        except Exception as err:
            raise _wrap(err, f"insert into {table}") from err
        return len(rows)

    def ping(self) -> bool:
        try:
            return bool(self._client.ping())
        except Exception:
            return False

    def close(self) -> None:
        try:
            self._client.close()
        except Exception:  # closing a pool never matters to the caller
            pass

    def __enter__(self) -> ClickHouseConnectStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _first(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def _safe(url: str) -> str:
    """The URL without credentials, for messages."""
    parts = urlsplit(url)
    netloc = parts.hostname or ""
    if parts.port:
        netloc += f":{parts.port}"
    return f"{parts.scheme}://{netloc}{parts.path}"

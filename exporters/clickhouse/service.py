"""The owner's query endpoint: ClickHouse's HTTP interface over the embedded store.

Only one process can open a chdb database path. The process that owns it (the
sink, or ``stepwatch db serve``) runs this endpoint on loopback and writes an
*endpoint file* next to the store (``<store_path>.endpoint.json``, mode 0600)
with its URL and a random password. Readers (``stepwatch sql``, ``stepwatch
query``, reports) find the file, check the owner is alive, and connect with
clickhouse-connect exactly as they would to a ClickHouse server; with no live
owner they open the path themselves.

The endpoint speaks the subset of ClickHouse's HTTP interface that
clickhouse-connect (and curl) use: ``GET /ping``; ``GET``/``POST /`` with
``query``, ``database``, ``default_format``, ``param_<name>`` and settings in
the URL, the statement or insert data in the body, compressed bodies
(gzip, deflate, lz4, zstd), ClickHouse-style errors. Every request runs in its
own chdb session on the owner's path; read-only (``readonly=2``) unless the
service was started with ``allow_writes``.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import os
import secrets
import threading
import time
import zlib
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from stepwatch.errors import StoreError
from stepwatch.exporters.clickhouse.chdb_backend import _open_session
from stepwatch.exporters.clickhouse.store import error_from

log = logging.getLogger(__name__)

USER = "stepwatch"
_NOT_SETTINGS = frozenset({
    "query", "database", "default_format", "user", "password", "quota_key", "query_id",
    "session_id", "session_timeout", "session_check", "compress", "decompress", "buffer_size",
    "wait_end_of_query", "client_protocol_version", "readonly", "enable_http_compression",
    "send_progress_in_http_headers", "http_headers_progress_interval_ms",
})
_CONTENT_TYPES = {"JSON": "application/json", "JSONCompact": "application/json"}


def endpoint_path(store_path: str) -> Path:
    path = Path(os.path.abspath(store_path))
    return path.with_name(path.name + ".endpoint.json")


@dataclass(frozen=True)
class Endpoint:
    """How to reach the process that owns an embedded store."""

    url: str
    user: str
    password: str
    database: str
    pid: int
    readonly: bool = True

    @classmethod
    def read(cls, path: Path) -> Endpoint | None:
        """The endpoint in ``path`` when its owner is alive; None otherwise."""
        try:
            data = json.loads(path.read_text())
            endpoint = cls(**data)
        except (OSError, ValueError, TypeError):
            return None
        return endpoint if _alive(endpoint.pid) else None

    def write(self, path: Path) -> None:
        tmp = path.with_name(path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(asdict(self), f)
        os.replace(tmp, path)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class QueryService:
    """A loopback ClickHouse-HTTP endpoint over one chdb path, in this process."""

    def __init__(
        self,
        path: str,
        database: str = "stepwatch",
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        allow_writes: bool = False,
        endpoint_file: Path | None = None,
        password: str | None = None,
    ) -> None:
        self.path = os.path.abspath(path)
        self.database = database
        self.allow_writes = allow_writes
        self.password = password or secrets.token_urlsafe(24)
        self.endpoint_file = endpoint_file
        self.requests = 0
        self.errors = 0
        handler = type("Handler", (_Handler,), {"service": self})
        self._server = ThreadingHTTPServer((host, port), handler)
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        host = host.decode() if isinstance(host, bytes) else str(host)
        return f"http://{host}:{port}"

    @property
    def endpoint(self) -> Endpoint:
        return Endpoint(self.url, USER, self.password, self.database, os.getpid(), not self.allow_writes)

    def start(self) -> QueryService:
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.1,),
                                        name="store-endpoint", daemon=True)
        self._thread.start()
        if self.endpoint_file is not None:
            self.endpoint.write(self.endpoint_file)
        log.info("store endpoint ready url=%s path=%s writes=%s", self.url, self.path, self.allow_writes)
        return self

    def stop(self) -> None:
        if self.endpoint_file is not None:
            with contextlib.suppress(OSError):
                if Endpoint.read(self.endpoint_file) in (None, self.endpoint):
                    self.endpoint_file.unlink()
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        log.info("store endpoint stopped url=%s requests=%d errors=%d", self.url, self.requests, self.errors)

    def __enter__(self) -> QueryService:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ execution
    def execute(self, sql: str, params: dict[str, str], settings: dict[str, str],
                database: str, fmt: str) -> tuple[bytes, dict[str, int]]:
        with self._session() as session:
            session.query(f"USE `{database}`")
            for name, value in settings.items():
                session.query(f"SET {name} = {_quote(value)}")
            if not self.allow_writes:
                session.query("SET readonly = 2")
            result = session.query(sql, fmt, params=params or None)
            summary = {"read_rows": int(result.rows_read()), "written_rows": int(result.rows_written())}
            return result.bytes() or b"", summary

    @contextlib.contextmanager
    def _session(self) -> Iterator[Any]:
        session = _open_session(self.path)
        try:
            yield session
        finally:
            session.close()


def _quote(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _decompress(body: bytes, encoding: str) -> bytes:
    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        return body
    if encoding == "gzip":
        return zlib.decompress(body, 16 + zlib.MAX_WBITS)
    if encoding == "deflate":
        return zlib.decompress(body)
    if encoding == "lz4":
        import lz4.frame

        return bytes(lz4.frame.decompress(body))
    if encoding == "zstd":
        from backports import zstd

        return bytes(zstd.decompress(body))
    raise StoreError(f"unsupported Content-Encoding {encoding!r}")


class _Handler(BaseHTTPRequestHandler):
    service: QueryService
    protocol_version = "HTTP/1.1"
    server_version = "stepwatch-store"

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("endpoint " + format, *args)

    def do_GET(self) -> None:
        if urlsplit(self.path).path.rstrip("/") == "/ping":
            self._reply(200, b"Ok.\n")
            return
        self._handle(b"")

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        try:
            body = _decompress(body, self.headers.get("Content-Encoding", ""))
        except Exception as err:
            self._error(400, 0, f"Cannot decompress request body: {err}")
            return
        self._handle(body)

    def _authorized(self, url_params: dict[str, str]) -> bool:
        user = self.headers.get("X-ClickHouse-User") or url_params.get("user")
        key = self.headers.get("X-ClickHouse-Key") or url_params.get("password")
        auth = self.headers.get("Authorization", "")
        if auth.lower().startswith("basic "):
            with contextlib.suppress(ValueError):
                user, _, key = base64.b64decode(auth[6:]).decode().partition(":")
        return user == USER and secrets.compare_digest(key or "", self.service.password)

    def _handle(self, body: bytes) -> None:
        service = self.service
        service.requests += 1
        url_params = dict(parse_qsl(urlsplit(self.path).query, keep_blank_values=True))
        if not self._authorized(url_params):
            self._error(403, 516, f"{USER}: Authentication failed: password is incorrect. (AUTHENTICATION_FAILED)")
            return
        sql = url_params.get("query", "")
        text = body.decode("utf-8", errors="replace")
        sql = f"{sql}\n{text}" if sql and text else (sql or text)
        if not sql.strip():
            self._error(400, 62, "Empty query. (SYNTAX_ERROR)")
            return
        params = {k[6:]: v for k, v in url_params.items() if k.startswith("param_")}
        settings = {
            k: v for k, v in url_params.items() if k not in _NOT_SETTINGS and not k.startswith("param_")
        }
        fmt = url_params.get("default_format") or "TabSeparated"
        database = url_params.get("database") or "default"
        started = time.perf_counter()
        try:
            out, summary = service.execute(sql, params, settings, database, fmt)
        except StoreError as err:
            service.errors += 1
            self._error(500, 0, str(err))
            return
        except Exception as err:
            service.errors += 1
            wrapped = error_from(err, "endpoint")
            self._error(500, wrapped.code or 0, str(err).strip())
            return
        summary["elapsed_ns"] = int((time.perf_counter() - started) * 1e9)
        self._reply(200, out, {
            "X-ClickHouse-Format": fmt,
            "X-ClickHouse-Summary": json.dumps({k: str(v) for k, v in summary.items()}),
        }, _CONTENT_TYPES.get(fmt, "text/plain; charset=UTF-8"))

    def _error(self, status: int, code: int, message: str) -> None:
        text = message if message.startswith("Code:") else f"Code: {code}. DB::Exception: {message}"
        self._reply(status, (text + "\n").encode(), {"X-ClickHouse-Exception-Code": str(code)})

    def _reply(self, status: int, body: bytes, headers: dict[str, str] | None = None,
               content_type: str = "text/plain; charset=UTF-8") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("X-ClickHouse-Timezone", "UTC")
        self.send_header("X-ClickHouse-Server-Display-Name", "stepwatch")
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

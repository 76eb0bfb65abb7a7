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
own chdb session on the owner's path; read-only (``readonly=2``, set before
anything the request names) unless the service was started with ``allow_writes``.

Nothing a request sends is put into SQL as it came: the statement is parsed by
the engine and checked (one statement; reads only on the read-only endpoint;
no table function, engine, format or setting that reaches files, hosts or the
process: :mod:`stepwatch.exporters.clickhouse.guard`), the database, setting
and format names are checked against the engine's own lists, values travel as
escaped literals, INSERT data goes to the engine as data, and bodies are size-
and decompression-bounded (:mod:`stepwatch.exporters.clickhouse.http_body`).
Refusals answer 4xx with a ClickHouse-style message.
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
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from http import HTTPStatus
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from stepwatch.errors import StoreError
from stepwatch.exporters.clickhouse.chdb_backend import _open_session
from stepwatch.exporters.clickhouse.endpoint_request import (
    Request,
    capped,
    leading_word,
    lex_view,
    parse_request,
    utf8,
)
from stepwatch.exporters.clickhouse.guard import (
    DEFAULT_MAX_QUERY_SIZE,
    Catalog,
    Guard,
    Refused,
    identifier,
    literal,
    status_of,
)
from stepwatch.exporters.clickhouse.http_body import (
    DEFAULT_MAX_BODY,
    DEFAULT_MAX_DECOMPRESSED,
    content_length,
    decompress,
)
from stepwatch.exporters.clickhouse.permissions import secure_store_dir
from stepwatch.exporters.clickhouse.sqltext import (
    insert_data_offset,
    skip_data_separator,
)
from stepwatch.exporters.clickhouse.store import error_from
from stepwatch.httpd import BoundedHTTPServer, DeadlineHandler

MAX_STATEMENT_BYTES = 4 * DEFAULT_MAX_QUERY_SIZE  # 1 MiB of statement text
log = logging.getLogger(__name__)

USER = "stepwatch"
DEFAULT_MAX_EXECUTION_TIME = 300.0  # seconds a statement may run
DEFAULT_MAX_RESULT_BYTES = 1 << 30  # a reply is held in memory before it is sent
DEFAULT_MAX_MEMORY_USAGE = 8 << 30  # memory one statement may take in the owner's process
DEFAULT_MAX_CONCURRENT = 2  # statements running at once; more wait, then get 503
DEFAULT_QUEUE_SECONDS = 5.0  # how long an excess statement waits for a slot
SLEEP_PER_BLOCK_US = 3_000_000  # the engine's default bound on sleep() per block
PURGE_AFTER_IDLE_SECONDS = 1.0  # idle this long: the engine's freed memory goes back to the system
_CONTENT_TYPES = {"JSON": "application/json", "JSONCompact": "application/json"}


def per_query_memory(per_query: int, concurrent: int, total: int) -> int:
    """``max_memory_usage`` of one statement so that ``concurrent`` of them fit in ``total``."""
    if total <= 0:
        return per_query
    return max(1, min(per_query, total // max(1, concurrent)))


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
        max_body_bytes: int = DEFAULT_MAX_BODY,
        max_decompressed_bytes: int = DEFAULT_MAX_DECOMPRESSED,
        max_execution_time: float = DEFAULT_MAX_EXECUTION_TIME,
        max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES,
        max_memory_usage: int = DEFAULT_MAX_MEMORY_USAGE,
        max_concurrent_queries: int = DEFAULT_MAX_CONCURRENT,
        max_total_memory: int = 0,
        queue_seconds: float = DEFAULT_QUEUE_SECONDS,
    ) -> None:
        self.path = os.path.abspath(path)
        secure_store_dir(self.path, create=False)
        self.database = database
        self.allow_writes = allow_writes
        self.password = password or secrets.token_urlsafe(24)
        self.endpoint_file = endpoint_file
        self.max_body_bytes = max_body_bytes
        self.max_decompressed_bytes = max_decompressed_bytes
        self.limits: dict[str, float] = {
            "max_execution_time": max_execution_time,
            "max_result_bytes": max_result_bytes,
            "max_memory_usage": per_query_memory(
                max_memory_usage, max_concurrent_queries, max_total_memory
            ),
        }
        # what a statement may spill to the store's disk (a GROUP BY or sort over
        # max_bytes_before_external_*): no more than its memory, so a reader cannot fill
        # the disk the sink writes to
        self.limits["max_temporary_data_on_disk_size_for_query"] = self.limits["max_memory_usage"]
        # a statement's text: 4x the engine's default (long legitimate reads, such as a
        # dashboard's regex of many hosts, fit); a client may ask for less, not more
        self.limits["max_query_size"] = MAX_STATEMENT_BYTES
        self.limits["max_threads"] = os.cpu_count() or 1
        self.limits["function_sleep_max_microseconds_per_block"] = SLEEP_PER_BLOCK_US
        if max_total_memory > 0:  # the engine's own bound over all statements running at once
            self.limits["max_memory_usage_for_user"] = max_total_memory
        self.max_concurrent = max(1, max_concurrent_queries)
        self.queue_seconds = queue_seconds
        self._slots = threading.BoundedSemaphore(self.max_concurrent)
        self._running = 0
        self._purging = False
        self._stopped = False
        self.purges = 0  # times the store was opened to give freed memory back
        self._purge_timer: threading.Timer | None = None
        self._running_lock = threading.Lock()
        self.requests = 0
        self.errors = 0
        self._guard_lock = threading.Lock()
        self._guard_cached: Guard | None = None
        handler = type("Handler", (_Handler,), {"service": self})
        self._server = BoundedHTTPServer((host, port), handler)
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        host = host.decode() if isinstance(host, bytes) else str(host)
        return f"http://{host}:{port}"

    @property
    def endpoint(self) -> Endpoint:
        return Endpoint(
            self.url, USER, self.password, self.database, os.getpid(), not self.allow_writes
        )

    def start(self) -> QueryService:
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.1,), name="store-endpoint", daemon=True
        )
        self._thread.start()
        if self.endpoint_file is not None:
            self.endpoint.write(self.endpoint_file)
        log.info(
            "store endpoint ready url=%s path=%s writes=%s", self.url, self.path, self.allow_writes
        )
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
        with self._running_lock:  # no purge may open the store after the endpoint stopped
            self._stopped = True
            timer, self._purge_timer = self._purge_timer, None
        if timer is not None:
            timer.cancel()
            if timer.is_alive():
                timer.join(timeout=5)
        log.info(
            "store endpoint stopped url=%s requests=%d errors=%d",
            self.url,
            self.requests,
            self.errors,
        )

    def __enter__(self) -> QueryService:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ execution
    def execute(self, request: Request) -> tuple[bytes, dict[str, int]]:
        """Run ``request`` in one of the ``max_concurrent`` slots; 503 when none frees in time."""
        if not self._slots.acquire(timeout=self.queue_seconds):
            raise Refused(
                f"Too many simultaneous queries. Maximum: {self.max_concurrent}; none "
                f"finished within {self.queue_seconds:g} s, retry later. "
                "(TOO_MANY_SIMULTANEOUS_QUERIES)",
                202,
                HTTPStatus.SERVICE_UNAVAILABLE,
            )
        with self._running_lock:
            self._running += 1
        try:
            return self._execute(request)
        finally:
            with self._running_lock:
                self._running -= 1
                idle = self._running == 0 and not self._purging
                self._purging = self._purging or idle
            self._slots.release()
            if idle:  # the engine's allocator keeps freed memory: give it back, once idle
                timer = threading.Timer(PURGE_AFTER_IDLE_SECONDS, self._purge)
                timer.daemon = True
                with self._running_lock:
                    start = not self._stopped
                    if start:
                        self._purge_timer = timer
                if start:
                    timer.start()

    def _purge(self) -> None:
        """Return the allocator's freed memory to the system (at most once a second)."""
        try:
            with self._running_lock:
                if self._running or self._stopped:
                    return  # busy again (the last statement to finish schedules the next purge)
                # or stopped: the store may be closed, and must not be opened again
            with self._session() as session:
                self.purges += 1
                session.query("SYSTEM JEMALLOC PURGE")
        except Exception as err:  # an engine built without jemalloc: nothing to give back
            log.debug("allocator purge failed error=%r", err)
        finally:
            with self._running_lock:
                self._purging = False

    def _execute(self, request: Request) -> tuple[bytes, dict[str, int]]:
        """Run the one checked statement of ``request``; Refused or an engine error otherwise."""
        guard = self._guard()
        with self._session() as session:
            if not self.allow_writes:
                session.query("SET readonly = 2")
            session.query(f"USE {identifier(guard.database(session, request.database))}")
            fmt = guard.output_format(request.fmt)
            settings = {guard.setting(name): value for name, value in request.settings.items()}
            for name, cap in self.limits.items():
                settings[name] = capped(name, settings.get(name), cap)
            # the limits bind the checks' own statements too: the engine parses the text in
            # formatQuerySingleLine, and before, a 20 MB SELECT of one array (19 KB gzipped)
            # took the owner from 0.4 to 4 GB and two minutes there, before any limit was set
            _apply(session, {name: settings[name] for name in self.limits})
            full = request.text()
            offset = insert_data_offset(lex_view(full)) if leading_word(full) == "INSERT" else None
            if offset is not None:
                return self._insert(session, guard, request, full, offset, settings)
            stmt = guard.statement(session, utf8(full), request.params, _size(settings))
            _apply(session, settings)
            result = session.query(stmt.text, fmt, params=request.params or None)
            summary = {
                "read_rows": int(result.rows_read()),
                "written_rows": int(result.rows_written()),
            }
            return result.bytes() or b"", summary

    @staticmethod
    def _insert(
        session: Any,
        guard: Guard,
        request: Request,
        full: bytes,
        offset: int,
        settings: dict[str, str],
    ) -> tuple[bytes, dict[str, int]]:
        """``INSERT ... FORMAT x``: the statement is checked; its data never reaches the
        SQL parser."""
        stmt = guard.statement(session, utf8(full[:offset]), request.params, _size(settings))
        fmt = stmt.insert_format
        if fmt is None:
            raise Refused("INSERT without a FORMAT clause takes no data. (SYNTAX_ERROR)", 62)
        guard.output_format(fmt)
        _apply(session, settings)
        for name in (
            "input_format_values_interpret_expressions",
            "input_format_values_deduce_templates_of_expressions",
        ):
            session.query(f"SET {name} = 0")
        # chdb's streaming insert: the data goes to the format's parser alone. Not
        # insert_data (one query text): its multi-statement parser would run a statement
        # written after a Values row (``('x'); DROP TABLE t``) as a second one. The cost: an
        # error raised once the block is written (a full disk) is not reported here.
        inserter = session.send_insert(stmt.insert_head, fmt)
        data = skip_data_separator(full[offset:])
        if data:
            inserter.append(data)
        result = inserter.finish()
        return b"", {"read_rows": 0, "written_rows": int(result.rows_written)}

    def _guard(self) -> Guard:
        with self._guard_lock:
            if self._guard_cached is None:
                with self._session() as session:
                    self._guard_cached = Guard(
                        Catalog.load(session), readonly=not self.allow_writes, caps=self.limits
                    )
            return self._guard_cached

    @contextlib.contextmanager
    def _session(self) -> Iterator[Any]:
        session = _open_session(self.path)
        try:
            yield session
        finally:
            session.close()


def _size(settings: dict[str, str]) -> int:
    """The request's ``max_query_size``, as capped (a whole number of bytes)."""
    return int(float(settings["max_query_size"]))


def _apply(session: Any, settings: dict[str, str]) -> None:
    for name, value in settings.items():  # names checked against system.settings
        session.query(f"SET {name} = {literal(value)}")


class _Handler(DeadlineHandler):
    service: QueryService
    protocol_version = "HTTP/1.1"
    server_version = "stepwatch-store"
    idle_seconds = 60.0  # seconds a connection may sit idle (and a reply's writes may take)
    request_seconds = 120.0  # to send a whole request, however slowly (bodies up to 64 MiB)
    disable_nagle_algorithm = (
        True  # headers and body go out in two writes: no 40 ms delayed-ACK stall
    )

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("endpoint " + format, *args)

    def do_GET(self) -> None:
        if urlsplit(self.path).path.rstrip("/") == "/ping":
            self._reply(200, b"Ok.\n")
            return
        self._serve(with_body=False)

    def do_POST(self) -> None:
        self._serve(with_body=True)

    def _serve(self, *, with_body: bool) -> None:
        service = self.service
        service.requests += 1
        url_params = dict(parse_qsl(urlsplit(self.path).query, keep_blank_values=True))
        try:
            if not self._authorized(url_params):
                raise Refused(
                    f"{USER}: Authentication failed: password is incorrect. "
                    "(AUTHENTICATION_FAILED)",
                    516,
                    HTTPStatus.FORBIDDEN,
                )
            body = self._body(with_body)
            request = parse_request(url_params, body)
            started = time.perf_counter()
            out, summary = service.execute(request)
        except Refused as err:
            service.errors += 1
            log.info("endpoint refused status=%d code=%d reason=%s", err.status, err.code, err)
            self._error(int(err.status), err.code, str(err))
            return
        except StoreError as err:
            service.errors += 1
            self._error(500, 0, str(err))
            return
        except Exception as err:
            service.errors += 1
            wrapped = error_from(err, "endpoint")
            self._error(status_of(wrapped.code), wrapped.code or 0, str(err).strip())
            return
        summary["elapsed_ns"] = int((time.perf_counter() - started) * 1e9)
        self._reply(
            200,
            out,
            {
                "X-ClickHouse-Format": request.fmt,
                "X-ClickHouse-Summary": json.dumps({k: str(v) for k, v in summary.items()}),
            },
            _CONTENT_TYPES.get(request.fmt, "text/plain; charset=UTF-8"),
        )

    def _body(self, with_body: bool) -> bytes:
        """The request body, within the limits, decompressed; the connection closes on refusal."""
        if not with_body:
            return b""
        self.close_connection = True  # until the body has been read in full
        length = content_length(self.headers, self.service.max_body_bytes)
        try:
            body = self.rfile.read(length) if length else b""
        except OSError as err:  # the client stalled past ``timeout`` or went away
            raise Refused(
                f"Request body not received: {err}.", 0, HTTPStatus.REQUEST_TIMEOUT
            ) from err
        if len(body) != length:
            raise Refused(f"Request body ended after {len(body)} of {length} bytes.", 0)
        self.close_connection = False
        return decompress(
            body, self.headers.get("Content-Encoding", ""), self.service.max_decompressed_bytes
        )

    def _authorized(self, url_params: dict[str, str]) -> bool:
        user = self.headers.get("X-ClickHouse-User") or url_params.get("user")
        key = self.headers.get("X-ClickHouse-Key") or url_params.get("password")
        auth = self.headers.get("Authorization", "")
        if auth.lower().startswith("basic "):
            with contextlib.suppress(ValueError):
                user, _, key = base64.b64decode(auth[6:]).decode().partition(":")
        return user == USER and secrets.compare_digest(
            (key or "").encode(), self.service.password.encode()
        )

    def _error(self, status: int, code: int, message: str) -> None:
        text = message if message.startswith("Code:") else f"Code: {code}. DB::Exception: {message}"
        self._reply(status, (text + "\n").encode(), {"X-ClickHouse-Exception-Code": str(code)})

    def _reply(
        self,
        status: int,
        body: bytes,
        headers: dict[str, str] | None = None,
        content_type: str = "text/plain; charset=UTF-8",
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("X-ClickHouse-Timezone", "UTC")
        self.send_header("X-ClickHouse-Server-Display-Name", "stepwatch")
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

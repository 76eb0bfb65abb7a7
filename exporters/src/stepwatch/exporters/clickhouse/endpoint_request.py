"""One request to the store endpoint: what it asks for, and what an engine error answers.

ClickHouse's HTTP rules, in the endpoint's terms: the URL's ``query`` is the
start of the statement and the body the rest (or an INSERT's data); URL
parameters other than the protocol's own are settings, ``param_*`` are query
parameters; engine errors map to HTTP statuses as ClickHouse maps them.
"""

from __future__ import annotations

from dataclasses import dataclass

from stepwatch.exporters.clickhouse.guard import MIN_SECONDS, TIME_SETTINGS, Refused
from stepwatch.exporters.clickhouse.sqltext import LexError, first_word

_NOT_SETTINGS = frozenset(
    {
        "query",
        "database",
        "default_format",
        "user",
        "password",
        "quota_key",
        "query_id",
        "session_id",
        "session_timeout",
        "session_check",
        "compress",
        "decompress",
        "buffer_size",
        "wait_end_of_query",
        "client_protocol_version",
        "enable_http_compression",
        "send_progress_in_http_headers",
        "http_headers_progress_interval_ms",
    }
)


@dataclass(frozen=True)
class Request:
    """What one HTTP request asks the endpoint to run."""

    query: str  # the URL's query parameter: the start of the statement
    body: bytes  # the rest of the statement, or an INSERT's data
    params: dict[str, str]
    settings: dict[str, str]
    database: str
    fmt: str

    def text(self) -> bytes:
        """ClickHouse's rule: the URL's query, a line break, then the body."""
        if self.query and self.body:
            return self.query.encode() + b"\n" + self.body
        return self.query.encode() or self.body


def capped(name: str, value: str | None, cap: float) -> str:
    """A per-query limit: the client's when it is lower than the endpoint's (0 means none).

    Never a value the engine would read as 0, which to it means no limit at all: a whole
    setting is at least 1, a time at least :data:`MIN_SECONDS`."""
    try:
        asked = float(value) if value is not None else cap
    except ValueError as err:
        raise Refused(f"Bad {name} {str(value)[:32]!r}. (CANNOT_PARSE_NUMBER)", 27) from err
    limit = min(asked, cap) if asked > 0 else cap
    if name in TIME_SETTINGS:  # under 1 µs the engine keeps 0: no limit
        return repr(max(MIN_SECONDS, float(limit)))
    return str(max(1, int(limit)))  # 0.5 threads would be 0: no limit


def lex_view(data: bytes) -> str:
    """Bytes as text with one character per byte, so lexer offsets are byte offsets."""
    return data.decode("latin-1")


def leading_word(data: bytes) -> str:
    """The first word of a request's text (an INSERT's data is never lexed past its head)."""
    try:
        return first_word(lex_view(data[:65536]))
    except LexError:
        return ""


def utf8(data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise Refused(f"The query is not valid UTF-8: {err}. (SYNTAX_ERROR)", 62) from err


def parse_request(url_params: dict[str, str], body: bytes) -> Request:
    """The request a URL's parameters and a (decompressed) body make; Refused when empty."""
    request = Request(
        query=url_params.get("query", ""),
        body=body,
        params={k[6:]: v for k, v in url_params.items() if k.startswith("param_")},
        settings={
            k: v
            for k, v in url_params.items()
            if k not in _NOT_SETTINGS and not k.startswith("param_")
        },
        database=url_params.get("database") or "default",
        fmt=url_params.get("default_format") or "TabSeparated",
    )
    if not request.query.strip() and not body.strip():
        raise Refused("Empty query. (SYNTAX_ERROR)", 62)
    return request

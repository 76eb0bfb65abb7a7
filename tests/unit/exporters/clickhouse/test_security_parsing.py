"""The endpoint's lexer and body decoding, without the engine."""

from __future__ import annotations

import gzip
import zlib
from http import HTTPStatus

import pytest

from stepwatch.exporters.clickhouse.guard import Catalog, Guard, Refused, identifier, literal
from stepwatch.exporters.clickhouse.http_body import content_length, decompress
from stepwatch.exporters.clickhouse.sqltext import (
    Kind,
    LexError,
    first_word,
    insert_data_offset,
    skip_data_separator,
    tokens,
)

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("text", "word"),
    [
        ("insert into t", "INSERT"),
        ("  -- INSERT\nSELECT 1", "SELECT"),
        ("/* INSERT /* nested */ */ select 1", "SELECT"),
        ("# INSERT\n  Drop table t", "DROP"),
        ("'INSERT'", ""),
        ("", ""),
    ],
)
def test_first_word_skips_comments_and_knows_strings(text, word):
    assert first_word(text) == word


def test_strings_and_quoted_names_hide_nothing():
    toks = list(
        tokens("SELECT 'a\\'; DROP', 'it''s', `x``;`, \"q;\" -- ; DROP\n/* ; */ {p:String}")
    )
    kinds = [t.kind for t in toks]
    assert Kind.PUNCT in kinds and [t.text for t in toks if t.kind is Kind.PUNCT] == [",", ",", ","]
    assert toks[-1].kind is Kind.PARAM and toks[5].name == "x`;"
    with pytest.raises(LexError):
        list(tokens("SELECT 'open"))
    with pytest.raises(LexError):
        list(tokens("SELECT 1 /* open"))


@pytest.mark.parametrize(
    ("text", "data"),
    [
        ("INSERT INTO t FORMAT CSV\n1,2\n", "\n1,2\n"),
        ('INSERT INTO t (a, `FORMAT`) FORMAT JSONEachRow {"a": 1}', ' {"a": 1}'),
        ("INSERT INTO t VALUES (1); DROP TABLE t", " (1); DROP TABLE t"),
        ("INSERT INTO t SETTINGS x = 'FORMAT CSV' VALUES (1)", " (1)"),
        ("INSERT INTO t SELECT * FROM values('a UInt8', 1)", None),
        ("INSERT INTO t WITH 1 AS x SELECT x", None),
    ],
)
def test_insert_data_starts_after_format_or_values(text, data):
    offset = insert_data_offset(text)
    assert (None if offset is None else text[offset:]) == data


def test_one_line_break_before_inline_data_is_not_data():
    assert skip_data_separator(b"  \r\n1\n") == b"1\n"
    assert skip_data_separator(b"\n\n1") == b"\n1"


def test_literals_and_identifiers_escape_their_quotes():
    assert literal("a'b\\c") == "'a\\'b\\\\c'"
    assert identifier("db`; DROP") == "`db\\`; DROP`"


def test_bodies_are_bounded_and_checked():
    assert decompress(gzip.compress(b"SELECT 1"), "gzip") == b"SELECT 1"
    assert decompress(zlib.compress(b"SELECT 1"), "Deflate") == b"SELECT 1"
    with pytest.raises(Refused) as err:
        decompress(gzip.compress(b"\0" * 100_000), "gzip", limit=1000)
    assert err.value.status == HTTPStatus.REQUEST_ENTITY_TOO_LARGE
    for body, encoding in (
        (gzip.compress(b"SELECT 1")[:-4], "gzip"),
        (b"plain", "gzip"),
        (gzip.compress(b"x") + b"tail", "gzip"),
    ):
        with pytest.raises(Refused) as err:
            decompress(body, encoding)
        assert err.value.status == HTTPStatus.BAD_REQUEST
    with pytest.raises(Refused) as err:
        decompress(b"x", "br")
    assert err.value.status == HTTPStatus.UNSUPPORTED_MEDIA_TYPE


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ({"Content-Length": "10"}, None),
        ({"Content-Length": "-1"}, HTTPStatus.BAD_REQUEST),
        ({"Content-Length": "1e3"}, HTTPStatus.BAD_REQUEST),
        ({"Content-Length": "1001"}, HTTPStatus.REQUEST_ENTITY_TOO_LARGE),
        ({"Transfer-Encoding": "chunked"}, HTTPStatus.LENGTH_REQUIRED),
    ],
)
def test_content_length_is_checked_before_reading(headers, status):
    if status is None:
        assert content_length(headers, 1000) == 10
        return
    with pytest.raises(Refused) as err:
        content_length(headers, 1000)
    assert err.value.status == status


class _EngineSaying:
    """A session whose every statement fails with the engine's ``text``."""

    def __init__(self, text: str) -> None:
        self.text = text

    def query(self, *_: object, **__: object) -> None:
        raise RuntimeError(self.text)


@pytest.mark.parametrize(
    ("engine_says", "code", "status"),
    [
        (
            "Code: 159. DB::Exception: Timeout exceeded: elapsed 6.252 ms, maximum: 1.000 ms. "
            "(TIMEOUT_EXCEEDED)",
            159,
            HTTPStatus.REQUEST_TIMEOUT,
        ),
        ("Code: 62. DB::Exception: Syntax error: failed at position 8. (SYNTAX_ERROR)", 62, 400),
        ("Code: 241. DB::Exception: Memory limit exceeded. (MEMORY_LIMIT_EXCEEDED)", 241, 500),
        ("no code at all", 62, 400),
    ],
)
def test_a_checks_engine_error_keeps_the_engines_code_and_status(engine_says, code, status):
    """The checks run under the request's own limits: a 1 ms max_execution_time that runs
    out while the text is parsed is a timeout (408), not a syntax error (400)."""
    guard = Guard(Catalog(frozenset(), frozenset(), frozenset()), readonly=True)
    with pytest.raises(Refused) as refused:
        guard.statement(_EngineSaying(engine_says), "SELECT 1", {})
    assert (refused.value.code, refused.value.status) == (code, status)

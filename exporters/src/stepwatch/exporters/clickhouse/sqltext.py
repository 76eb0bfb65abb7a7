"""A small ClickHouse SQL lexer: where statements, strings and INSERT data begin and end.

The engine's own parser decides what a statement *is* (see
:mod:`stepwatch.exporters.clickhouse.guard`); this lexer only answers the
questions the parser cannot: which word a request starts with, where the data
of an ``INSERT ... FORMAT x`` / ``INSERT ... VALUES`` begins, and which bare
words and ``FORMAT`` names the engine's canonical text of a statement carries.
It knows string literals (``'...'`` with backslash and doubled-quote escapes),
quoted identifiers (``"..."``, backticks), comments (``--``, ``#``, nested
``/* */``) and query parameters (``{name:Type}``), so that none of them can
hide or fake a keyword.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from enum import Enum


class Kind(Enum):
    WORD = "word"  # bare keyword or identifier
    QUOTED = "quoted"  # "identifier" or `identifier`
    STRING = "string"
    NUMBER = "number"
    PARAM = "param"  # {name:Type}
    PUNCT = "punct"


@dataclass(frozen=True)
class Token:
    kind: Kind
    text: str
    start: int
    end: int

    @property
    def word(self) -> str:
        """The upper-cased word of a bare token ('' for anything else)."""
        return self.text.upper() if self.kind is Kind.WORD else ""

    @property
    def name(self) -> str:
        """The identifier a bare or quoted token names ('' for anything else)."""
        if self.kind is Kind.WORD:
            return self.text
        if self.kind is Kind.QUOTED:
            return _unescape(self.text[1:-1], self.text[0])
        return ""


class LexError(ValueError):
    """Unterminated string, quoted identifier, comment or parameter."""


def _unescape(body: str, quote: str) -> str:
    out, i = [], 0
    while i < len(body):
        if (body[i] == "\\" or body.startswith(quote * 2, i)) and i + 1 < len(body):
            out.append(body[i + 1])
            i += 2
            continue
        out.append(body[i])
        i += 1
    return "".join(out)


def _skip_quoted(text: str, i: int, quote: str) -> int:
    """Index after the closing ``quote`` of the literal opened at ``i``."""
    j = i + 1
    while j < len(text):
        ch = text[j]
        if ch == "\\":
            j += 2
            continue
        if ch == quote:
            if j + 1 < len(text) and text[j + 1] == quote:  # doubled quote
                j += 2
                continue
            return j + 1
        j += 1
    raise LexError(f"unterminated {quote} at offset {i}")


def _skip_block_comment(text: str, i: int) -> int:
    depth, j = 0, i
    while j < len(text):
        if text.startswith("/*", j):
            depth, j = depth + 1, j + 2
        elif text.startswith("*/", j):
            depth, j = depth - 1, j + 2
            if depth == 0:
                return j
        else:
            j += 1
    raise LexError(f"unterminated comment at offset {i}")


def _word_end(text: str, i: int) -> int:
    j = i
    while j < len(text) and (text[j].isalnum() or text[j] in "_$"):
        j += 1
    return j


def tokens(text: str) -> Iterator[Token]:
    """The tokens of ``text``, comments and whitespace left out."""
    i = 0
    while i < len(text):
        ch = text[i]
        if ch.isspace():
            i += 1
        elif text.startswith("--", i) or ch == "#":
            nl = text.find("\n", i)
            i = len(text) if nl < 0 else nl + 1
        elif text.startswith("/*", i):
            i = _skip_block_comment(text, i)
        elif ch in "'\"`":
            end = _skip_quoted(text, i, ch)
            yield Token(Kind.STRING if ch == "'" else Kind.QUOTED, text[i:end], i, end)
            i = end
        elif ch == "{":
            end = text.find("}", i)
            if end < 0:
                raise LexError(f"unterminated parameter at offset {i}")
            yield Token(Kind.PARAM, text[i : end + 1], i, end + 1)
            i = end + 1
        elif ch.isdigit():
            end = _word_end(text, i)
            if end < len(text) and text[end] == ".":
                end = _word_end(text, end + 1)
            yield Token(Kind.NUMBER, text[i:end], i, end)
            i = end
        elif ch.isalpha() or ch in "_$":
            end = _word_end(text, i)
            yield Token(Kind.WORD, text[i:end], i, end)
            i = end
        else:
            yield Token(Kind.PUNCT, ch, i, i + 1)
            i += 1


def first_word(text: str) -> str:
    """The first bare word of ``text``, upper-cased ('' when it starts otherwise)."""
    for tok in tokens(text):
        return tok.word
    return ""


def insert_data_offset(text: str) -> int | None:
    """Where the inline data of an ``INSERT`` starts in ``text``; None when it takes none.

    Data follows ``FORMAT <name>`` or ``VALUES`` at the top level of the
    statement; an ``INSERT ... SELECT`` (or ``WITH``) has none. The lexer stops
    at the first of these, so the data itself is never read as SQL.
    """
    depth, prev = 0, ""
    toks = tokens(text)
    for tok in toks:
        if tok.kind is Kind.PUNCT and tok.text in "([":
            depth += 1
        elif tok.kind is Kind.PUNCT and tok.text in ")]":
            depth -= 1
        elif depth == 0 and tok.word in ("SELECT", "WITH"):
            return None
        elif depth == 0 and tok.word == "FORMAT":
            name = next(toks, None)
            return name.end if name is not None and name.kind is Kind.WORD else tok.end
        elif depth == 0 and tok.word == "VALUES" and prev != "FUNCTION":
            return tok.end
        prev = tok.word
    return None


def skip_data_separator(data: bytes) -> bytes:
    """Inline data after ``FORMAT x``: blanks and one line break before it are not data."""
    stripped = data.lstrip(b" \t")
    if stripped.startswith(b"\r\n"):
        return stripped[2:]
    if stripped.startswith(b"\n"):
        return stripped[1:]
    return stripped

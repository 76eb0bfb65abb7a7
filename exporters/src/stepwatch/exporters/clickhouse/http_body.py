"""Request bodies of the store endpoint: size limits and bounded decompression.

A body is refused before it is read when its declared length is over the
limit, and decompressed incrementally with the output capped, so a small
compression bomb cannot fill memory. Truncated or trailing-garbage streams
and unknown encodings are refused, each with an HTTP status and a message.
"""

from __future__ import annotations

import zlib
from http import HTTPStatus
from typing import Any

from stepwatch.exporters.clickhouse.guard import Refused

DEFAULT_MAX_BODY = 64 << 20  # compressed bytes read off the socket
DEFAULT_MAX_DECOMPRESSED = 256 << 20


def content_length(headers: Any, limit: int) -> int:
    """The declared body length, checked; Refused when absent-but-chunked, bad or too big."""
    if headers.get("Transfer-Encoding"):
        raise Refused(
            "Chunked request bodies are not accepted: send Content-Length.",
            0,
            HTTPStatus.LENGTH_REQUIRED,
        )
    raw = (headers.get("Content-Length") or "0").strip()
    if not raw.isdigit():
        raise Refused(f"Bad Content-Length {raw[:32]!r}.", 0)
    length = int(raw)
    if length > limit:
        raise Refused(
            f"Request body of {length} bytes is over the limit of {limit} bytes.",
            0,
            HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
        )
    return length


def _too_big(limit: int) -> Refused:
    return Refused(
        f"Decompressed request body is over the limit of {limit} bytes.",
        0,
        HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
    )


def _check_end(eof: bool, unused: bytes, encoding: str) -> None:
    if not eof:
        raise Refused(f"Cannot decompress request body: truncated {encoding} stream.", 0)
    if unused:
        raise Refused(
            f"Cannot decompress request body: data after the end of the {encoding} stream.", 0
        )


def _zlib(body: bytes, wbits: int, limit: int, encoding: str) -> bytes:
    d = zlib.decompressobj(wbits)
    try:
        out = d.decompress(body, limit + 1)
    except zlib.error as err:
        raise Refused(f"Cannot decompress request body: {encoding}: {err}.", 0) from err
    if len(out) > limit or d.unconsumed_tail:
        raise _too_big(limit)
    _check_end(d.eof, d.unused_data, encoding)
    return out


def _lz4(body: bytes, limit: int) -> bytes:
    import lz4.frame

    d = lz4.frame.LZ4FrameDecompressor()
    try:
        out = d.decompress(body, max_length=limit + 1)
    except RuntimeError as err:
        raise Refused(f"Cannot decompress request body: lz4: {err}.", 0) from err
    if len(out) > limit or (not d.eof and not d.needs_input):
        raise _too_big(limit)
    _check_end(d.eof, d.unused_data, "lz4")
    return bytes(out)


def _zstd(body: bytes, limit: int) -> bytes:
    from backports import zstd

    d = zstd.ZstdDecompressor()
    try:
        out = d.decompress(body, max_length=limit + 1)
    except zstd.ZstdError as err:
        raise Refused(f"Cannot decompress request body: zstd: {err}.", 0) from err
    if len(out) > limit or (not d.eof and not d.needs_input):
        raise _too_big(limit)
    _check_end(d.eof, d.unused_data, "zstd")
    return bytes(out)


def decompress(body: bytes, encoding: str, limit: int = DEFAULT_MAX_DECOMPRESSED) -> bytes:
    """``body`` decoded from its Content-Encoding, at most ``limit`` bytes."""
    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        return body
    if encoding in ("gzip", "x-gzip"):
        return _zlib(body, 16 + zlib.MAX_WBITS, limit, "gzip")
    if encoding == "deflate":
        return _zlib(body, zlib.MAX_WBITS, limit, "deflate")
    if encoding == "lz4":
        return _lz4(body, limit)
    if encoding == "zstd":
        return _zstd(body, limit)
    raise Refused(
        f"Unsupported Content-Encoding {encoding[:32]!r}: use gzip, deflate, lz4 or zstd.",
        0,
        HTTPStatus.UNSUPPORTED_MEDIA_TYPE,
    )

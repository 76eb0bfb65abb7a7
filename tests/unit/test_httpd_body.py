"""Which request bodies the HTTP services refuse before reading them (httpd.body_refusal)."""

from __future__ import annotations

from http.client import HTTPMessage

import pytest

from stepwatch.httpd import body_refusal


def headers(*pairs: tuple[str, str]) -> HTTPMessage:
    message = HTTPMessage()
    for name, value in pairs:
        message[name] = value
    return message


@pytest.mark.parametrize(
    ("pairs", "status"),
    [
        ((), None),
        ((("Content-Length", "10"),), None),
        ((("Content-Length", "1001"),), 413),
        ((("Transfer-Encoding", "chunked"),), 411),
        # int() reads these as sizes; a proxy in front may read them otherwise
        ((("Content-Length", "1_0"),), 400),
        ((("Content-Length", "+9"),), 400),
        ((("Content-Length", "-1"),), 400),
        ((("Content-Length", "10"), ("Content-Length", "20")), 400),
    ],
)
def test_body_refusal(pairs: tuple[tuple[str, str], ...], status: int | None) -> None:
    refused = body_refusal(headers(*pairs), 1000)
    assert (refused[0] if refused else None) == status

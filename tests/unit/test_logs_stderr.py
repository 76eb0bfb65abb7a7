"""The CLI's log handler follows ``sys.stderr``: a swapped and closed stream is never written."""

from __future__ import annotations

import io
import logging

import pytest

from stepwatch.logs import StderrHandler


def test_the_handler_writes_to_the_current_stderr_not_a_closed_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    first, second = io.StringIO(), io.StringIO()
    monkeypatch.setattr("sys.stderr", first)
    handler = StderrHandler()
    log = logging.getLogger("stepwatch.test.stderr")
    log.addHandler(handler)
    log.propagate = False
    try:
        log.warning("one")
        first.close()  # a test runner's capture ends
        monkeypatch.setattr("sys.stderr", second)
        log.warning("two")
    finally:
        log.removeHandler(handler)
        log.propagate = True
    assert second.getvalue() == "two\n"

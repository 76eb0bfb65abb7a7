"""``stepwatch sql`` takes one statement and says so, before any store is opened."""

from __future__ import annotations

import pytest

from stepwatch.cli.sql import _one_statement
from stepwatch.errors import ConfigError


@pytest.mark.parametrize("sql", ["SELECT 1; SELECT 2", "SELECT 1;\n-- next\nDROP TABLE steps"])
def test_a_second_statement_is_refused_in_words(sql: str) -> None:
    with pytest.raises(ConfigError, match="one statement at a time"):
        _one_statement(sql)


@pytest.mark.parametrize(
    "sql", ["SELECT 1", "SELECT 1;", "SELECT 1;;  -- done", "SELECT ';' AS x", "SELECT 1 -- a; b"]
)
def test_one_statement_passes(sql: str) -> None:
    _one_statement(sql)

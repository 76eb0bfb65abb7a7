"""Shared test configuration: markers are applied by folder."""

from __future__ import annotations

import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        path = pathlib.Path(str(item.fspath))
        if ROOT / "integration" in path.parents:
            item.add_marker(pytest.mark.integration)
        elif ROOT / "unit" in path.parents:
            item.add_marker(pytest.mark.unit)

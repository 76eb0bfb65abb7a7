"""Fixtures shared by the SDK's unit tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.sdk_agent import FakeAgent


@pytest.fixture()
def agent() -> Iterator[FakeAgent]:
    """A fake node agent on a real Unix datagram socket (closed after the test)."""
    fake = FakeAgent()
    yield fake
    fake.close()

"""The lean consumer copies faust-streaming internals: the installed release must be that series."""

from __future__ import annotations

import importlib.metadata

import pytest

from stepwatch.errors import ConfigError
from stepwatch.settings import Settings
from stepwatch.streams.worker.app import StreamOptions, create_app
from stepwatch.streams.worker.transport import SUPPORTED_FAUST, faust_version_problem

pytestmark = pytest.mark.unit


def test_installed_faust_is_the_series_the_lean_consumer_copies() -> None:
    problem = faust_version_problem()
    assert problem is None, problem  # the message says what to do


def test_other_series_are_refused_with_what_to_do() -> None:
    major, minor = SUPPORTED_FAUST
    assert faust_version_problem(f"{major}.{minor}.9") is None
    problem = faust_version_problem(f"{major}.{minor + 1}.0")
    assert problem is not None
    assert "--stock-consumer" in problem and "scripts/setup.sh" in problem


def test_pyproject_pins_the_same_series() -> None:
    requires = importlib.metadata.requires("stepwatch") or []
    pin = next(r for r in requires if r.startswith("faust-streaming"))
    major, minor = SUPPORTED_FAUST
    assert f">={major}.{minor}" in pin and f"<{major}.{minor + 1}" in pin, pin


def test_lean_worker_refuses_an_unsupported_faust(
    monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    from stepwatch.streams.worker import app as app_module

    monkeypatch.setattr(app_module, "faust_version_problem", lambda: "faust-streaming 9.9 ...")
    settings = Settings.load(env={}, bootstrap_servers="127.0.0.1:9", stream_data_dir=str(tmp_path))
    with pytest.raises(ConfigError, match=r"faust-streaming 9\.9"):
        create_app(settings, StreamOptions(data_dir=str(tmp_path)))
    stock = create_app(settings, StreamOptions(data_dir=str(tmp_path), lean_consumer=False))
    assert stock.app.lean_consumer is False

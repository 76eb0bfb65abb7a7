"""``stepwatch agent`` and ``stepwatch broker``: help, sizes, the missing-broker message."""

from __future__ import annotations

import argparse

import pytest

from stepwatch.cli import main
from stepwatch.cli.agent import parse_size


def test_agent_help_lists_every_agent_setting(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["agent", "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    for flag in (
        "--bootstrap-servers",
        "-X",
        "--socket",
        "--spool-dir",
        "--spool-max-bytes",
        "--sysfs-root",
        "--dcgm-url",
        "--collectors",
        "--metrics-port",
        "--tick",
        "--host",
        "--dev-broker",
    ):
        assert flag in out
    assert "spool" in out and "SIGTERM" in out


def test_agent_without_bootstrap_says_what_it_needs(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("STEPWATCH_BOOTSTRAP_SERVERS", raising=False)
    assert main(["agent", "--collectors", "none", "--metrics-port", "0"]) == 1
    err = capsys.readouterr().err
    assert "--bootstrap-servers" in err and "--dev-broker" in err


def test_broker_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["broker", "--help"])
    out = capsys.readouterr().out
    assert "--port" in out and "memory" in out


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("1048576", 1048576),
        ("512M", 512 * 2**20),
        ("2GiB", 2 * 2**30),
        ("1.5k", 1536),
    ],
)
def test_parse_size(text: str, size: int) -> None:
    assert parse_size(text) == size


def test_parse_size_rejects_nonsense() -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        parse_size("lots")

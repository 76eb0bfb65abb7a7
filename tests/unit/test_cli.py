"""The CLI frame: help lists the subcommands that exist, errors exit non-zero."""

from __future__ import annotations

import pytest

from stepwatch.cli import build_parser, main


def test_help_lists_subcommands(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert "Observability pipeline" in out


def test_no_command_prints_help_and_fails(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "usage: stepwatch" in capsys.readouterr().out


def test_every_registered_subcommand_has_help() -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    for name, subparser in sub.choices.items():  # type: ignore[attr-defined]
        text = subparser.format_help()
        assert name in text and len(text) > 80

"""The CLI frame: help lists the subcommands that exist, errors exit non-zero."""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator

import pytest

from stepwatch.cli import build_parser, main
from stepwatch.cli.agent import parse_size
from stepwatch.cli.common import SETTING_NAMES, default_of
from stepwatch.settings import Settings


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


def _flags(parser: argparse.ArgumentParser) -> Iterator[argparse.Action]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for subparser in action.choices.values():
                yield from _flags(subparser)
        else:
            yield action


def test_help_shows_the_settings_defaults() -> None:
    """A setting's flag whose help names a default shows the Settings one (default_of)."""
    checked = 0
    for action in _flags(build_parser()):
        if (
            action.dest not in SETTING_NAMES
            or action.default is not None
            or not action.help
            or "default" not in action.help
        ):
            continue  # not a setting, or a flag with its own argparse default
        try:
            shown = default_of(action.dest)
        except ValueError:  # a computed default (the host name)
            continue
        if shown:  # an empty default is described in words (e.g. "default host:pid")
            assert re.search(rf"default {re.escape(shown)}(?!\d)", action.help), (
                action.option_strings,
                action.help,
            )
            checked += 1
    assert checked >= 40


def test_default_of_formats_like_the_flags_read() -> None:
    assert default_of("partitions") == "8"
    assert default_of("tick_seconds") == "1"
    assert default_of("stream_batch_within") == "0.05"
    assert default_of("spool_max_bytes") == "512M"
    assert default_of("agent_max_message_bytes") == "256K"
    assert parse_size(default_of("spool_max_bytes")) == Settings().spool_max_bytes


@pytest.mark.parametrize(
    "extra",
    [
        ["--nodes", "4"],
        ["--step-seconds", "0.5"],
        ["--fault", "none"],
        ["--nodes", "2", "--fault", "x"],
    ],
)
def test_demo_refuses_simulator_options_with_torch(
    extra: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """The --torch job is fixed: an option it would ignore is an error, before anything starts."""
    assert main(["demo", "--torch", *extra]) == 1
    err = capsys.readouterr().err
    assert "the --torch job is fixed" in err and extra[0] in err, err

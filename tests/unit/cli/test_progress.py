"""The live status line of long commands: drawn on a terminal only."""

from __future__ import annotations

import io

from stepwatch.cli.progress import counting, status


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_nothing_is_written_when_the_stream_is_not_a_terminal() -> None:
    stream = io.StringIO()
    with status("building report", stream) as update:
        update("rendering figures")
        assert list(counting([b"a", b"b"], update, "reading")) == [b"a", b"b"]
    assert stream.getvalue() == ""


def test_a_terminal_sees_the_stages_and_the_line_is_cleared() -> None:
    stream = Terminal()
    with status("report 42: opening the store", stream) as update:
        assert "report 42: opening the store" in stream.getvalue()
        assert (
            list(counting([b"x"] * 3, update, "replaying e.jsonl", every_seconds=0)) == [b"x"] * 3
        )
    drawn = stream.getvalue()
    assert "replaying e.jsonl: 3 lines" in drawn  # the last stage is drawn at the end
    assert drawn.endswith("\x1b[2K")  # and erased: nothing is left on the terminal

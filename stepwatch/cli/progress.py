"""A live status line on stderr for long commands, only when stderr is a terminal.

``with status("building report") as update: ... update("rendering figures")``
draws a rich spinner on stderr when it is a TTY and rich is installed; otherwise
(a pipe, a file, a CI log) it writes nothing, so output that scripts read stays
as it was. stdout going to a file or a pipe is never touched.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from typing import IO

log = logging.getLogger(__name__)

Update = Callable[[str], None]


def _ignore(_text: str) -> None:
    return None


def is_tty(stream: IO[str]) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or odd stream
        return False


@contextlib.contextmanager
def status(text: str, stream: IO[str] | None = None) -> Iterator[Update]:
    """A spinner with ``text`` on ``stream`` (default stderr) while the block runs."""
    stream = sys.stderr if stream is None else stream
    if not is_tty(stream):
        yield _ignore
        return
    try:
        from rich.console import Console
        from rich.live import Live
        from rich.spinner import Spinner
    except ImportError:  # optional: the report extra brings it
        yield _ignore
        return
    spinner = Spinner("dots", text)
    console = Console(file=stream, force_terminal=True)
    # writes to stderr, and to stdout when it is a terminal too, are shown above
    # the spinner; stdout going to a file or a pipe is left alone
    ours = stream is sys.stderr
    with Live(
        spinner,
        console=console,
        transient=True,
        refresh_per_second=8,
        redirect_stdout=ours and is_tty(sys.stdout),
        redirect_stderr=ours,
    ):

        def update(new: str) -> None:
            spinner.update(text=new)

        yield update


def counting(
    lines: Iterable[bytes], update: Update, what: str, every_seconds: float = 0.2
) -> Iterator[bytes]:
    """Pass ``lines`` through, reporting how many went by at most every ``every_seconds``."""
    if update is _ignore:
        yield from lines
        return
    last = time.monotonic()
    count = 0
    for count, line in enumerate(lines, start=1):
        now = time.monotonic()
        if now - last >= every_seconds:
            last = now
            update(f"{what}: {count:,} lines")
        yield line
    update(f"{what}: {count:,} lines")

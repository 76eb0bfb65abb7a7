"""The demo's closing note: where things are and what to try next."""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

#: Saved queries worth trying on the demo's store, with the flags they take.
TRY_QUERIES: tuple[tuple[str, str], ...] = (
    ("job_timeline", "--job {job}"),
    ("rank_step_percentiles", "--job {job}"),
    ("goodput_mfu", "--job {job}"),
    ("network_hotspots", "--job {job}"),
    ("gpu_errors", "--job {job}"),
    ("lemon_nodes", "-p min_jobs=1"),  # the demo's store holds one job: 1, not the default 2
)


def stepwatch_command() -> str:
    """A command that runs stepwatch without activating its virtual environment.

    The ``stepwatch`` script installed next to the running interpreter when it
    exists, else the interpreter itself with ``-m stepwatch.cli``; relative to
    the current directory when that is shorter.
    """
    script = Path(sys.executable).with_name("stepwatch")
    if script.exists():
        return shlex.quote(_short(script))
    return f"{shlex.quote(_short(Path(sys.executable)))} -m stepwatch.cli"


def _short(path: Path) -> str:
    absolute = str(path.absolute())
    try:
        relative = os.path.relpath(absolute)
    except ValueError:
        return absolute
    return (
        relative if len(relative) < len(absolute) and not relative.startswith("../..") else absolute
    )


def closing_note(store: Path | None, job: str, report: Path | None) -> str:
    lines: list[str] = []
    if store is not None:
        cmd = stepwatch_command()
        lines.append("history (ClickHouse engine, embedded) - saved queries to try:")
        for name, flags in TRY_QUERIES:
            more = (" " + flags.format(job=shlex.quote(job))) if flags else ""
            lines.append(f"  {cmd} query {name}{more} --store-path {shlex.quote(_short(store))}")
        lines.append(
            f"  {cmd} sql --store-path {shlex.quote(_short(store))} "
            '"SELECT type, state, host, rank, cause FROM detections ORDER BY ts LIMIT 10"'
        )
    if report is not None:
        lines.append(f"post-mortem report: {report}")
    elif store is not None:
        lines.append(
            f"post-mortem report: {stepwatch_command()} report --job {shlex.quote(job)} "
            f"--store-path {shlex.quote(_short(store))}"
        )
    return "\n".join(lines)

"""Which of the demo's services died while it ran, how, and what the run's verdict is.

The demo checks its services at every refresh. A service that ended while the
demo was not stopping died: the live view says which one, how it ended (its
exit code, or the signal that killed it) and where its log is, the status
lines and the final summary keep saying it is down, and the run fails (a
non-zero exit status). Nothing is restarted.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol


class Service(Protocol):
    """What the demo watches: a name, a log, and how it ended (None while it runs)."""

    @property
    def name(self) -> str: ...

    @property
    def log_path(self) -> Path: ...

    def ended(self) -> str | None: ...


def how_it_ended(returncode: int) -> str:
    """``exited with code 3`` or ``killed by SIGKILL`` (Popen's negative return codes)."""
    if returncode >= 0:
        return f"exited with code {returncode}"
    try:
        return f"killed by {signal.Signals(-returncode).name}"
    except ValueError:
        return f"killed by signal {-returncode}"


def shown(path: Path) -> str:
    """``path`` relative to the working directory when it is below it (shorter to read)."""
    try:
        return str(path.resolve().relative_to(Path(os.getcwd()).resolve()))
    except ValueError:
        return str(path)


@dataclass(frozen=True)
class Death:
    """A service that died while the demo ran."""

    name: str
    at: float  # seconds after the demo started
    how: str  # how_it_ended()
    log: str  # where its log is

    def detail(self) -> str:
        return f"{self.how} at t={self.at:.1f}s; log {self.log}"


@dataclass
class Watch:
    """The deaths seen so far, by service name (the first one of each counts)."""

    deaths: dict[str, Death] = field(default_factory=dict)

    def check(self, services: Iterable[Service], at: float) -> list[Death]:
        """The services found dead at ``at`` (seconds after the start) that were not before."""
        new = []
        for service in services:
            if service.name in self.deaths:
                continue
            how = service.ended()
            if how is not None:
                death = Death(service.name, at, how, shown(service.log_path))
                self.deaths[service.name] = death
                new.append(death)
        return new

    def states(self, services: Iterable[Service]) -> dict[str, str]:
        """``name -> "up"`` or ``"DOWN (killed by SIGKILL at t=37.6s; log ...)"``."""
        out = {}
        for service in services:
            death = self.deaths.get(service.name)
            out[service.name] = "up" if death is None else f"DOWN ({death.detail()})"
        return out

    def status(self) -> str:
        """The status line's part: `` down=stream-0,sink`` ('' when every service runs)."""
        return f" down={','.join(self.deaths)}" if self.deaths else ""

    def summary(self) -> list[str]:
        """The final summary's lines about the services that died."""
        if not self.deaths:
            return []
        return ["services that died during the run (not restarted):"] + [
            f"  {d.name}: {d.detail()}" for d in self.deaths.values()
        ]


def verdict(*, deaths: Sequence[str], missing: int, undelivered: int) -> list[str]:
    """Why the run failed, one reason each ([] when it did not)."""
    out = []
    if deaths:
        out.append(f"service{'s' if len(deaths) > 1 else ''} {', '.join(deaths)} died")
    if missing:
        out.append(f"{missing} messages missing")
    if undelivered:
        out.append(f"{undelivered} messages undelivered")
    return out


@dataclass(frozen=True)
class Probed:
    """A service the demo knows only by whether it runs (its launcher keeps the rest)."""

    name: str
    log_path: Path
    running: Callable[[], bool]

    def ended(self) -> str | None:
        return None if self.running() else "exited (exit status not known to the demo)"

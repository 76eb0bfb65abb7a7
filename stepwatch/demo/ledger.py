"""What a demo run started, on disk, so that the next run can stop what a killed one left.

While it runs, the demo records every live process below its own (its services,
the broker, Prometheus, Alertmanager, Slurm's daemons and jobs, what they
started) in ``processes.json`` in its workdir: pid, start time (field 22 of
``/proc/<pid>/stat``, clock ticks since boot), the boot it ran in, whether the
process leads its own session, and what it is. A demo killed with SIGKILL
cannot stop them; the next run reads the file before it deletes the workdir,
says which are still alive and stops them: SIGTERM (to the whole process group
of a session leader), SIGKILL after a grace period.

A process is stopped only when the file proves it is the previous run's: the
same boot, the same pid and the same start time. A pid reused since by another
process has another start time and is left alone. A run that stops normally
removes its file.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from stepwatch.errors import StepwatchError

log = logging.getLogger(__name__)

STATE_FILE = "processes.json"
GRACE_S = 10.0  # SIGTERM, then this long, then SIGKILL
RECORD_EVERY_S = 1.0
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


class DemoRunningError(StepwatchError):
    """The demo that wrote the state file is still running (the same workdir)."""


@dataclass(frozen=True)
class ProcStat:
    """The fields of ``/proc/<pid>/stat`` the ledger needs."""

    state: str
    ppid: int
    pgrp: int
    session: int
    start: int  # clock ticks after boot

    @property
    def live(self) -> bool:
        return self.state not in ("Z", "X")


@dataclass(frozen=True)
class Recorded:
    """One process of a demo run, as its state file holds it."""

    pid: int
    start: int
    what: str
    leader: bool = False  # leads its own session (started so): stopped as a process group


@dataclass(frozen=True)
class Ledger:
    """A demo run's state file: the demo process itself and what runs below it."""

    boot: str
    owner: Recorded
    processes: tuple[Recorded, ...] = ()

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    @staticmethod
    def from_json(text: str) -> Ledger:
        try:
            raw = json.loads(text)
            return Ledger(
                boot=str(raw["boot"]),
                owner=Recorded(**raw["owner"]),
                processes=tuple(Recorded(**p) for p in raw["processes"]),
            )
        except (ValueError, KeyError, TypeError) as err:
            raise StepwatchError(f"unreadable demo state file: {err}") from err


def proc_stat(pid: int) -> ProcStat | None:
    """``pid``'s stat (None when there is no such process)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
        fields = text.rsplit(")", 1)[1].split()
        return ProcStat(fields[0], int(fields[1]), int(fields[2]), int(fields[3]), int(fields[19]))
    except (OSError, IndexError, ValueError):
        return None


def boot_id() -> str:
    try:
        return BOOT_ID.read_text().strip()
    except OSError:
        return ""


def describe(pid: int) -> str:
    """A short name for ``pid``: its command line, the program's base name first."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return "?"
    argv = [a for a in argv if a]
    if not argv:
        return "?"
    text = " ".join([Path(argv[0]).name, *argv[1:]])
    return text if len(text) <= 80 else text[:77] + "..."


def identify(pid: int, what: str = "") -> Recorded | None:
    """``pid`` as the ledger records it (None when it is gone)."""
    stat = proc_stat(pid)
    if stat is None or not stat.live:
        return None
    return Recorded(pid, stat.start, what or describe(pid), leader=stat.session == pid)


def below(pid: int) -> list[int]:
    """Every live process below ``pid`` (from /proc), parents before children."""
    kids: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            stat = proc_stat(int(entry.name))
            if stat is not None and stat.live:
                kids.setdefault(stat.ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        found = kids.get(todo.pop(0), [])
        out += found
        todo += found
    return out


def snapshot(names: Mapping[int, str] | None = None) -> Ledger:
    """This process and every live process below it; ``names`` label the pids it knows."""
    names = names or {}
    me = identify(os.getpid(), "demo")
    assert me is not None  # this process is alive
    found = [identify(pid, names.get(pid, "")) for pid in below(os.getpid())]
    return Ledger(boot_id(), me, tuple(r for r in found if r is not None))


def write(path: Path, ledger: Ledger) -> None:
    """Replace the state file at once (a reader never sees half of it)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(ledger.to_json())
    os.replace(tmp, path)


def read(path: Path) -> Ledger | None:
    try:
        return Ledger.from_json(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, StepwatchError) as err:
        log.warning("demo: ignoring the previous run's state file path=%s err=%s", path, err)
        return None


def proven(entry: Recorded, boot: str) -> bool:
    """Whether ``entry`` is still the very process the ledger recorded (boot, pid, start)."""
    if entry.pid <= 1 or entry.pid == os.getpid() or boot != boot_id():
        return False
    stat = proc_stat(entry.pid)
    return stat is not None and stat.live and stat.start == entry.start


def survivors(path: Path) -> list[Recorded]:
    """The processes of the run that wrote ``path`` that are still alive, proven so.

    Raises :class:`DemoRunningError` when that run itself is still alive.
    """
    ledger = read(path)
    if ledger is None:
        return []
    if proven(ledger.owner, ledger.boot):
        raise DemoRunningError(
            f"another demo (pid {ledger.owner.pid}) is running with {path.parent}: "
            f"stop it first (kill {ledger.owner.pid}) or give this one another --workdir"
        )
    return [p for p in ledger.processes if proven(p, ledger.boot)]


def stop_survivors(
    found: Sequence[Recorded],
    boot: str,
    say: Callable[[str], None],
    grace: float = GRACE_S,
) -> list[Recorded]:
    """Stop ``found`` (each re-proven before every signal): SIGTERM, SIGKILL after ``grace``;
    returns those still alive at the end."""
    for entry in found:
        group = " and its process group" if entry.leader else ""
        say(f"previous demo run: {entry.what} (pid {entry.pid}) still running: stopping it{group}")
    _signal_all(found, boot, signal.SIGTERM)
    left = _wait_gone(found, boot, grace)
    if left:
        which = ", ".join(f"{e.what} (pid {e.pid})" for e in left)
        say(f"previous demo run: {which} did not stop on SIGTERM in {grace:.0f} s: SIGKILL")
        _signal_all(left, boot, signal.SIGKILL)
        left = _wait_gone(left, boot, 5.0)
    return left


def _signal_all(found: Sequence[Recorded], boot: str, sig: int) -> None:
    for entry in found:
        if not proven(entry, boot):
            continue
        stat = proc_stat(entry.pid)
        try:
            if entry.leader and stat is not None and stat.pgrp == entry.pid:
                os.killpg(entry.pid, sig)
            else:
                os.kill(entry.pid, sig)
        except OSError as err:
            log.warning("demo: cannot signal pid=%s sig=%s err=%s", entry.pid, sig, err)


def _wait_gone(found: Sequence[Recorded], boot: str, timeout: float) -> list[Recorded]:
    deadline = time.monotonic() + timeout
    left = [e for e in found if proven(e, boot)]
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = [e for e in left if proven(e, boot)]
    return left


def clear_previous(workdir: Path, say: Callable[[str], None], grace: float = GRACE_S) -> int:
    """Before a run deletes ``workdir``: stop what the previous run there left running.

    Returns how many processes it stopped. Raises :class:`DemoRunningError` when that run
    is still alive, and :class:`StepwatchError` when some of them would not stop.
    """
    path = workdir / STATE_FILE
    found = survivors(path)
    if not found:
        return 0
    ledger = read(path)
    assert ledger is not None
    dirs = run_dirs(found)  # read before they stop: their command lines name them
    left = stop_survivors(found, ledger.boot, say, grace)
    if left:
        pids = ", ".join(str(e.pid) for e in left)
        raise StepwatchError(f"the previous demo run's processes {pids} would not stop")
    count = f"{len(found)} process{'es' if len(found) > 1 else ''}"
    say(f"previous demo run: stopped {count} it left running")
    for d in dirs:
        shutil.rmtree(d, ignore_errors=True)
        say(f"previous demo run: removed its private Slurm/munge folder {d}")
    return len(found)


RUN_DIR_PREFIX = "swslurm-"  # stepwatch.daemons.slurm's private folder (munge socket, spool)


def run_dirs(found: Sequence[Recorded]) -> list[Path]:
    """The private Slurm/munge folders (``<tmp>/swslurm-*``) that ``found`` name on their
    command lines: a killed demo never removed them. Only such folders, directly in the
    temporary directory."""
    tmp = Path(tempfile.gettempdir()).resolve()
    out: set[Path] = set()
    for entry in found:
        try:
            args = Path(f"/proc/{entry.pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        for arg in args:
            text = arg.decode(errors="replace").split("=", 1)[-1]
            if RUN_DIR_PREFIX not in text:
                continue
            path = Path(text)
            for folder in (path, *path.parents):
                if folder.parent == tmp and folder.name.startswith(RUN_DIR_PREFIX):
                    out.add(folder)
    return sorted(out)


class Recorder:
    """Keeps the state file current: every ``every`` s, from a thread, until :meth:`close`."""

    def __init__(
        self,
        path: Path,
        names: Callable[[], Mapping[int, str]] = dict,
        every: float = RECORD_EVERY_S,
    ) -> None:
        self.path = path
        self.names = names
        self.every = every
        self._last: Ledger | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="demo-ledger", daemon=True)

    def start(self) -> Recorder:
        self.record()
        self._thread.start()
        return self

    def record(self) -> Ledger:
        """Write what runs below this process now (only when that changed)."""
        ledger = snapshot(self.names())
        if ledger != self._last:
            write(self.path, ledger)
            self._last = ledger
        return ledger

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            try:
                self.record()
            except (OSError, StepwatchError) as err:
                log.warning("demo: cannot write the state file path=%s err=%s", self.path, err)

    def close(self, remove: bool = True) -> None:
        """Stop recording; ``remove``: delete the file (everything it lists has stopped)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5.0)
        if remove:
            self.path.unlink(missing_ok=True)

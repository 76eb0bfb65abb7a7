"""One managed child process: start, wait for an HTTP readiness URL, stop cleanly.

The launchers in this package (Prometheus, Alertmanager) are thin wrappers
around :class:`ManagedProcess`; they only build the command line and the
config files. Nothing here is specific to one daemon.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

from stepwatch.errors import DaemonError

log = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"


RECENT_PORTS = 4096  # ports handed out lately, never handed out again meanwhile
_handed_out: OrderedDict[int, None] = OrderedDict()
_ports_lock = threading.Lock()


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port that is free on ``host`` right now (the OS picks it), and not one this
    process handed out lately: once its probe socket is closed the OS may pick the same
    port again, and two daemons configured in a row (a slurmctld and a slurmd) then got
    one port, and the second could not bind it."""
    with _ports_lock:
        for _ in range(64):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                sock.bind((host, 0))
                port = int(sock.getsockname()[1])
            if port not in _handed_out:
                _handed_out[port] = None
                if len(_handed_out) > RECENT_PORTS:
                    _handed_out.popitem(last=False)
                return port
    raise DaemonError(f"no free TCP port on {host} that was not handed out lately")


def find_binary(name: str, candidates: Sequence[str] = ()) -> str:
    """The path of ``name`` on ``PATH`` (or one of ``candidates``), else a clear error."""
    for cand in (name, *candidates):
        found = shutil.which(cand)
        if found:
            return found
    raise DaemonError(f"{name} not found on PATH: install it (Debian: apt-get install {name})")


def http_get(url: str, timeout: float = 5.0) -> bytes:
    """GET ``url``; any failure is a :class:`DaemonError`."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return bytes(resp.read())
    except (urllib.error.URLError, OSError) as err:
        raise DaemonError(f"GET {url} failed: {err}") from err


def http_post(
    url: str, body: bytes = b"", timeout: float = 5.0, content_type: str = "application/json"
) -> bytes:
    """POST ``body`` to ``url``; any failure is a :class:`DaemonError`."""
    req = urllib.request.Request(
        url, data=body, method="POST", headers={"Content-Type": content_type}
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return bytes(resp.read())
    except (urllib.error.URLError, OSError) as err:
        raise DaemonError(f"POST {url} failed: {err}") from err


def get_json(url: str, timeout: float = 5.0) -> Any:
    """GET ``url`` and decode JSON."""
    try:
        return json.loads(http_get(url, timeout))
    except ValueError as err:
        raise DaemonError(f"GET {url}: not JSON: {err}") from err


def stop_process(
    proc: subprocess.Popen[bytes], timeout: float, name: str, warn_on_kill: bool = True
) -> bool:
    """Stop one child: SIGTERM, wait up to ``timeout`` s, then SIGKILL (and up to 5 s more).

    Returns False when there was nothing to stop (the process had already exited).
    ``warn_on_kill`` logs a warning when SIGTERM was not enough.
    """
    if proc.poll() is not None:
        return False
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        if warn_on_kill:
            log.warning("daemon did not stop on SIGTERM name=%s pid=%s: killing", name, proc.pid)
        proc.kill()
        proc.wait(timeout=5)
    return True


@dataclass
class ManagedProcess:
    """A child process with a log file, an HTTP readiness probe and a clean stop."""

    name: str
    argv: list[str]
    ready_url: str
    log_path: Path
    stop_timeout: float = 10.0
    _proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    def start(self, timeout: float = 30.0) -> None:
        log.info("daemon starting name=%s argv=%s", self.name, " ".join(self.argv))
        with open(self.log_path, "ab") as out:
            self._proc = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT)
        try:
            self._wait_ready(timeout)
        except DaemonError:
            self.stop()
            raise
        log.info("daemon ready name=%s pid=%s url=%s", self.name, self._proc.pid, self.ready_url)

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc is None or self._proc.poll() is not None:
                code = None if self._proc is None else self._proc.returncode
                raise DaemonError(
                    f"{self.name} exited with code {code} at start: {self.log_tail()}"
                )
            try:
                http_get(self.ready_url, timeout=1.0)
                return
            except DaemonError:
                time.sleep(0.1)
        raise DaemonError(
            f"{self.name} not ready at {self.ready_url} after {timeout:.0f} s: {self.log_tail()}"
        )

    def stop(self) -> None:
        """SIGTERM, wait up to ``stop_timeout``, then SIGKILL. Idempotent."""
        proc, self._proc = self._proc, None
        if proc is None or not stop_process(proc, self.stop_timeout, self.name):
            return
        log.info("daemon stopped name=%s code=%s", self.name, proc.returncode)

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def log_tail(self, chars: int = 2000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


class Daemon:
    """What every launched daemon shares: reload, stop, context manager, log tail.

    Subclasses are dataclasses with ``host``, ``port`` and ``_proc`` fields and a ``start()``.
    """

    host: str
    port: int
    _proc: ManagedProcess | None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout: float = 30.0) -> Self:  # pragma: no cover - ditto
        raise NotImplementedError

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.stop()
            self._proc = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def log_tail(self, chars: int = 2000) -> str:
        return "" if self._proc is None else self._proc.log_tail(chars)

    def reload(self) -> None:
        http_post(f"{self.url}/-/reload")


def sweep(marker: str, timeout: float = 5.0) -> list[int]:
    """Stop every process whose environment holds the entry ``marker`` (``NAME=value``).

    What a daemon leaves behind when it dies first (Slurm's ``slurmstepd`` and the
    job under it are in their own sessions, out of reach of a process group):
    SIGTERM, then SIGKILL after ``timeout``. Returns the pids it found.
    """
    entry = marker.encode()
    found = [pid for pid in _pids() if pid != os.getpid() and entry in _environ(pid)]
    for pid, sig in ((p, signal.SIGTERM) for p in found):
        _kill(pid, sig)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(_alive(p) for p in found):
        time.sleep(0.1)
    for pid in found:
        if _alive(pid):
            _kill(pid, signal.SIGKILL)
    return found


def _pids() -> list[int]:
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()]


def _environ(pid: int) -> list[bytes]:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return []


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def _kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except OSError:
        pass

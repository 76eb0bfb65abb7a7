"""ManagedProcess: readiness, a clear error when a daemon never gets ready, a clean stop."""

from __future__ import annotations

import sys

import pytest

from stepwatch.daemons.process import ManagedProcess, find_binary, free_port
from stepwatch.errors import DaemonError


def test_ready_once_the_url_answers_then_stopped_by_sigterm(tmp_path) -> None:
    port = free_port()
    proc = ManagedProcess(
        "http",
        [
            sys.executable,
            "-m",
            "http.server",
            str(port),
            "--bind",
            "127.0.0.1",
            "--directory",
            str(tmp_path),
        ],
        f"http://127.0.0.1:{port}/",
        tmp_path / "http.log",
    )
    proc.start(timeout=20)
    assert proc.running and proc.pid
    proc.stop()
    assert not proc.running
    proc.stop()  # idempotent


def test_never_ready_is_an_error_and_the_process_is_gone(tmp_path) -> None:
    proc = ManagedProcess(
        "sleeper",
        [sys.executable, "-c", "import time; time.sleep(60)"],
        f"http://127.0.0.1:{free_port()}/",
        tmp_path / "s.log",
        stop_timeout=2,
    )
    with pytest.raises(DaemonError, match="sleeper not ready"):
        proc.start(timeout=1)
    assert not proc.running


def test_exit_at_start_reports_the_log(tmp_path) -> None:
    proc = ManagedProcess(
        "bad",
        [sys.executable, "-c", "print('no config'); raise SystemExit(3)"],
        f"http://127.0.0.1:{free_port()}/",
        tmp_path / "b.log",
    )
    with pytest.raises(DaemonError, match=r"exited with code 3(.|\n)*no config"):
        proc.start(timeout=10)


def test_missing_binary_names_the_package() -> None:
    with pytest.raises(DaemonError, match="apt-get install no-such-daemon"):
        find_binary("no-such-daemon")


class _ScriptedSocket:
    """A socket whose bind to port 0 gets the next port of a script (what the OS picks)."""

    script: list[int] = []

    def __init__(self, *_: object) -> None:
        self.port = 0

    def __enter__(self) -> _ScriptedSocket:
        return self

    def __exit__(self, *_: object) -> None:
        pass

    def bind(self, _: tuple[str, int]) -> None:
        self.port = self.script.pop(0)

    def getsockname(self) -> tuple[str, int]:
        return ("127.0.0.1", self.port)


def test_free_port_never_hands_out_a_port_twice_in_a_row(monkeypatch: pytest.MonkeyPatch) -> None:
    """The OS may pick the same port again once the probe socket is closed: a slurmctld and
    a slurmd configured in a row once got one port, and the slurmd could not bind it."""
    import stepwatch.daemons.process as process

    monkeypatch.setattr(process.socket, "socket", _ScriptedSocket)
    monkeypatch.setattr(process, "_handed_out", process.OrderedDict())
    _ScriptedSocket.script = [40001, 40001, 40001, 40002, 40001, 40003]
    assert [free_port(), free_port(), free_port()] == [40001, 40002, 40003]
    _ScriptedSocket.script = [40003] * 64
    with pytest.raises(DaemonError, match="no free TCP port"):
        free_port()

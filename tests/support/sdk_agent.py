"""A fake node agent for the SDK tests: a real Unix datagram socket in a short temp dir."""

from __future__ import annotations

import os
import shutil
import socket
import tempfile

from stepwatch.contract.wire import Datagram, RankEvent, RankStep, decode_datagram


class FakeAgent:
    """Binds a datagram socket (unless ``listen=False``) and decodes what arrives."""

    def __init__(self, listen: bool = True) -> None:
        self.dir = tempfile.mkdtemp(prefix="swt")  # short: AF_UNIX paths are <= 107 bytes
        self.path = os.path.join(self.dir, "agent.sock")
        self.sock: socket.socket | None = None
        if listen:
            self.listen()

    def listen(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)

    def receive(self, timeout: float = 0.2) -> list[Datagram]:
        """Every datagram queued now (waiting up to ``timeout`` for the first)."""
        assert self.sock is not None
        out: list[Datagram] = []
        self.sock.settimeout(timeout)
        while True:
            try:
                out.append(decode_datagram(self.sock.recv(65536)))
            except (TimeoutError, BlockingIOError):
                return out
            self.sock.settimeout(0.05)

    def steps(self, timeout: float = 0.2) -> list[RankStep]:
        return [d for d in self.receive(timeout) if isinstance(d, RankStep)]

    def split(self, timeout: float = 0.2) -> tuple[list[RankStep], list[RankEvent]]:
        got = self.receive(timeout)
        return (
            [d for d in got if isinstance(d, RankStep)],
            [d for d in got if isinstance(d, RankEvent)],
        )

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
        shutil.rmtree(self.dir, ignore_errors=True)

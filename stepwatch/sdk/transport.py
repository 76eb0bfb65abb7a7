"""Non-blocking Unix datagram sender to the node agent.

``sendto`` on an unconnected ``AF_UNIX``/``SOCK_DGRAM`` socket with
``MSG_DONTWAIT``: a datagram either lands in the agent's receive queue in a
few microseconds or is dropped and counted: no agent listening (``no_agent``),
its queue full (``buffer_full``), too large (``oversized``), not writable by
this user (``no_permission``: the agent lets only its own user and its socket
group send) or any other socket error (``error``). Each send resolves the path
again, so an agent that restarts is picked up without reconnecting. Never raises.

A full queue is often momentary (Linux queues only ``net.unix.max_dgram_qlen``
datagrams per socket, 10 by default on many kernels), so a sender given a
retry budget (the background thread, never the training thread) sleeps and
retries for up to that many seconds per batch before dropping.
"""

from __future__ import annotations

import logging
import socket
import time
from collections import Counter

from stepwatch.contract.wire import MAX_DATAGRAM_BYTES, Datagram, encode_datagram
from stepwatch.logs import LogOnce

logger = logging.getLogger(__name__)

_DONTWAIT = getattr(socket, "MSG_DONTWAIT", 0)


class DatagramSender:
    """Sends wire datagrams to ``path``; counts what was sent and what was dropped."""

    def __init__(self, path: str, max_bytes: int = MAX_DATAGRAM_BYTES) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.sent = 0
        self.retries = 0
        self.dropped: Counter[str] = Counter()
        self._budget = 0.0  # seconds this batch may still sleep waiting for queue room
        self._log = LogOnce(logger)
        self._sock: socket.socket | None = None
        try:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            sock.setblocking(False)
            self._sock = sock
        except (OSError, AttributeError) as err:
            self._log(
                "socket", "stepwatch sdk: no Unix datagram socket err=%r; events are dropped", err
            )

    def allow_wait(self, seconds: float) -> None:
        """Let the next sends wait up to ``seconds`` in all for room in a full queue."""
        self._budget = max(0.0, seconds)

    def send(self, item: Datagram) -> bool:
        """Encode and send one datagram; False (and counted) when dropped."""
        try:
            data = encode_datagram(item)
        except Exception as err:  # a value msgspec cannot encode: drop, never raise
            return self._drop("encode", "stepwatch sdk: cannot encode datagram err=%r", err)
        return self.send_bytes(data)

    def send_bytes(self, data: bytes) -> bool:
        if len(data) > self.max_bytes:
            return self._drop(
                "oversized",
                "stepwatch sdk: dropping datagram of size=%s bytes > max=%s",
                len(data),
                self.max_bytes,
            )
        if self._sock is None:
            return self._drop("no_socket", "stepwatch sdk: no socket; dropping")
        try:
            self._sendto(data)
        except BlockingIOError:
            return self._drop(
                "buffer_full", "stepwatch sdk: agent socket queue full path=%s; dropping", self.path
            )
        except PermissionError:
            return self._drop(
                "no_permission",
                "stepwatch sdk: not allowed to send to the agent socket path=%s (the agent "
                "lets its own user and its --socket-group send); dropping and counting events",
                self.path,
            )
        except (FileNotFoundError, ConnectionRefusedError):
            return self._drop(
                "no_agent",
                "stepwatch sdk: no agent listening path=%s; dropping and counting events",
                self.path,
                level=logging.INFO,
            )
        except (OSError, TypeError, ValueError) as err:
            return self._drop("error", "stepwatch sdk: send failed path=%r err=%r", self.path, err)
        self.sent += 1
        return True

    def _sendto(self, data: bytes) -> None:
        assert self._sock is not None
        pause = 0.0005
        while True:
            try:
                self._sock.sendto(data, _DONTWAIT, self.path)
                return
            except BlockingIOError:
                if self._budget <= 0:
                    raise
            self.retries += 1
            wait = min(pause, self._budget)
            self._budget -= wait
            time.sleep(wait)
            pause = min(pause * 2, 0.004)

    def _drop(self, reason: str, msg: str, *args: object, level: int = logging.WARNING) -> bool:
        self.dropped[reason] += 1
        self._log(reason, msg, *args, level=level)
        return False

    def close(self) -> None:
        if self._sock is not None:
            try:
                self._sock.close()
            except OSError:
                pass
            self._sock = None

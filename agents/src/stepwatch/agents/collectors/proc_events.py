"""Exit statuses from the kernel's process events connector (``CN_PROC``).

How a rank's process ended (killed by a signal, an exit code) is in its
``/proc/<pid>/stat`` only until its parent reaps it; a Python parent that waits
on its children (``mp.spawn``, torchrun's teardown) reaps at once and won that
race about half the time. The kernel also sends every process's exit, with its
status, to the netlink sockets that listen for process events; the message is
queued on the socket before the process's pidfd becomes readable, so nothing
can reap it away. Listening needs ``CAP_NET_ADMIN`` (the node agent runs as
root), and the events carry the host's pids: at start the agent runs a child and
uses the events only if they tell its exit under the pid the agent knows it by
(not in a container's pid namespace). Otherwise :func:`open_proc_events` gives
None and the stat read is all.

A classic BPF filter on the socket keeps only the exits of whole processes (not
threads), so that a busy node's forks, execs and thread exits never wake the
agent.
"""

from __future__ import annotations

import ctypes
import logging
import select
import shutil
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

NETLINK_CONNECTOR = 11
CN_IDX_PROC = CN_VAL_PROC = 1
PROC_CN_MCAST_LISTEN, PROC_CN_MCAST_IGNORE = 1, 2
PROC_EVENT_EXIT = 0x80000000
NLMSG_DONE = 3
SO_ATTACH_FILTER = 26
_NLMSG = struct.Struct("=IHHII")  # len, type, flags, seq, pid
_CN_MSG = struct.Struct("=IIIIHH")  # idx, val, seq, ack, len, flags
_WHAT = 16 + 20  # proc_event.what, after the netlink and connector headers
_EXIT = struct.Struct("=iiI")  # process_pid, process_tgid, exit_code (a wait status)
_EXIT_AT = _WHAT + 16  # after what, cpu and timestamp_ns
RCVBUF = 1 << 20


def _filter() -> bytes:
    """Keep a message only when it is an exit whose pid is its tgid (a process, not a
    thread). Classic BPF loads words big-endian: the little-endian ``what`` compares
    as its bytes reversed, and the pid with the tgid as they are."""
    ld_w_abs, st, ldx_mem = 0x20, 0x02, 0x61
    jeq_k, jeq_x, ret_k = 0x15, 0x1D, 0x06
    what = struct.unpack(">I", struct.pack("<I", PROC_EVENT_EXIT))[0]
    prog = [
        (ld_w_abs, 0, 0, _WHAT),
        (jeq_k, 0, 6, what),  # not an exit: drop
        (ld_w_abs, 0, 0, _EXIT_AT + 4),  # tgid
        (st, 0, 0, 0),
        (ldx_mem, 0, 0, 0),
        (ld_w_abs, 0, 0, _EXIT_AT),  # pid
        (jeq_x, 0, 1, 0),  # a thread: drop
        (ret_k, 0, 0, 0xFFFFFFFF),
        (ret_k, 0, 0, 0),
    ]
    return b"".join(struct.pack("=HBBI", *ins) for ins in prog)


class ProcEvents:
    """A listening process-events socket (see the module docstring)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.lost = 0  # times the socket's buffer overflowed (exits not told)
        self._prog = ctypes.create_string_buffer(_filter())  # kept alive while attached

    @classmethod
    def open(cls) -> ProcEvents:
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_CONNECTOR)
        try:
            events = cls(sock)
            prog = events._prog
            fprog = struct.pack("HxxxxxxQ", len(prog.raw) // 8, ctypes.addressof(prog))
            sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, fprog)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RCVBUF)
            sock.bind((0, CN_IDX_PROC))
            events._op(PROC_CN_MCAST_LISTEN)
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        return events

    def fileno(self) -> int:
        return self.sock.fileno()

    def drain(self, wanted: Callable[[int], bool]) -> dict[int, int]:
        """The exit statuses queued now, of the pids ``wanted`` says it watches."""
        out: dict[int, int] = {}
        while True:
            try:
                data = self.sock.recv(4096)
            except BlockingIOError:
                return out
            except OSError:  # ENOBUFS: the buffer overflowed, exits were lost
                self.lost += 1
                continue
            if len(data) < _EXIT_AT + _EXIT.size:
                continue
            (what,) = struct.unpack_from("=I", data, _WHAT)
            pid, tgid, status = _EXIT.unpack_from(data, _EXIT_AT)
            if what == PROC_EVENT_EXIT and pid == tgid and wanted(pid):
                out[pid] = status

    def close(self) -> None:
        try:
            self._op(PROC_CN_MCAST_IGNORE)  # the kernel counts listeners until told
        except OSError:
            pass
        self.sock.close()

    def _op(self, op: int) -> None:
        body = _CN_MSG.pack(CN_IDX_PROC, CN_VAL_PROC, 0, 0, 4, 0) + struct.pack("=I", op)
        self.sock.send(_NLMSG.pack(_NLMSG.size + len(body), NLMSG_DONE, 0, 0, 0) + body)


def open_proc_events(timeout: float = 2.0) -> ProcEvents | None:
    """A listening socket that has told a child's exit under the pid this agent knows
    it by, or None: not allowed (not root), no connector in the kernel, or another
    pid or network namespace than the kernel's events (a container's pids are not the
    host's: a pid of the same number would take another process's status)."""
    try:
        events = ProcEvents.open()
    except OSError as err:
        log.info("no process events (%s): exit statuses read from /proc only", err)
        return None
    if sees(events, timeout):
        return events
    log.info("process events carry other pids than this agent's: read from /proc only")
    events.close()
    return None


def sees(events: ProcEvents, timeout: float, argv: tuple[str, ...] = ()) -> bool:
    """Whether ``events`` tells the exit of a child (``argv``: by default ``true``, or
    this interpreter doing nothing) under the pid this process knows it by."""
    true = shutil.which("true")
    child = subprocess.Popen(argv or ((true,) if true else (sys.executable, "-S", "-c", "")))
    child.wait()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        select.select([events], [], [], 0.05)
        if child.pid in events.drain(lambda pid: pid == child.pid):
            return True
    return False

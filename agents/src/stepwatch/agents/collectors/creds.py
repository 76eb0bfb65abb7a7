"""Sender credentials of Unix datagrams: ``SO_PASSCRED`` / ``SCM_CREDENTIALS`` (Linux).

With ``SO_PASSCRED`` set on the receiving socket, the kernel attaches the
sender's pid, uid and gid to every datagram; a process cannot claim another
process's values (only root may send other ids, and then they are checked).
``SO_PEERCRED`` does not help here: it only works on connected sockets.
Where the platform has no ``SO_PASSCRED`` the receiver gets ``None``.
"""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass

_CREDS = struct.Struct("3i")  # struct ucred: pid, uid, gid
_PASSCRED = getattr(socket, "SO_PASSCRED", None)
_SCM_CREDENTIALS = getattr(socket, "SCM_CREDENTIALS", None)
ANCILLARY_BYTES = socket.CMSG_SPACE(_CREDS.size) if hasattr(socket, "CMSG_SPACE") else 0


@dataclass(frozen=True)
class Creds:
    """Who sent a datagram, as the kernel says."""

    pid: int
    uid: int
    gid: int


def enable_passcred(sock: socket.socket) -> bool:
    """Ask the kernel for the sender's credentials on every datagram; False where unsupported."""
    if _PASSCRED is None or not ANCILLARY_BYTES:
        return False
    sock.setsockopt(socket.SOL_SOCKET, _PASSCRED, 1)
    return True


def recv_with_creds(sock: socket.socket, size: int) -> tuple[bytes, Creds | None]:
    """One datagram and its sender's credentials (None when the kernel sent none)."""
    if not ANCILLARY_BYTES:
        return sock.recv(size), None
    data, ancdata, _flags, _addr = sock.recvmsg(size, ANCILLARY_BYTES)
    for level, kind, payload in ancdata:
        if level == socket.SOL_SOCKET and kind == _SCM_CREDENTIALS and len(payload) >= _CREDS.size:
            pid, uid, gid = _CREDS.unpack_from(payload)
            return data, Creds(pid, uid, gid)
    return data, None

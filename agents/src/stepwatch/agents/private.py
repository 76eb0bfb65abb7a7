"""The agent's files on disk are its own: the spool and its dead letters.

The spool holds every record the agent has not delivered yet, and the agent
often runs as root. A spool directory another user can write to would let that
user plant a segment or a symlink: the agent then "recovered" a planted file as
a torn segment (truncating whatever it pointed at), appended frames to it,
wrote its ack through a planted ``ack.tmp`` link, and replayed planted records
as telemetry. So the directory is created 0700; an existing one must belong to
the agent's user (or root) and be writable by no one else, else the agent
refuses to start; its files are opened without following links and created
0600. What others could read (a directory 0755 from an older version) is
tightened, with a log line.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

from stepwatch.errors import SpoolError

log = logging.getLogger(__name__)

DIR_MODE = 0o700
FILE_MODE = 0o600
_OTHERS_WRITE = stat.S_IWGRP | stat.S_IWOTH
_OTHERS = stat.S_IRWXG | stat.S_IRWXO


def private_dir(path: Path, what: str = "spool directory") -> None:
    """Create ``path`` 0700, or check that an existing one is the agent's alone."""
    if not path.exists():
        path.mkdir(parents=True, mode=DIR_MODE)
        os.chmod(path, DIR_MODE)  # mkdir's mode is masked by the umask
        return
    st = path.stat()
    if not stat.S_ISDIR(st.st_mode):
        raise SpoolError(f"{what} {path} is not a directory")
    if st.st_uid not in (os.geteuid(), 0):
        raise SpoolError(
            f"{what} {path} belongs to uid {st.st_uid}, not to the agent or root: refusing it"
        )
    if st.st_mode & _OTHERS_WRITE:
        raise SpoolError(
            f"{what} {path} is writable by others (mode {stat.S_IMODE(st.st_mode):o}): "
            "refusing it (chmod go-w, or give the agent a directory of its own)"
        )
    if st.st_mode & _OTHERS and st.st_uid == os.geteuid():
        os.chmod(path, stat.S_IMODE(st.st_mode) & ~_OTHERS)
        log.warning("%s tightened path=%s mode=%o", what, path, stat.S_IMODE(st.st_mode) & ~_OTHERS)


def regular_file(path: Path) -> None:
    """Refuse an entry of the directory that is a link or not a plain file."""
    st = path.lstat()
    if not stat.S_ISREG(st.st_mode):
        raise SpoolError(f"spool entry {path} is not a plain file (a link?): refusing it")


def open_private(path: Path, flags: int) -> int:
    """``os.open`` that never follows a link at ``path`` and creates the file 0600."""
    return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE)


def append_file(path: Path) -> int:
    return open_private(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)


def write_file(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` (created 0600, truncated; never through a link)."""
    fd = open_private(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    with os.fdopen(fd, "wb") as f:
        f.write(data)

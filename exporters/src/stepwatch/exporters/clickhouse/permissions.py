"""The embedded store's files are its owner's alone: directory 0700, files 0600.

The store holds what the endpoint's password protects; a world-readable copy
on disk would make the password moot (any local user could open it with chdb).
The owner's process therefore runs with umask 077 from the moment it opens a
store (the engine writes new parts all the time), the directory is created
0700, and an existing store with looser modes is tightened on open, with a
log line saying what changed.
"""

from __future__ import annotations

import logging
import os
import stat

log = logging.getLogger(__name__)

PRIVATE_UMASK = 0o077
_LOOSE = stat.S_IRWXG | stat.S_IRWXO


def private_umask() -> None:
    """Files this process creates from now on are not readable by group or others."""
    old = os.umask(PRIVATE_UMASK)
    if old & PRIVATE_UMASK != PRIVATE_UMASK:
        log.debug("store owner umask set umask=%03o was=%03o", PRIVATE_UMASK, old)


def secure_store_dir(path: str, *, create: bool) -> int:
    """Create ``path`` 0700, or tighten an existing store; returns how many modes changed."""
    private_umask()
    if create:
        os.makedirs(path, mode=0o700, exist_ok=True)
    if not os.path.isdir(path):
        return 0
    changed = 0
    for root, dirs, files in os.walk(path):
        for name in (root, *(os.path.join(root, f) for f in (*dirs, *files))):
            changed += _tighten(name)
    if changed:
        log.warning("store permissions tightened path=%s entries=%d mode=go-rwx", path, changed)
    return changed


def _tighten(name: str) -> int:
    try:
        st = os.lstat(name)
        if stat.S_ISLNK(st.st_mode) or not st.st_mode & _LOOSE:
            return 0
        os.chmod(name, stat.S_IMODE(st.st_mode) & ~_LOOSE)
        return 1
    except OSError as err:  # not ours (a reader's open): leave it, say so once per entry
        log.debug("cannot tighten store entry path=%s error=%s", name, err)
        return 0

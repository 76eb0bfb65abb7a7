"""The spool and its dead letters are the agent's alone (agents/private.py).

Before: the spool directory was created with the umask (0755, files 0644), an
existing one was used whoever owned it, and files were opened following links.
A user who could write there planted ``99999999999999999999.seg -> victim``:
the agent "recovered" the victim as a torn segment (truncated it to 0 bytes)
and appended its frames to it; ``ack.tmp -> victim2`` had victim2 overwritten
every second.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from stepwatch.agents.deadletter import DeadLetters
from stepwatch.agents.spool import ACK_FILE, LOCK_FILE, Spool
from stepwatch.errors import SpoolError

NOBODY = 65534


def rec(i: int) -> tuple[str, bytes, bytes, int]:
    return ("t", b"k", f"{i}".encode(), 0)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_new_spool_is_private(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool", 2**20)
    spool.append([rec(1)])
    spool.persist()
    spool.close()
    d = tmp_path / "spool"
    assert mode(d) == 0o700
    assert {p.name: mode(p) for p in d.iterdir()} == {
        "00000000000000000000.seg": 0o600,
        ACK_FILE: 0o600,
        LOCK_FILE: 0o600,
    }


@pytest.mark.parametrize("loose", [0o777, 0o1777, 0o770])
def test_a_spool_directory_others_can_write_is_refused(tmp_path: Path, loose: int) -> None:
    d = tmp_path / "spool"
    d.mkdir()
    d.chmod(loose)
    with pytest.raises(SpoolError, match="writable by others"):
        Spool(d, 2**20)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give the directory away")
def test_a_spool_directory_of_another_user_is_refused(tmp_path: Path) -> None:
    d = tmp_path / "spool"
    d.mkdir(mode=0o700)
    os.chown(d, NOBODY, NOBODY)
    with pytest.raises(SpoolError, match=f"belongs to uid {NOBODY}"):
        Spool(d, 2**20)


def test_a_readable_spool_directory_is_tightened(tmp_path: Path) -> None:
    d = tmp_path / "spool"
    d.mkdir()
    d.chmod(0o755)
    Spool(d, 2**20).close()
    assert mode(d) == 0o700


def test_a_planted_segment_link_is_refused_and_its_target_untouched(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious" * 55)
    d = tmp_path / "spool"
    d.mkdir(mode=0o700)
    (d / "99999999999999999999.seg").symlink_to(victim)
    with pytest.raises(SpoolError, match="not a plain file"):
        Spool(d, 2**20)
    assert victim.read_bytes() == b"precious" * 55


def test_a_planted_ack_link_is_replaced_not_written_through(tmp_path: Path) -> None:
    victim = tmp_path / "victim2"
    victim.write_text("keep me")
    d = tmp_path / "spool"
    spool = Spool(d, 2**20)
    (d / (ACK_FILE + ".tmp")).symlink_to(victim)
    spool.append([rec(1)])
    spool.persist()
    spool.close()
    assert victim.read_text() == "keep me"
    assert not (d / ACK_FILE).is_symlink() and mode(d / ACK_FILE) == 0o600


def test_dead_letters_are_private_and_never_written_through_a_link(tmp_path: Path) -> None:
    dead = DeadLetters(tmp_path, 2**20)
    dead.put("t", b"k", b"v" * 10, "too_large")
    (path,) = (tmp_path / "dead").iterdir()
    assert mode(tmp_path / "dead") == 0o700 and mode(path) == 0o600
    (tmp_path / "dead").chmod(0o777)  # someone loosened it: refused, counted, not raised
    dead.put("t", b"k", b"v", "too_large")
    assert dead.write_errors == 1 and len(list((tmp_path / "dead").iterdir())) == 1

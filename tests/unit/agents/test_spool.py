"""The on-disk spool: append/read/ack/rewind, crash recovery, the bound, restarts."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from stepwatch.agents.spool import ACK_FILE, Spool, frame
from stepwatch.errors import SpoolError


def recs(start: int, n: int, size: int = 100) -> list[tuple[str, bytes, bytes, int]]:
    return [
        (
            "t.steps",
            f"job-{i % 3}".encode(),
            f"{i:08d}".encode() + b"x" * size,
            1_700_000_000_000 + i,
        )
        for i in range(start, start + n)
    ]


def values(records: list) -> list[int]:
    return [int(value[:8]) for _topic, _key, value, _end, _ts in records]


def drain(spool: Spool, ack: bool = True) -> list[int]:
    out: list[int] = []
    while batch := spool.read(7):
        out += values(batch)
        if ack:
            spool.ack(batch[-1][3])
    return out


def test_append_read_ack_in_order(tmp_path: Path) -> None:
    spool = Spool(tmp_path, 10 * 2**20)
    spool.append(recs(0, 50))
    first = spool.read(20)
    assert values(first) == list(range(20))
    assert first[0][:2] == ("t.steps", b"job-0")
    assert spool.pending() == 50 and spool.unread() == 30
    spool.ack(first[-1][3])
    assert spool.pending() == 30
    spool.append(recs(50, 10))
    assert drain(spool) == list(range(20, 60))
    assert spool.pending() == 0 and spool.stats().bytes == 0


def test_rewind_returns_to_first_unacknowledged(tmp_path: Path) -> None:
    spool = Spool(tmp_path, 10 * 2**20)
    spool.append(recs(0, 30))
    batch = spool.read(30)
    spool.ack(batch[9][3])  # 0..9 delivered, 10..29 in flight and then failed
    assert spool.rewind() == 20
    assert values(spool.read(100)) == list(range(10, 30))
    spool.ack(batch[5][3])  # a stale ack never moves the position back
    assert spool.acked.record == 10


def test_reads_back_from_disk_when_behind(tmp_path: Path) -> None:
    spool = Spool(tmp_path, 10 * 2**20, segment_bytes=2048)  # many small segments
    for i in range(0, 200, 20):
        spool.append(recs(i, 20))
    spool.rewind()  # forces the disk path for everything
    assert drain(spool) == list(range(200))
    assert spool.stats().segments == 1  # acknowledged segments are deleted
    assert len(list(tmp_path.glob("*.seg"))) == 1


def test_restart_resumes_from_persisted_ack(tmp_path: Path) -> None:
    spool = Spool(tmp_path, 10 * 2**20, segment_bytes=4096)
    spool.append(recs(0, 100))
    batch = spool.read(40)
    spool.ack(batch[-1][3])
    spool.close()
    again = Spool(tmp_path, 10 * 2**20, segment_bytes=4096)
    assert again.pending() == 60
    again.append(recs(100, 5))
    assert drain(again) == list(range(40, 105))


def test_unpersisted_acks_are_replayed_after_a_crash(tmp_path: Path) -> None:
    spool = Spool(tmp_path, 10 * 2**20)
    spool.append(recs(0, 10))
    spool.persist()  # ack position 0 on disk
    spool.ack(spool.read(10)[-1][3])  # delivered, but the process dies before persisting
    again = Spool(tmp_path, 10 * 2**20)
    assert drain(again) == list(range(10))  # at-least-once: resent, not lost


def test_torn_last_frame_is_truncated_and_counted(tmp_path: Path) -> None:
    spool = Spool(tmp_path, 10 * 2**20)
    spool.append(recs(0, 5))
    spool.close()
    seg = next(tmp_path.glob("*.seg"))
    whole = seg.stat().st_size
    with open(seg, "ab") as f:  # a crash in the middle of writing record 5
        f.write(frame(*recs(5, 1)[0])[:37])
    again = Spool(tmp_path, 10 * 2**20)
    assert again.stats().torn_frames == 1
    assert seg.stat().st_size == whole
    again.append(recs(6, 2))
    assert drain(again) == [0, 1, 2, 3, 4, 6, 7]


def test_corrupt_crc_in_tail_is_cut_there(tmp_path: Path) -> None:
    spool = Spool(tmp_path, 10 * 2**20)
    spool.append(recs(0, 5))
    spool.close()
    seg = next(tmp_path.glob("*.seg"))
    data = bytearray(seg.read_bytes())
    data[-3] ^= 0xFF  # flip a byte in the last record's value
    seg.write_bytes(bytes(data))
    again = Spool(tmp_path, 10 * 2**20)
    assert again.stats().torn_frames == 1
    assert drain(again) == [0, 1, 2, 3]


def test_corrupt_sealed_segment_is_skipped_and_counted(tmp_path: Path) -> None:
    spool = Spool(tmp_path, 10 * 2**20, segment_bytes=1024)
    for i in range(0, 40, 8):
        spool.append(recs(i, 8))
    spool.close()
    first = sorted(tmp_path.glob("*.seg"))[0]
    data = bytearray(first.read_bytes())
    data[300] ^= 0xFF
    first.write_bytes(bytes(data))
    again = Spool(tmp_path, 10 * 2**20, segment_bytes=1024)
    got = drain(again)
    dropped = again.stats().dropped["corrupt"]
    assert 0 < dropped <= 8
    assert got == [i for i in range(40) if i not in range(8 - dropped, 8)]


def test_bound_drops_oldest_unsent_and_counts(tmp_path: Path) -> None:
    spool = Spool(tmp_path, 16 * 1024, segment_bytes=2048)
    for i in range(0, 400, 10):
        spool.append(recs(i, 10))
    stats = spool.stats()
    on_disk = sum(p.stat().st_size for p in tmp_path.glob("*.seg"))
    assert on_disk <= 16 * 1024
    dropped = stats.dropped["bound"]
    assert dropped > 0
    got = drain(spool)
    assert got == list(range(dropped, 400))  # the oldest went, the rest is intact and in order
    assert stats.records == 400 - dropped


def test_bound_drop_while_reading_skips_to_surviving_data(tmp_path: Path) -> None:
    spool = Spool(tmp_path, 8 * 1024, segment_bytes=1024)
    spool.append(recs(0, 10))
    in_flight = spool.read(5)
    for i in range(10, 200, 10):
        spool.append(recs(i, 10))
    spool.ack(in_flight[-1][3])  # arrives after its segment was dropped: ignored
    got = drain(spool)
    dropped = spool.stats().dropped["bound"]
    assert got == list(range(200 - len(got), 200))
    assert dropped + len(got) == 200  # every record is either delivered or counted as dropped


def test_garbage_ack_file_replays_everything(tmp_path: Path) -> None:
    spool = Spool(tmp_path, 10 * 2**20)
    spool.append(recs(0, 4))
    spool.close()
    (tmp_path / ACK_FILE).write_text("{not json")
    assert drain(Spool(tmp_path, 10 * 2**20)) == [0, 1, 2, 3]


def test_unwritable_directory_is_a_spool_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(SpoolError):
        Spool(blocker / "spool", 2**20)


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores permissions")
def test_read_only_directory_is_a_spool_error(tmp_path: Path) -> None:
    tmp_path.chmod(0o500)
    try:
        with pytest.raises(SpoolError):
            Spool(tmp_path / "spool", 2**20)
    finally:
        tmp_path.chmod(0o700)


def test_memory_tail_is_bounded_and_disk_takes_over(tmp_path: Path) -> None:
    from stepwatch.agents import spool as spool_module

    spool = Spool(tmp_path, 64 * 2**20)
    for i in range(0, spool_module.TAIL_MAX_RECORDS + 500, 500):  # nobody reads: an outage
        spool.append(recs(i, 500))
    assert len(spool._tail) < spool_module.TAIL_MAX_RECORDS
    assert drain(spool) == list(range(spool_module.TAIL_MAX_RECORDS + 500))


def test_event_time_travels_with_each_record_from_memory_and_from_disk(tmp_path) -> None:
    spool = Spool(tmp_path, 10 * 2**20)
    spool.append(recs(0, 3))
    assert [r[4] for r in spool.read(3)] == [1_700_000_000_000 + i for i in range(3)]
    spool.append(recs(3, 2))
    spool.close()
    again = Spool(tmp_path, 10 * 2**20)  # nothing acknowledged: all read back from disk
    assert [r[4] for r in again.read(10)] == [1_700_000_000_000 + i for i in range(5)]


def test_a_tail_cut_below_the_ack_resends_nothing_already_acknowledged(tmp_path: Path) -> None:
    spool = Spool(tmp_path, 10 * 2**20)
    spool.append(recs(0, 50))
    spool.ack(spool.read(50)[-1][3])  # all 50 delivered
    spool.close()
    seg = next(tmp_path.glob("*.seg"))
    one = len(frame(*recs(0, 1)[0]))
    with open(seg, "r+b") as f:  # the disk lost the last 2.5 records after the ack was written
        f.truncate(seg.stat().st_size - 2 * one - one // 2)
    again = Spool(tmp_path, 10 * 2**20)
    assert again.stats().torn_frames == 1
    assert again.pending() == 0  # the 47 kept records were acknowledged: none is sent again
    again.append(recs(50, 3))
    assert drain(again) == [50, 51, 52]


def test_an_ack_inside_a_segment_off_a_boundary_resends_at_most_one_record(tmp_path: Path) -> None:
    spool = Spool(tmp_path, 10 * 2**20)
    spool.append(recs(0, 20))
    spool.close()
    one = len(frame(*recs(0, 1)[0]))
    seg = next(tmp_path.glob("*.seg"))
    ack = {"segment": 0, "offset": 10 * one + 5, "record": 999}
    (tmp_path / ACK_FILE).write_text(json.dumps(ack))
    again = Spool(tmp_path, 10 * 2**20)
    assert drain(again) == list(range(10, 20))
    assert seg.exists()


FULL_DISK = r"""
import glob, json, os, resource, signal, sys
from stepwatch.agents.spool import Spool
from stepwatch.errors import SpoolError
sys.path.insert(0, sys.argv[2])
from tests.unit.agents.test_spool import drain, recs

signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
spool = Spool(sys.argv[1], 10 * 2**20)
spool.append(recs(0, 5))
spool.rewind()  # the reader is behind: what comes next is read back from disk
soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
(segment,) = glob.glob(os.path.join(sys.argv[1], "*.seg"))
resource.setrlimit(resource.RLIMIT_FSIZE, (os.path.getsize(segment) + 150, hard))
failed = 0
try:
    spool.append(recs(5, 3))  # 3 frames of ~130 bytes: the disk takes one and a part
except SpoolError:
    failed = 1
resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))  # the disk has room again
spool.append(recs(100, 4))
print(json.dumps([failed, drain(spool), dict(spool.dropped)]))
"""


def test_an_append_the_disk_takes_part_of_is_cut_and_later_records_are_read(
    tmp_path: Path,
) -> None:
    """A full disk took part of an append's frames; the garbage stayed, every later frame
    sat after it, the reader took it for corruption and skipped them: 0 of 300 steps a job
    sent once the disk had room reached Kafka (red team, a 256 KiB tmpfs)."""
    import subprocess
    import sys

    from tests.support import paths

    root = str(paths.ROOT)
    run = subprocess.run(
        [sys.executable, "-c", FULL_DISK, str(tmp_path / "spool"), root],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    failed, read, dropped = json.loads(run.stdout)
    assert failed == 1  # the append was refused (the agent counts it: spool_error)
    assert read == [0, 1, 2, 3, 4, 100, 101, 102, 103] and dropped == {}

"""RDMA sysfs collector against the recorded fake /sys tree (and modified copies)."""

from __future__ import annotations

import errno
import logging
import shutil
from pathlib import Path
from typing import Any

import pytest

from stepwatch.agents.collectors import rdma as rdma_module
from stepwatch.agents.collectors.base import HealthState, HostContext
from stepwatch.agents.collectors.rdma import RdmaCollector
from stepwatch.agents.collectors.sysfs import parse_counter, parse_rate, parse_state
from stepwatch.contract import EventMessage, EventType, PortMessage, PortReading, decode, encode
from tests.support import paths

FIXTURE = paths.FIXTURES / "sysfs"
IB = FIXTURE / "class" / "infiniband"
NOW = 1_767_225_600.0


def nn(value: Any) -> Any:
    """The value, asserted present (readings are Optional)."""
    assert value is not None
    return value


def ctx(jobs: dict[int, str] | None = None) -> HostContext:
    return HostContext(host="gpu-node-017", now=NOW, job_of_gpu=jobs or {})


def split(messages: list[Any]) -> tuple[PortMessage, list[EventMessage]]:
    ports = [m for m in messages if isinstance(m, PortMessage)]
    assert len(ports) == 1
    return ports[0], [m for m in messages if isinstance(m, EventMessage)]


def by_device(msg: PortMessage) -> dict[str, PortReading]:
    return {p.device: p for p in msg.ports}


def raw(device: str, *parts: str) -> int:
    return int((IB / device / "ports" / "1" / Path(*parts)).read_text())


@pytest.fixture()
def tree(tmp_path: Path) -> Path:
    """A private copy of the fixture tree the test may damage."""
    shutil.copytree(FIXTURE / "class", tmp_path / "class")
    return tmp_path


def port_file(root: Path, device: str, *parts: str) -> Path:
    return root / "class" / "infiniband" / device / "ports" / "1" / Path(*parts)


def test_fixture_tree_parsing_and_x4_data_units() -> None:
    collector = RdmaCollector(str(FIXTURE))
    msg, events = split(collector.collect(ctx({i: "job-1" for i in range(8)})))
    assert events == [] and collector.health().state is HealthState.OK
    ports = by_device(msg)
    assert sorted(ports) == [f"mlx5_{i}" for i in range(9)]
    ib = ports["mlx5_0"]
    assert (ib.port, ib.state, ib.phys_state, ib.rate_gbps) == (1, "ACTIVE", "LinkUp", 400.0)
    assert (ib.link_layer, ib.netdev) == ("InfiniBand", "ibp24s0")
    # sysfs counts 4-byte words: bytes are 4x the file
    assert ib.xmit_bytes_total == 4 * raw("mlx5_0", "counters", "port_xmit_data")
    assert ib.rcv_bytes_total == 4 * raw("mlx5_0", "counters", "port_rcv_data")
    # packets and errors are not scaled
    assert ib.xmit_packets_total == raw("mlx5_0", "counters", "port_xmit_packets")
    assert ib.xmit_wait_total == raw("mlx5_0", "counters", "port_xmit_wait")
    assert ib.vl15_dropped_total == 0 and ib.out_of_buffer_total == 0
    assert ib.np_cnp_sent_total is None  # IB ports have no RoCE congestion counters
    dirty = ports["mlx5_3"]
    assert (dirty.symbol_error_total, dirty.link_error_recovery_total) == (17, 2)
    assert dirty.local_ack_timeout_err_total == 1
    roce = ports["mlx5_8"]
    assert (roce.link_layer, roce.netdev, roce.rate_gbps) == ("Ethernet", "ens6f0np0", 200.0)
    assert roce.np_cnp_sent_total == 1_234_567 and roce.rp_cnp_handled_total == 987_654
    assert roce.np_ecn_marked_roce_packets_total == 2_345_678 and roce.out_of_buffer_total == 78
    assert msg.job_id == "job-1"
    decode(encode(msg), now=lambda: NOW)


def test_garbled_files_are_none_counted_logged_once(
    tree: Path, caplog: pytest.LogCaptureFixture
) -> None:
    port_file(tree, "mlx5_2", "counters", "symbol_error").write_text("garbage\n")
    port_file(tree, "mlx5_2", "hw_counters", "out_of_sequence").write_text("")
    port_file(tree, "mlx5_4", "rate").write_text("fast\n")
    port_file(tree, "mlx5_5", "state").write_text("4 ACTIVE\n")
    collector = RdmaCollector(str(tree))
    caplog.set_level(logging.WARNING, logger="stepwatch.agents.collectors.rdma")
    for _ in range(3):
        ports = by_device(split(collector.collect(ctx()))[0])
    assert ports["mlx5_2"].symbol_error_total is None
    assert ports["mlx5_2"].out_of_sequence_total is None
    assert ports["mlx5_2"].xmit_bytes_total is not None  # the rest of the port still reads
    assert ports["mlx5_4"].rate_gbps is None and ports["mlx5_4"].state == "ACTIVE"
    assert ports["mlx5_5"].state == ""
    assert ports["mlx5_1"].symbol_error_total == 0
    health = collector.health()
    assert health.state is HealthState.DEGRADED and health.errors_total == 12
    assert collector.error_counts() == {"garbled": 9, "empty": 3}
    assert len([r for r in caplog.records if "sysfs value unusable" in r.getMessage()]) == 4


def test_permission_denied_and_io_errors(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    denied = str(port_file(tree, "mlx5_1", "counters", "port_xmit_wait"))
    real = rdma_module.read_raw

    def read_raw(path: str) -> bytes:
        if path == denied:
            raise PermissionError(errno.EACCES, "Permission denied", path)
        return real(path)

    monkeypatch.setattr(rdma_module, "read_raw", read_raw)
    port_file(tree, "mlx5_6", "counters", "link_downed").unlink()
    port_file(tree, "mlx5_6", "counters", "link_downed").mkdir()  # read() -> EISDIR
    collector = RdmaCollector(str(tree))
    ports = by_device(split(collector.collect(ctx()))[0])
    assert ports["mlx5_1"].xmit_wait_total is None and ports["mlx5_1"].symbol_error_total == 0
    assert ports["mlx5_6"].link_downed_total is None
    assert collector.error_counts() == {"permission_denied": 1, "io_error": 1}
    assert collector.health().state is HealthState.DEGRADED


def test_link_state_change_events(tree: Path) -> None:
    collector = RdmaCollector(str(tree))
    assert split(collector.collect(ctx()))[1] == []
    port_file(tree, "mlx5_5", "state").write_text("1: DOWN\n")
    port_file(tree, "mlx5_5", "phys_state").write_text("3: Disabled\n")
    msg, events = split(collector.collect(ctx({0: "job-1"})))
    assert [(e.type, e.device, e.port, e.detail) for e in events] == [
        (EventType.LINK_STATE, "mlx5_5", 1, "ACTIVE->DOWN")
    ]
    assert events[0].attrs["netdev"] == "ibp170s0" and events[0].job_id == "job-1"
    assert by_device(msg)["mlx5_5"].phys_state == "Disabled"
    assert split(collector.collect(ctx()))[1] == []  # no repeat while it stays down
    port_file(tree, "mlx5_5", "state").write_text("2: INIT\n")
    assert [e.detail for e in split(collector.collect(ctx()))[1]] == ["DOWN->INIT"]
    port_file(tree, "mlx5_5", "state").write_text("4: ACTIVE\n")
    assert [e.detail for e in split(collector.collect(ctx()))[1]] == ["INIT->ACTIVE"]
    assert collector.health().state is HealthState.OK


def test_garbled_state_is_no_news(tree: Path) -> None:
    collector = RdmaCollector(str(tree))
    collector.collect(ctx())
    port_file(tree, "mlx5_0", "state").write_text("\x00\x00garbage")
    assert split(collector.collect(ctx()))[1] == []
    port_file(tree, "mlx5_0", "state").write_text("4: ACTIVE\n")
    assert split(collector.collect(ctx()))[1] == []  # ACTIVE before, ACTIVE after


def test_device_disappearing_and_coming_back(tree: Path) -> None:
    collector = RdmaCollector(str(tree), rediscover_ticks=3)
    split(collector.collect(ctx()))
    saved = tree / "saved_mlx5_7"
    shutil.move(tree / "class" / "infiniband" / "mlx5_7", saved)
    msg, events = split(collector.collect(ctx()))
    assert "mlx5_7" not in by_device(msg) and len(msg.ports) == 8
    assert [(e.device, e.detail) for e in events] == [("mlx5_7", "ACTIVE->ABSENT")]
    assert collector.health().state is HealthState.OK  # a vanished device is news, not a fault
    assert split(collector.collect(ctx()))[1] == []
    shutil.move(saved, tree / "class" / "infiniband" / "mlx5_7")
    seen = []
    for _ in range(3):  # found again at the next rediscovery
        msg, events = split(collector.collect(ctx()))
        seen += [(e.device, e.detail) for e in events]
    assert seen == [("mlx5_7", "ABSENT->ACTIVE")]
    assert len(msg.ports) == 9


def test_file_list_is_cached_between_rediscoveries(tree: Path) -> None:
    hw = port_file(tree, "mlx5_0", "hw_counters", "np_cnp_sent")
    collector = RdmaCollector(str(tree), rediscover_ticks=4)
    collector.collect(ctx())
    hw.write_text("5\n")  # appears after discovery
    values = [
        by_device(split(collector.collect(ctx()))[0])["mlx5_0"].np_cnp_sent_total for _ in range(4)
    ]
    assert values == [None, None, None, 5]


def test_counter_values_follow_the_files(tree: Path) -> None:
    collector = RdmaCollector(str(tree))
    before = by_device(split(collector.collect(ctx()))[0])["mlx5_1"].xmit_bytes_total
    path = port_file(tree, "mlx5_1", "counters", "port_xmit_data")
    path.write_text(str(int(path.read_text()) + 1000) + "\n")
    port_file(tree, "mlx5_1", "rate").write_text("200 Gb/sec (4X HDR)\n")  # link degraded
    after = by_device(split(collector.collect(ctx()))[0])["mlx5_1"]
    assert after.xmit_bytes_total == nn(before) + 4000
    assert after.rate_gbps == 200.0


def test_no_rdma_tree_is_down_not_raised(tmp_path: Path) -> None:
    collector = RdmaCollector(str(tmp_path), rediscover_ticks=10)
    for _ in range(5):
        assert collector.collect(ctx()) == []
    health = collector.health()
    assert health.state is HealthState.DOWN and health.errors_total == 1


def test_sysfs_parsers() -> None:
    assert parse_state(b"4: ACTIVE\n") == "ACTIVE"
    assert parse_state(b"5: LinkUp\n") == "LinkUp"
    assert parse_state(b"3: Disabled") == "Disabled"
    assert parse_rate(b"400 Gb/sec (4X NDR)\n") == 400.0
    assert parse_rate(b"2.5 Gb/sec (1X SDR)\n") == 2.5
    assert parse_counter(b"18446744073709551615\n") == 2**64 - 1
    for bad in (b"", b"garbage", b"ACTIVE", b": ACTIVE", b"4:"):
        with pytest.raises(ValueError):
            parse_state(bad)
    for bad in (b"", b"400", b"fast Gb/sec"):
        with pytest.raises(ValueError):
            parse_rate(bad)
    for bad in (b"", b"\n", b"12abc", b"-1"):
        with pytest.raises(ValueError):
            parse_counter(bad)

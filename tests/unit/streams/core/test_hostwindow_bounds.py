"""A host's port names and link states are bounded by ``MAX_PORT_KEYS``.

Before: every (device, port) a host ever named was kept for as long as it
reported (``links``, the port key table), so a sender that named fresh ports in
every message grew the worker's memory for good: 5,000 new ports a message,
937 MiB after 400 messages.
"""

from __future__ import annotations

from stepwatch.contract import PortMessage, PortReading
from stepwatch.streams.core.hostwindow import MAX_PORT_KEYS, HostWindow

T0 = 1_700_000_000.0


def ports(names: list[str], state: str = "ACTIVE") -> list[PortReading]:
    return [PortReading(device=n, port=1, state=state, link_downed_total=0) for n in names]


def message(i: int, readings: list[PortReading]) -> PortMessage:
    return PortMessage(host="h", ts=T0 + i, seq=i, ports=readings)


def test_fresh_port_names_in_every_message_stop_at_the_bound() -> None:
    win = HostWindow("h", 32)
    real = [f"mlx5_{i}" for i in range(8)]
    for i in range(200):
        win.add(message(i, ports(real + [f"fake{i}_{j}" for j in range(50)])))
    assert len(win._port_keys) == len(win.links) == MAX_PORT_KEYS
    # kept: each of the 256 keys when first seen, and the 8 real ports again in 199 messages
    assert win.ports_dropped == 200 * 58 - (MAX_PORT_KEYS + 8 * 199)
    # the host's real ports are still followed: a link that goes down is found
    found = win.add(message(200, ports(real[:7]) + ports(real[7:], state="DOWN")))
    assert [(inc.device, inc.down) for inc in found] == [("mlx5_7", True)]


def test_a_host_with_a_real_number_of_ports_drops_nothing() -> None:
    win = HostWindow("h", 32)
    names = [f"mlx5_{i}" for i in range(18)]
    for i in range(50):
        win.add(message(i, ports(names)))
    assert win.ports_dropped == 0 and len(win.links) == 18

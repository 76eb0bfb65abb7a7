"""RDMA port collector over sysfs: one PortMessage per tick, plus link events.

Reads every port of every device under ``<sysfs_root>/class/infiniband``: the
standard ``counters/`` (``port_xmit_data``/``port_rcv_data`` count 4-byte
words, multiplied by 4 into ``*_bytes_total``), mlx5 ``hw_counters/`` (RoCE
congestion and transport errors), ``state``, ``phys_state``, ``rate`` and
``link_layer``, and the netdev under ``device/net/``.

The list of files is discovered once and cached; it is rediscovered every
``rediscover_ticks`` polls, and at once when a device disappears. A file absent
at discovery is simply None (IB ports have no RoCE counters). A file that
cannot be read or parsed (permission denied, garbage, empty) is None for that
field, counted, logged once per (file, reason), and makes the tick DEGRADED.
A port whose state changes between ticks yields a LINK_STATE event
(``ACTIVE->DOWN``); a port that vanishes yields ``<state>->ABSENT``, one that
appears later ``ABSENT-><state>``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from stepwatch.agents.collectors.base import HostContext
from stepwatch.agents.collectors.common import HealthTracker, TrackedCollector
from stepwatch.agents.collectors.sysfs import (
    failure_reason,
    list_dir,
    parse_counter,
    parse_rate,
    parse_state,
    parse_word,
    read_raw,
)
from stepwatch.contract import EventMessage, EventType, Message, PortMessage, PortReading
from stepwatch.contract.counters import HW_COUNTERS

log = logging.getLogger(__name__)
T = TypeVar("T")

ABSENT = "ABSENT"

# counters/<file> -> (PortReading field, multiplier)
COUNTERS: tuple[tuple[str, str, int], ...] = (
    ("port_xmit_data", "xmit_bytes_total", 4),
    ("port_rcv_data", "rcv_bytes_total", 4),
    ("port_xmit_packets", "xmit_packets_total", 1),
    ("port_rcv_packets", "rcv_packets_total", 1),
    ("port_xmit_wait", "xmit_wait_total", 1),
    ("symbol_error", "symbol_error_total", 1),
    ("link_downed", "link_downed_total", 1),
    ("link_error_recovery", "link_error_recovery_total", 1),
    ("port_rcv_errors", "rcv_errors_total", 1),
    ("port_rcv_remote_physical_errors", "rcv_remote_physical_errors_total", 1),
    ("port_xmit_discards", "xmit_discards_total", 1),
    ("excessive_buffer_overrun_errors", "excessive_buffer_overrun_errors_total", 1),
    ("local_link_integrity_errors", "local_link_integrity_errors_total", 1),
    ("VL15_dropped", "vl15_dropped_total", 1),
)


class _Gone(Exception):
    """A port's files vanished while reading it."""


@dataclass
class _Port:
    device: str
    port: int
    base: str
    netdev: str = ""
    link_layer: str = ""
    counters: list[tuple[str, str, int]] = field(default_factory=list)  # (field, path, scale)
    last_state: str | None = None


class RdmaCollector(TrackedCollector):
    """The ``rdma`` collector."""

    name = "rdma"

    def __init__(self, sysfs_root: str = "/sys", *, rediscover_ticks: int = 60) -> None:
        self.root = os.path.join(sysfs_root, "class", "infiniband")
        self._rediscover_ticks = max(1, rediscover_ticks)
        self._health = HealthTracker(log)
        self._ports: dict[tuple[str, int], _Port] = {}
        self._discovered = False
        self._ticks = 0

    # ------------------------------------------------------------ Collector
    def collect(self, ctx: HostContext) -> list[Message]:
        self._health.begin_tick()
        try:
            return self._collect(ctx)
        except Exception as err:  # the loop edge: never raise into the agent
            self._health.error("collect", "unexpected", "rdma collect failed: %r", err)
            return []

    def close(self) -> None:
        self._ports.clear()

    # ------------------------------------------------------------ tick
    def _collect(self, ctx: HostContext) -> list[Message]:
        events: list[Message] = []
        discovered = not self._discovered or self._ticks % self._rediscover_ticks == 0
        if discovered:
            self._discover(ctx, events)
        self._ticks += 1
        readings: list[PortReading] = []
        gone = False
        for port in list(self._ports.values()):
            try:
                readings.append(self._read_port(ctx, port, events))
            except _Gone:
                gone = True
        if gone:
            discovered = True
            self._discover(ctx, events)
            live = set(self._ports)
            readings = [r for r in readings if (r.device, r.port) in live]
        if not self._ports:
            if discovered:
                self._health.down("tree", "no_devices", "no RDMA ports under %s", self.root)
            else:
                self._health.still_down()
            return events
        job = _host_job(ctx)
        return [PortMessage(host=ctx.host, ts=ctx.now, job_id=job, ports=readings), *events]

    def _read_port(self, ctx: HostContext, port: _Port, events: list[Message]) -> PortReading:
        base = port.base
        state = self._text(base + "state", parse_state)
        values: dict[str, Any] = {
            "state": state or "",
            "phys_state": self._text(base + "phys_state", parse_state) or "",
            "rate_gbps": self._value(base + "rate", parse_rate),
        }
        for name, path, scale in port.counters:
            value = self._value(path, parse_counter)
            values[name] = value * scale if value is not None and scale != 1 else value
        if state:
            if port.last_state is not None and state != port.last_state:
                events.append(_link_event(ctx, port, port.last_state, state))
            port.last_state = state
        return PortReading(
            device=port.device,
            port=port.port,
            netdev=port.netdev,
            link_layer=port.link_layer,
            **values,
        )

    # ------------------------------------------------------------ file reads
    def _value(self, path: str, parse: Callable[[bytes], T]) -> T | None:
        """Parsed content of ``path``; None (counted) when unreadable or garbled."""
        try:
            raw = read_raw(path)
        except OSError as err:
            reason = failure_reason(err)
            if reason == "missing":
                raise _Gone(path) from err
            self._health.error(path, reason, "sysfs read failed path=%s reason=%s", path, reason)
            return None
        try:
            return parse(raw)
        except (ValueError, UnicodeDecodeError):
            reason = "empty" if not raw.strip() else "garbled"
            self._health.error(
                path,
                reason,
                "sysfs value unusable path=%s reason=%s raw=%r",
                path,
                reason,
                raw[:40],
            )
            return None

    def _text(self, path: str, parse: Callable[[bytes], str]) -> str | None:
        return self._value(path, parse)

    # ------------------------------------------------------------ discovery
    def _discover(self, ctx: HostContext, events: list[Message]) -> None:
        found: dict[tuple[str, int], _Port] = {}
        for device in list_dir(self.root):
            dev_dir = os.path.join(self.root, device)
            netdevs = list_dir(os.path.join(dev_dir, "device", "net"))
            for name in list_dir(os.path.join(dev_dir, "ports")):
                if not name.isdigit():
                    continue
                port = self._discover_port(dev_dir, device, int(name), netdevs)
                found[(device, port.port)] = port
        for key, old in self._ports.items():
            if key in found:
                found[key].last_state = old.last_state
            else:
                events.append(_link_event(ctx, old, old.last_state or "UNKNOWN", ABSENT))
                log.warning("RDMA port disappeared device=%s port=%s", old.device, old.port)
        if self._discovered:
            for key, port in found.items():
                if key not in self._ports:
                    port.last_state = ABSENT
        self._ports = found
        self._discovered = True

    def _discover_port(self, dev_dir: str, device: str, number: int, netdevs: list[str]) -> _Port:
        base = os.path.join(dev_dir, "ports", str(number)) + os.sep
        port = _Port(
            device=device, port=number, base=base, netdev=_netdev(dev_dir, number, netdevs)
        )
        try:
            port.link_layer = parse_word(read_raw(base + "link_layer"))
        except (OSError, ValueError, UnicodeDecodeError):
            port.link_layer = ""
        present = set(list_dir(base + "counters"))
        port.counters = [
            (name, base + "counters/" + fname, scale)
            for fname, name, scale in COUNTERS
            if fname in present
        ]
        present_hw = set(list_dir(base + "hw_counters"))
        port.counters += [
            (fname + "_total", base + "hw_counters/" + fname, 1)
            for fname in HW_COUNTERS
            if fname in present_hw
        ]
        return port


def _netdev(dev_dir: str, port: int, netdevs: list[str]) -> str:
    """The netdev of a port: the only one, else the one whose ``dev_port`` is port-1."""
    if len(netdevs) <= 1:
        return netdevs[0] if netdevs else ""
    for name in netdevs:
        try:
            if (
                parse_counter(read_raw(os.path.join(dev_dir, "device", "net", name, "dev_port")))
                == port - 1
            ):
                return name
        except (OSError, ValueError):
            continue
    return netdevs[0]


def _host_job(ctx: HostContext) -> str | None:
    """The job of the host's NICs: the one job every known GPU belongs to, if any."""
    jobs = set(ctx.job_of_gpu.values())
    return jobs.pop() if len(jobs) == 1 else None


def _link_event(ctx: HostContext, port: _Port, before: str, after: str) -> EventMessage:
    log.warning(
        "RDMA link state change device=%s port=%s change=%s->%s",
        port.device,
        port.port,
        before,
        after,
    )
    return EventMessage(
        host=ctx.host,
        ts=ctx.now,
        type=EventType.LINK_STATE,
        job_id=_host_job(ctx),
        device=port.device,
        port=port.port,
        detail=f"{before}->{after}",
        attrs={"netdev": port.netdev, "link_layer": port.link_layer},
    )

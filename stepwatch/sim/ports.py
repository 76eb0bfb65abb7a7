"""RDMA port samples: one PortMessage per host per tick, ``mlx5_0..7`` port 1.

RoCE ConnectX-7 ports at 400 Gb/s. Byte and packet counters (already in bytes)
rise with the gradient traffic of the ranks behind each NIC (GPU g uses NIC
g x nics/gpus, rail-aligned); a healthy fabric shows a trickle of ECN marks and
CNPs and a little ``xmit_wait``. NIC congestion makes ECN/CNP/``xmit_wait`` on the
congested NIC rise by orders of magnitude (the same-rail peers sending into it
see some ``rp_cnp_handled``); a link flap shows DOWN/Polling while the link is
down, then ``link_downed``, ``link_error_recovery``, symbol errors and transport
retries. Counters are cumulative and start at boot-time values, not zero.
"""

from __future__ import annotations

import numpy as np

from stepwatch.contract import PortMessage, PortReading
from stepwatch.sim import hardware as hw
from stepwatch.sim.activity import Activity
from stepwatch.sim.rows import build_rows
from stepwatch.sim.scenario import FaultKind, Scenario, Target

COUNTERS = (
    "xmit_bytes",
    "rcv_bytes",
    "xmit_packets",
    "rcv_packets",
    "xmit_wait",
    "symbol_error",
    "link_downed",
    "link_error_recovery",
    "rcv_errors",
    "np_cnp_sent",
    "np_ecn_marked",
    "rp_cnp_handled",
    "out_of_sequence",
    "local_ack_timeout_err",
    "packet_seq_err",
    "out_of_buffer",
)

_RENAMED = {"np_ecn_marked": "np_ecn_marked_roce_packets_total"}


#: A host's counters by name (one value per NIC), kept across runs of a job: a NIC's
#: counters do not start again when the job on its host restarts.
Carry = dict[str, dict[str, np.ndarray]]


class PortModel:
    """Per-port counters (index = host x nics_per_node + nic) carried across ticks.

    With ``carry`` the counters of a host seen before continue from where they were,
    and every sample updates ``carry``.
    """

    def __init__(self, sc: Scenario, rng: np.random.Generator, carry: Carry | None = None) -> None:
        self.sc, self.rng = sc, rng
        self.m = m = sc.nodes * sc.nics_per_node
        gpn, npn = sc.gpus_per_node, sc.nics_per_node
        ranks = np.arange(sc.world_size)
        self.port_of_rank = (ranks // gpn) * npn + (ranks % gpn) * npn // gpn
        self.gpus_per_port = np.maximum(np.bincount(self.port_of_rank, minlength=m), 1)
        boot = rng.integers(10**13, 10**15, m).astype(np.float64)
        self.c: dict[str, np.ndarray] = {name: np.zeros(m) for name in COUNTERS}
        self.c["xmit_bytes"] += boot
        self.c["rcv_bytes"] += boot * rng.uniform(0.995, 1.005, m)
        self.c["xmit_packets"] += self.c["xmit_bytes"] // hw.MTU_BYTES
        self.c["rcv_packets"] += self.c["rcv_bytes"] // hw.MTU_BYTES
        self.c["xmit_wait"] += rng.integers(10**8, 10**10, m)
        for name in ("np_cnp_sent", "np_ecn_marked", "rp_cnp_handled"):
            self.c[name] += rng.integers(10**3, 10**5, m)
        self.c["link_downed"] += rng.integers(0, 2, m)  # the boot-time link-up
        self.devices = [hw.nic_device(i % npn) for i in range(m)]
        self.netdevs = [hw.nic_netdev(i % npn) for i in range(m)]
        self.down: set[int] = set()
        self._flapped: set[tuple[int, int]] = set()
        self.carry = carry
        for h, host in enumerate(sc.host_names):
            for name, values in (carry or {}).get(host, {}).items():
                self.c[name][h * npn : (h + 1) * npn] = values

    def _keep(self) -> None:
        if self.carry is None:
            return
        npn = self.sc.nics_per_node
        for h, host in enumerate(self.sc.host_names):
            self.carry[host] = {
                name: v[h * npn : (h + 1) * npn].copy() for name, v in self.c.items()
            }

    def sample(
        self,
        ts: np.ndarray,
        act: Activity,
        active: list[Target],
        flaps: list[tuple[str, int, float, float]],
    ) -> list[PortMessage]:
        sc, rng, m = self.sc, self.rng, self.m
        npn = sc.nics_per_node
        dt = np.bincount(self.port_of_rank, weights=act.dt, minlength=m) / self.gpus_per_port
        steps = (
            np.bincount(self.port_of_rank, weights=act.traffic, minlength=m) / self.gpus_per_port
        )
        nbytes = steps * sc.bytes_per_step
        port_ts = np.repeat(ts[:: sc.gpus_per_node], npn)
        self._flaps(port_ts, flaps)
        up = np.ones(m, dtype=bool)
        up[list(self.down)] = False
        nbytes = np.where(up, nbytes, 0.0)
        busy = np.clip(nbytes / np.maximum(dt * hw.NIC_RATE_GBPS * 1.25e8 * 0.2, 1.0), 0.0, 1.0)
        c = self.c
        c["xmit_bytes"] += nbytes
        c["rcv_bytes"] += nbytes * rng.uniform(0.997, 1.003, m)
        c["xmit_packets"] += np.ceil(nbytes / hw.MTU_BYTES) + rng.poisson(20.0 * dt)
        c["rcv_packets"] += np.ceil(nbytes / hw.MTU_BYTES) + rng.poisson(20.0 * dt)
        c["xmit_wait"] += rng.poisson(600.0 * dt + 4000.0 * busy * dt)
        ecn = rng.poisson(0.4 * busy * dt)
        c["np_ecn_marked"] += ecn
        c["np_cnp_sent"] += ecn
        c["rp_cnp_handled"] += rng.poisson(0.4 * busy * dt)
        self._congestion(active, dt)
        self._keep()
        return self._messages(port_ts)

    def _congestion(self, active: list[Target], dt: np.ndarray) -> None:
        sc, rng, c = self.sc, self.rng, self.c
        npn = sc.nics_per_node
        for target in active:
            if target.fault.kind is not FaultKind.NIC_CONGESTION or target.host is None:
                continue
            h = sc.host_names.index(target.host)
            rate = 2.0e4 * max(target.fault.severity, 0.02)
            for nic in target.nics:
                p = h * npn + nic
                ecn = rng.poisson(rate * dt[p] * rng.lognormal(0.0, 0.3))
                c["np_ecn_marked"][p] += ecn
                c["np_cnp_sent"][p] += int(ecn * 0.9)
                c["rp_cnp_handled"][p] += rng.poisson(0.7 * rate * dt[p])
                c["xmit_wait"][p] += rng.poisson(500.0 * rate * dt[p])
                peers = [q * npn + nic for q in range(sc.nodes) if q != h]
                if peers:
                    share = 0.5 * rate / len(peers)
                    c["rp_cnp_handled"][peers] += rng.poisson(share * dt[peers])

    def _flaps(self, port_ts: np.ndarray, flaps: list[tuple[str, int, float, float]]) -> None:
        sc, rng, c = self.sc, self.rng, self.c
        for i, (host, nic, down, up) in enumerate(flaps):
            p = sc.host_names.index(host) * sc.nics_per_node + nic
            t = float(port_ts[p])
            if down <= t < up:
                self.down.add(p)
            elif t >= up and (i, p) not in self._flapped:
                self._flapped.add((i, p))
                self.down.discard(p)
                c["link_downed"][p] += 1
                c["link_error_recovery"][p] += 1
                c["symbol_error"][p] += rng.integers(20, 200)
                c["rcv_errors"][p] += rng.integers(1, 10)
                c["local_ack_timeout_err"][p] += rng.integers(2, 12)
                c["out_of_sequence"][p] += rng.integers(10, 100)
                c["packet_seq_err"][p] += rng.integers(1, 20)

    def _messages(self, port_ts: np.ndarray) -> list[PortMessage]:
        sc, m = self.sc, self.m
        npn = sc.nics_per_node
        c = {name: arr.astype(np.int64).tolist() for name, arr in self.c.items()}
        up = [p not in self.down for p in range(m)]
        columns = {
            "device": self.devices,
            "port": 1,
            "netdev": self.netdevs,
            "link_layer": "Ethernet",
            "state": ["ACTIVE" if u else "DOWN" for u in up],
            "phys_state": ["LinkUp" if u else "Polling" for u in up],
            "rate_gbps": hw.NIC_RATE_GBPS,
            **{f"{name}_total": c[name] for name in COUNTERS if name not in _RENAMED},
            **{field: c[name] for name, field in _RENAMED.items()},
            "rcv_remote_physical_errors_total": 0,
            "xmit_discards_total": 0,
            "excessive_buffer_overrun_errors_total": 0,
            "local_link_integrity_errors_total": 0,
            "vl15_dropped_total": 0,
            "rp_cnp_ignored_total": 0,
            "implied_nak_seq_err_total": 0,
            "rnr_nak_retry_err_total": 0,
            "duplicate_request_total": 0,
        }
        readings = build_rows(PortReading, columns, m)
        stamps = np.round(port_ts[::npn], 6).tolist()
        return [
            PortMessage(
                host=host, ts=stamps[h], job_id=sc.job_id, ports=readings[h * npn : (h + 1) * npn]
            )
            for h, host in enumerate(sc.host_names)
        ]

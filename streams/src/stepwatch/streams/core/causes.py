"""Cause attribution: join a detection with the recent GPU, port and event samples.

Order of precedence for a rank: hardware (XID 79/48/95, double-bit ECC,
uncorrectable remapped rows) > gpu (bad throttle reasons, power cap, SM clock
below max, heat, other non-user XIDs) > network (link down or errors on the
host's NICs, ECN/CNP or ``xmit_wait`` rates well above the job's other NICs)
> host_input (the data phase holds most of the excess) > gpu "compute" (the
forward/backward/optimizer phases hold most of the excess while GPU, NIC and
input look healthy: that GPU computes slower) > unknown (no phase evidence).
CPU contention (the rank's training thread waited for a CPU for most of its
excess, ``StepRecord.cpu_wait``) is a host-side cause like a slow input
pipeline: ``host_input`` with ``host_reasons=cpu_contention``, checked with the
data phase, before the GPU and NIC symptoms. GPU and NIC
symptoms count only when the rank's GPU/NIC shows them and most of its peers
do not: busy GPUs often sit at their power cap, and a fabric-wide congestion
is not one host's fault.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from stepwatch.contract import EventType
from stepwatch.streams.core.config import DetectConfig
from stepwatch.streams.core.exits import is_peer_failure
from stepwatch.streams.core.gpubatch import gpu_signals_many
from stepwatch.streams.core.hostclock import SampleWindow
from stepwatch.streams.core.hostwindow import (
    BAD_THROTTLE,
    SW_POWER_CAP,
    THROTTLE_NAMES,
    GpuSignals,
    PortSignals,
    median_of,
)
from stepwatch.streams.core.kinds import Cause, Fault
from stepwatch.streams.core.netloc import localize

HARDWARE_XIDS = frozenset({48, 79, 95})
USER_XIDS = frozenset({13, 31, 43})  # most often the application's own fault
MAX_PEER_HOSTS = 16
MIN_SPAN_SECONDS = 5.0  # at least a few agent ticks of samples

Evidence = dict[str, str | float | int | bool | None]
# (cpu_wait, cpu_time) per step at the baseline and now (see slowdown.Slowdown.cpu)
CpuUse = tuple[tuple[float, float], tuple[float, float]]


@dataclass(frozen=True)
class Shares:
    """Where a straggler's excess over its peers sits: shares of it (0..1, None: unknown)
    in the data phase, in the compute phases, and in CPU run-queue wait (the thread
    was ready to run but had no CPU: contention, which lengthens whatever phase it hits)."""

    data: float | None = None
    compute: float | None = None
    cpu: float | None = None
    cpu_evidence: Evidence = field(default_factory=dict)


NO_SHARES = Shares()


@dataclass(frozen=True)
class Attribution:
    cause: Cause
    fault: Fault
    reason: str  # a few words for the summary
    evidence: Evidence = field(default_factory=dict)


UNKNOWN = Attribution(Cause.UNKNOWN, Fault.UNKNOWN, "no GPU, NIC or input signal")


class CauseFinder:
    def __init__(self, cfg: DetectConfig, windows: Mapping[str, SampleWindow]) -> None:
        self.cfg = cfg
        self.windows = windows

    def _range(self, t1: float, span: float | None = None) -> tuple[float, float]:
        span = self.cfg.host_window_seconds if span is None else max(span, MIN_SPAN_SECONDS)
        return t1 - span, t1

    def _gpus(self, host: str, t1: float, span: float | None = None) -> dict[int, GpuSignals]:
        win = self.windows.get(host)
        return win.gpu_signals(*self._range(t1, span)) if win else {}

    def _gpus_of(self, hosts: Iterable[str], t1: float, span: float | None) -> list[GpuSignals]:
        """Every GPU of ``hosts``, host by host (as :meth:`_gpus` reads each), read
        together where they can be (:func:`gpu_signals_many`)."""
        t0, t1 = self._range(t1, span)
        wins = [w for h in hosts if (w := self.windows.get(h)) is not None]
        views = [w.host_view(t0, t1) for w in wins]
        out: list[GpuSignals] = []
        for w, got in zip(wins, gpu_signals_many(views), strict=True):
            out.extend((got if got is not None else w.gpu_signals(t0, t1)).values())
        return out

    def _ports(self, host: str, t1: float, span: float | None = None) -> list[PortSignals]:
        win = self.windows.get(host)
        return win.port_signals(*self._range(t1, span)) if win else []

    def for_rank(
        self,
        host: str,
        gpu: int | None,
        peer_hosts: Iterable[str],
        t1: float,
        shares: Shares = NO_SHARES,
        span: float | None = None,
    ) -> Attribution:
        """Why rank (``host``, ``gpu``) is slow, from samples of the last ``span`` seconds
        (the time the slowdown was seen, so that its symptoms are not diluted)."""
        peers = sorted(h for h in set(peer_hosts) if h != host)[:MAX_PEER_HOSTS]
        gpus = self._gpus(host, t1, span)
        own = gpus.get(gpu) if gpu is not None else None
        hw = hardware_reasons(own)
        if hw:
            return Attribution(Cause.HARDWARE, Fault.SYSTEM, hw[0], {"hardware": ", ".join(hw)})
        host_side = by_host_side(shares, self.cfg.data_share_for_input, "")
        if host_side is not None:
            return host_side
        peer_gpus = [s for i, s in gpus.items() if i != gpu] + self._gpus_of(peers, t1, span)
        found = gpu_reasons(own, peer_gpus, self.cfg)
        if found:
            reasons, ev = found
            return Attribution(Cause.GPU, Fault.SYSTEM, reasons[0], ev)
        net = self._own_nic(host, peers, t1, span)
        if net is not None:
            return net
        return by_phases(shares, self.cfg.data_share_for_input, "", own is not None)

    def _own_nic(
        self, host: str, peers: list[str], t1: float, span: float | None
    ) -> Attribution | None:
        """The host's NIC, against the peers' ports and its own history (see netloc)."""
        t0, t1 = self._range(t1, span)
        sus = localize(
            self.windows, [host, *peers], t0, t1, self.cfg.host_window_seconds, self.cfg, only=host
        )
        if sus is None:
            return None
        return Attribution(Cause.NETWORK, Fault.SYSTEM, sus.reasons[0], sus.evidence)

    def for_host(
        self,
        host: str,
        gpus: list[int],
        peer_hosts: Iterable[str],
        t1: float,
        shares: Shares = NO_SHARES,
        span: float | None = None,
    ) -> Attribution:
        """Why several ranks of one host are slow: its GPUs, its NICs, its input, its compute."""
        peers = sorted(h for h in set(peer_hosts) if h != host)[:MAX_PEER_HOSTS]
        signals = self._gpus(host, t1, span)
        need = self.cfg.data_share_for_input
        for g in gpus:
            hw = hardware_reasons(signals.get(g))
            if hw:
                return Attribution(
                    Cause.HARDWARE,
                    Fault.SYSTEM,
                    f"{hw[0]} on gpu {g}",
                    {"hardware": ", ".join(hw), "gpu": g},
                )
        host_side = by_host_side(shares, need, " of the host")
        if host_side is not None:
            return host_side
        peer_gpus = self._gpus_of(peers, t1, span)
        found = [(g, f) for g in gpus if (f := gpu_reasons(signals.get(g), peer_gpus, self.cfg))]
        if found and len(found) * 2 >= len(gpus):
            g, (reasons, ev) = found[0]
            return Attribution(
                Cause.GPU,
                Fault.SYSTEM,
                f"{reasons[0]} on {len(found)} GPUs",
                {**ev, "gpus_with_symptoms": len(found)},
            )
        net = self._own_nic(host, peers, t1, span)
        if net is not None:
            return net
        return by_phases(shares, need, " of the host", bool(signals))

    def for_job(
        self,
        hosts: Iterable[str],
        t1: float,
        deltas: Mapping[str, float],
        span: float | None = None,
        cpu: CpuUse | None = None,
        cpu_host: str = "",
        lost: float | None = None,
    ) -> Attribution:
        """Why the whole job (or a group) got slower: the component that grew, then its host."""
        hosts = sorted(set(hosts))
        grown = {
            k: v
            for k, v in deltas.items()
            if k in ("data", "compute", "transfer", "collective", "other")
        }
        top = max(grown, key=lambda k: grown[k]) if grown else "step"
        ev: Evidence = {"grew": top}
        t0, t1 = self._range(t1, span)
        if top == "compute":
            all_gpus = self._gpus_of(hosts, t1, span)
            slow = [s for s in all_gpus if severe_gpu(s, self.cfg)]
            if all_gpus and len(slow) >= len(all_gpus) / 2:
                ev["gpus_throttled"] = len(slow)
                ev["gpus"] = len(all_gpus)
                return Attribution(Cause.GPU, Fault.SYSTEM, "GPUs throttled job-wide", ev)
        contention = job_cpu_contention(cpu, deltas.get("step", 0.0) if lost is None else lost)
        if contention is not None:
            return Attribution(
                Cause.HOST_INPUT,
                Fault.SYSTEM,
                f"CPU contention on {cpu_host} (waiting for a CPU)",
                {**ev, **contention, "suspect_host": cpu_host},
            )
        if top != "data":  # waits may hide in compute phases (DDP backward, pipeline forward)
            sus = localize(self.windows, hosts, t0, t1, self.cfg.host_window_seconds, self.cfg)
            if sus is not None:
                return Attribution(
                    Cause.NETWORK,
                    Fault.SYSTEM,
                    f"{sus.reasons[0]} port {sus.port} on {sus.host}",
                    {**ev, **sus.evidence},
                )
        if top in ("collective", "transfer"):
            return Attribution(Cause.NETWORK, Fault.UNKNOWN, "collectives slower", ev)
        if top == "data":
            return Attribution(Cause.HOST_INPUT, Fault.UNKNOWN, "data phase slower", ev)
        if top == "compute":
            return Attribution(Cause.UNKNOWN, Fault.UNKNOWN, "compute slower", ev)
        return Attribution(Cause.UNKNOWN, Fault.UNKNOWN, f"{top} slower", ev)

    def for_stop(
        self,
        host: str,
        gpu: int | None,
        rank: int | None,
        t1: float,
        span: float | None = None,
        *,
        job_id: str,
    ) -> Attribution:
        """Why a rank (or the job) stopped: hardware, GPU, link, or an exception in user code
        (of ``job_id``'s own ranks: another job's, or one naming no job, is not its word)."""
        own = self._gpus(host, t1, span).get(gpu) if gpu is not None else None
        hw = hardware_reasons(own)
        if hw:
            return Attribution(Cause.HARDWARE, Fault.SYSTEM, hw[0], {"hardware": ", ".join(hw)})
        if own is not None and any(x not in USER_XIDS for x in own.xids):
            return Attribution(
                Cause.GPU,
                Fault.SYSTEM,
                f"XID {own.xids[-1]}",
                {"xids": ",".join(map(str, own.xids))},
            )
        down = [p for p in self._ports(host, t1, span) if p.down or p.errors.get("link_downed")]
        if down:
            return Attribution(
                Cause.NETWORK,
                Fault.SYSTEM,
                f"link down on {down[0].device}",
                {"device": down[0].device, "port": down[0].port},
            )
        win = self.windows.get(host)
        if win is not None:
            t0, _ = self._range(t1, span)
            exc = [
                e
                for e in win.events_in(t0, t1, EventType.EXCEPTION)
                if e.job_id == job_id
                and (rank is None or e.rank in (None, rank))
                and not is_peer_failure(e)
            ]
            if exc:
                return Attribution(
                    Cause.USER,
                    Fault.USER,
                    "exception in user code",
                    {"exception": exc[-1].detail[:200]},
                )
        return UNKNOWN

    def has_hardware_signal(self, hosts: Iterable[str], t1: float) -> str | None:
        """A hardware or GPU-fatal signal on any of ``hosts`` in the window, as text."""
        for h in sorted(set(hosts)):
            for index, s in self._gpus(h, t1).items():
                hw = hardware_reasons(s)
                if hw:
                    return f"{hw[0]} on {h} gpu {index}"
            for p in self._ports(h, t1):
                if p.down:
                    return f"link down on {h} {p.device}"
        return None


CPU_SHARE_FOR_CONTENTION = 0.5


def by_host_side(shares: Shares, need: float, where: str) -> Attribution | None:
    """The host that feeds the GPU: its input pipeline (the data phase holds most of the
    excess) or its CPUs (run-queue wait holds most of it: other processes compete for
    the rank's cores). None when neither does."""
    if shares.data is not None and shares.data >= need:
        return Attribution(
            Cause.HOST_INPUT,
            Fault.SYSTEM,
            f"slow data phase{where}",
            {"data_share_of_excess": round(shares.data, 3)},
        )
    if shares.cpu is not None and shares.cpu >= CPU_SHARE_FOR_CONTENTION:
        return Attribution(
            Cause.HOST_INPUT,
            Fault.SYSTEM,
            f"CPU contention{where} (waiting for a CPU)",
            {
                "cpu_wait_share_of_excess": round(shares.cpu, 3),
                "host_reasons": "cpu_contention",
                **shares.cpu_evidence,
            },
        )
    return None


def by_phases(shares: Shares, need: float, where: str, gpu_seen: bool = True) -> Attribution:
    """The phase evidence alone: input pipeline, CPU, compute on the GPU, or nowhere.
    ``gpu_seen``: whether the GPU's samples were there to find nothing in."""
    host_side = by_host_side(shares, need, where)
    if host_side is not None:
        return host_side
    if shares.compute is not None and shares.compute >= 0.5:
        return Attribution(
            Cause.GPU,
            Fault.SYSTEM,
            f"compute longer than peers{where} "
            f"({'GPU telemetry healthy' if gpu_seen else 'no GPU telemetry to say more'})",
            {
                "compute_share_of_excess": round(shares.compute, 3),
                "gpu_reasons": "compute",
                **({} if gpu_seen else {"gpu_telemetry": "none"}),
            },
        )
    return UNKNOWN


def waiting_share(wait: Any, ran: Any) -> Any:
    """``wait / (cpu_time + wait)``: the share of its runnable time a thread waited for a
    CPU (floats or arrays; NaN where nothing was runnable)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.divide(wait, np.add(ran, wait))


def extra_wait(wait: float, ran: float, ref_wait: float, ref_ran: float) -> float:
    """Seconds waited beyond what ``ran`` seconds on a CPU cost at the reference's waiting
    share (its peers', or its own baseline): a thread that only computes more waits more
    in proportion, a contended one waits for a larger share. Without a reference CPU
    time (NaN), the plain difference of the waits."""
    share = float(waiting_share(ref_wait, ref_ran))
    if share != share:
        return wait - ref_wait
    return wait - (ran * share / (1 - share) if share < 1 else wait)


def job_cpu_contention(cpu: CpuUse | None, grew: float) -> Evidence | None:
    """The ranks' waiting share for a CPU rose enough to explain at least half of the
    step time the job lost: evidence, or None."""
    if cpu is None or not grew > 0:
        return None
    (w0, c0), (w1, c1) = cpu
    extra = extra_wait(w1, c1, w0, c0)
    if not extra >= CPU_SHARE_FOR_CONTENTION * grew:  # NaN (nothing measured): no
        return None
    return {
        "host_reasons": "cpu_contention",
        "cpu_wait_excess_s": round(extra, 6),
        "cpu_wait_share_baseline": round(float(waiting_share(w0, c0)), 3),
        "cpu_wait_share_now": round(float(waiting_share(w1, c1)), 3),
    }


def severe_gpu(s: GpuSignals, cfg: DetectConfig) -> bool:
    """A GPU slowed by something wrong on its own evidence (thermal/HW throttle, heat).

    A clock below max or the power cap alone is what busy GPUs do: it never
    explains a job-wide slowdown.
    """
    bad = sum(v for bit, v in s.throttle_share.items() if bit & BAD_THROTTLE)
    return bad >= 0.25 or (s.temp_c is not None and s.temp_c >= cfg.hot_temp_c)


def hardware_reasons(s: GpuSignals | None) -> list[str]:
    if s is None:
        return []
    out = [f"XID {x}" for x in s.xids if x in HARDWARE_XIDS]
    if s.ecc_dbe:
        out.append(f"{s.ecc_dbe} double-bit ECC errors")
    if s.remapped_uncorrectable:
        out.append(f"{s.remapped_uncorrectable} uncorrectable remapped rows")
    return out


def gpu_reasons(
    own: GpuSignals | None, peers: list[GpuSignals], cfg: DetectConfig
) -> tuple[list[str], Evidence] | None:
    """GPU symptoms of ``own`` that most ``peers`` lack, with the numbers."""
    if own is None:
        return None
    reasons: list[str] = []
    ev: Evidence = {}
    for bit, name in THROTTLE_NAMES.items():
        need = 0.5 if bit == SW_POWER_CAP else 0.25
        if not bit & (BAD_THROTTLE | SW_POWER_CAP) or own.throttle_share.get(bit, 0.0) < need:
            continue
        common = sum(1 for p in peers if p.throttle_share.get(bit, 0.0) >= need)
        if peers and common >= len(peers) / 2:
            continue
        reasons.append(f"throttled ({name})")
        ev[f"throttle_{name}_share"] = round(own.throttle_share[bit], 3)
    # like with like: the own low quartile against the peers' low quartiles
    peer_clock = median_of(
        [p.sm_clock_ratio_low for p in peers if p.sm_clock_ratio_low is not None]
    )
    low = own.sm_clock_ratio_low  # a quarter of the samples: the drop may be recent
    if (
        low is not None
        and low < cfg.low_clock_ratio
        and (peer_clock is None or low < peer_clock - 0.02)
    ):
        reasons.append("SM clock below max")
        ev["sm_clock_ratio"] = round(low, 3)
        ev["peer_sm_clock_ratio"] = None if peer_clock is None else round(peer_clock, 3)
    peer_temp = median_of([p.temp_c for p in peers if p.temp_c is not None])
    if (
        own.temp_c is not None
        and own.temp_c >= cfg.hot_temp_c
        and (peer_temp is None or own.temp_c >= peer_temp + 10)
    ):
        reasons.append("hot")
        ev["temp_c"] = round(own.temp_c, 1)
        ev["peer_temp_c"] = None if peer_temp is None else round(peer_temp, 1)
    peer_power = median_of([p.power_ratio for p in peers if p.power_ratio is not None])
    if (
        own.power_ratio is not None
        and own.power_ratio >= cfg.power_cap_ratio
        and (peer_power is None or peer_power < cfg.power_cap_ratio)
    ):
        reasons.append("at power cap")
        ev["power_ratio"] = round(own.power_ratio, 3)
    other_xids = [x for x in own.xids if x not in USER_XIDS and x not in HARDWARE_XIDS]
    if other_xids:
        reasons.append(f"XID {other_xids[-1]}")
        ev["xids"] = ",".join(map(str, other_xids))
    if not reasons:
        return None
    ev["gpu_reasons"] = ", ".join(reasons)
    return reasons, ev

"""Each host's clock against its job's, so that a host's samples are read at the right time.

Every timestamp is its host's clock: a host's GPU and port samples and its
ranks' step records share one clock, and a host whose clock is off from its
peers' (NTP stopped, a VM resumed) has all of them off together. The causes of
an incident are read from the samples of the time it was seen, given on the
job's clock (the latest step end, on the clock of the host most ahead). A host
a minute behind was read a minute into its future: no samples, or the wrong
ones, and in a real case a congested NIC was blamed on a peer host.

The ranks of a synchronous job end each step within milliseconds of each other
(the step's last collective), so the ends of a closed step say how far each
host's clock is off: per step, the end of each host's first rank against the
median over hosts; over the last ``CLOCK_STEPS`` steps, the median of that.
A host off by ``CLOCK_OFFSET_MIN_S`` or more from the clock the job's times are
on gets a shift, and :class:`ShiftedWindows` reads its samples with it. Offsets
below that change nothing (a sample look-back is a minute): a job whose hosts
agree is read exactly as before.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Mapping
from typing import Protocol

import numpy as np

from stepwatch.contract import EventMessage, EventType
from stepwatch.streams.core.hostwindow import GpuSignals, PortSignals
from stepwatch.streams.core.ranks import GroupIndex

CLOCK_STEPS = 9  # steps the offsets are the median of
CLOCK_OFFSET_MIN_S = 5.0  # a host off by less than this is read on the job's clock


class SampleWindow(Protocol):
    """What the detection reads from a host's samples (HostWindow, or a shifted view)."""

    @property
    def gpu_names(self) -> dict[int, str]: ...

    def gpu_signals(self, t0: float, t1: float) -> dict[int, GpuSignals]: ...

    def port_signals(self, t0: float, t1: float, ends_only: bool = False) -> list[PortSignals]: ...

    def events_in(self, t0: float, t1: float, *types: EventType) -> list[EventMessage]: ...

    def rise_start(self, device: str, port: int, t0: float, t1: float, level: float) -> float: ...


class HostClocks:
    """The hosts of one job whose clocks are off: ``shift[host]`` is what to add to a time
    on the job's clock to read it on that host's (absent: nothing)."""

    def __init__(self) -> None:
        self.shift: dict[str, float] = {}
        self._version = -1
        self._names: tuple[str, ...] = ()
        self._firsts = np.zeros(0, np.intp)
        self._ends = np.zeros((CLOCK_STEPS, 0))  # the first rank's end of each host, by step
        self._n = 0

    def update(self, ends: np.ndarray, index: GroupIndex) -> None:
        """A closed step: ``ends`` by rank (NaN: absent), ``index`` the ranks of each host."""
        if len(index.names) < 2:
            return
        if index.version != self._version:
            self._version, self._names = index.version, index.names
            self._firsts = np.array([m[0] for m in index.members], np.intp)
            self._ends = np.full((CLOCK_STEPS, len(index.names)), np.nan)
            self._n = 0
        self._ends[self._n % CLOCK_STEPS] = ends[self._firsts]
        self._n += 1
        if self._n % CLOCK_STEPS == 0:
            self._refresh()

    def _refresh(self) -> None:
        """Each host's offset: per step, its first rank's end against the median over hosts;
        over the steps, the median of that."""
        e = self._ends
        if np.isnan(e).any():
            rows = ~np.isnan(e).all(axis=1)
            if not rows.any():
                return
            with np.errstate(all="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # a host absent throughout
                d = e[rows] - np.nanmedian(e[rows], axis=1, keepdims=True)
                off = np.nanmedian(d, axis=0)
        else:
            off = np.median(e - np.median(e, axis=1, keepdims=True), axis=0)
        top = float(np.nanmax(off))  # the job's times are on the clock most ahead
        self.shift.clear()
        for name, s in zip(self._names, (off - top).tolist(), strict=True):
            if s == s and abs(s) >= CLOCK_OFFSET_MIN_S:
                self.shift[name] = s

    def on_job_clock(self, host: str, t: float) -> float:
        """A time stamped by ``host``, on the job's clock."""
        return t - self.shift.get(host, 0.0)


class ShiftedWindows(Mapping[str, SampleWindow]):
    """The engine's host windows, each read on its host's clock from times on the job's."""

    def __init__(self, windows: Mapping[str, SampleWindow], clocks: HostClocks) -> None:
        self._windows = windows
        self._clocks = clocks

    def get(self, host: str, default: SampleWindow | None = None) -> SampleWindow | None:  # type: ignore[override]
        win = self._windows.get(host)
        if win is None:
            return default
        s = self._clocks.shift.get(host)
        return win if s is None else _Shifted(win, s)

    def __getitem__(self, host: str) -> SampleWindow:
        win = self._windows[host]
        s = self._clocks.shift.get(host)
        return win if s is None else _Shifted(win, s)

    def __iter__(self) -> Iterator[str]:
        return iter(self._windows)

    def __len__(self) -> int:
        return len(self._windows)

    def __contains__(self, host: object) -> bool:
        return host in self._windows


class _Shifted:
    """A host window read ``s`` seconds off the job's clock."""

    def __init__(self, win: SampleWindow, s: float) -> None:
        self._win, self._s = win, s

    @property
    def gpu_names(self) -> dict[int, str]:
        return self._win.gpu_names

    def gpu_signals(self, t0: float, t1: float) -> dict[int, GpuSignals]:
        return self._win.gpu_signals(t0 + self._s, t1 + self._s)

    def port_signals(self, t0: float, t1: float, ends_only: bool = False) -> list[PortSignals]:
        return self._win.port_signals(t0 + self._s, t1 + self._s, ends_only)

    def events_in(self, t0: float, t1: float, *types: EventType) -> list[EventMessage]:
        return self._win.events_in(t0 + self._s, t1 + self._s, *types)

    def rise_start(self, device: str, port: int, t0: float, t1: float, level: float) -> float:
        return self._win.rise_start(device, port, t0 + self._s, t1 + self._s, level) - self._s

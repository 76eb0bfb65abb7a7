"""Each host's clock against its job's, so that a host's samples are read at the right time.

Every timestamp is its host's clock: a host's GPU and port samples and its
ranks' step records share one clock, and a host whose clock is off from its
peers' (NTP stopped, a VM resumed) has all of them off together. The causes of
an incident are read from the samples of the time it was seen, given on the
job's clock (the latest step end, on the clock of the host most ahead). A host
a minute behind was read a minute into its future: no samples, or the wrong
ones, and in a real case a congested NIC was blamed on a peer host.

The ranks of a synchronous job start and end each step within milliseconds of
each other (the step's collectives), so a closed step says how far each host's
clock is off. Per step, each host's start and end (the median of three of its
ranks: its first, middle and last, so that one rank, forged or slow, moves
nothing) against the median over hosts; over the last ``CLOCK_STEPS`` steps,
the median of each, computed every ``REFRESH_STEPS`` steps. A clock moves a
host's starts and ends alike and steadily (within ``AGREE_S``); a pipeline
stage that ends later than its peers but starts with them, or ends that
wander, are no clock. A host off by ``CLOCK_OFFSET_MIN_S`` or more from the
clock the job's times are on gets a shift, and :class:`ShiftedWindows` reads
its samples with it. Offsets below that change nothing (a sample look-back is
a minute): a job whose hosts agree is read exactly as before. A new placement
of ranks on hosts starts over. Each host's offset from the median host (the
clock of the median rank's step times, on which goodput's wall time runs) reads
a ``job_start`` event on that clock (:meth:`HostClocks.on_median_clock`).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Mapping
from typing import Protocol

import numpy as np

from stepwatch.contract import EventMessage, EventType
from stepwatch.streams.core.hostwindow import GpuSignals, PortSignals, View
from stepwatch.streams.core.ranks import GroupIndex

CLOCK_STEPS = 9  # steps the offsets are the median of
REFRESH_STEPS = 27  # the offsets are computed again every this many steps
CLOCK_OFFSET_MIN_S = 5.0  # a host off by less than this is read on the job's clock
AGREE_S = 1.0  # a clock moves a host's starts and ends alike, steadily, within this
PROBES = 3  # ranks read on each host (its first, middle and last): one forged rank moves none


def _median3(a: np.ndarray) -> np.ndarray:
    """Row medians of an (n, 3) array, of the values that are not NaN (NaN: none)."""
    s = np.sort(a, axis=1)  # NaN last
    valid = (~np.isnan(a)).sum(axis=1)
    two = (s[:, 0] + s[:, 1]) / 2
    out: np.ndarray = np.where(valid == 3, s[:, 1], np.where(valid == 2, two, s[:, 0]))
    return out


def _nanmedian0(a: np.ndarray) -> np.ndarray:
    """Column medians ignoring NaN (a sort when there is none: several times cheaper)."""
    if not np.isnan(a).any():
        n, s = len(a), np.sort(a, axis=0)  # np.median's own overhead is most of its cost here
        out: np.ndarray = s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2
        return out
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a column with no value
        out = np.nanmedian(a, axis=0)
    return out


class SampleWindow(Protocol):
    """What the detection reads from a host's samples (HostWindow, or a shifted view)."""

    @property
    def gpu_names(self) -> dict[int, str]: ...

    def gpu_signals(self, t0: float, t1: float) -> dict[int, GpuSignals]: ...

    def port_signals(self, t0: float, t1: float, ends_only: bool = False) -> list[PortSignals]: ...

    def host_view(self, t0: float, t1: float) -> View: ...

    def events_in(self, t0: float, t1: float, *types: EventType) -> list[EventMessage]: ...

    def rise_start(self, device: str, port: int, t0: float, t1: float, level: float) -> float: ...


class HostClocks:
    """The hosts of one job whose clocks are off: ``shift[host]`` is what to add to a time
    on the job's clock to read it on that host's (absent: nothing)."""

    def __init__(self) -> None:
        self.shift: dict[str, float] = {}
        self.offset: dict[str, float] = {}  # host -> its offset from the median host's clock
        self.fine: dict[str, float] = {}  # host -> that offset, however small (exits' order)
        self._version = -1
        self._names: tuple[str, ...] = ()
        self._probe = np.zeros((0, PROBES), np.intp)  # the ranks read on each host
        self._starts = np.zeros((CLOCK_STEPS, 0, PROBES))  # the probes' starts, by step
        self._ends = np.zeros((CLOCK_STEPS, 0, PROBES))  # ... and ends
        self._n = 0

    def update(self, starts: np.ndarray, ends: np.ndarray, index: GroupIndex) -> bool:
        """A closed step: ``starts`` and ``ends`` by rank (NaN: absent), ``index`` the ranks
        of each host. True when the offsets were just worked out again."""
        if len(index.names) < 2:
            return False
        if index.version != self._version:  # placement changed: start over
            self._version, self._names = index.version, index.names
            self._probe = np.array([(m[0], m[len(m) // 2], m[-1]) for m in index.members], np.intp)
            self._starts = np.full((CLOCK_STEPS, len(index.names), PROBES), np.nan)
            self._ends = np.full((CLOCK_STEPS, len(index.names), PROBES), np.nan)
            self._n = 0
            self.shift.clear()
            self.offset.clear()
            self.fine.clear()
        row = self._n % CLOCK_STEPS
        self._starts[row] = starts[self._probe]
        self._ends[row] = ends[self._probe]
        self._n += 1
        if self._n % REFRESH_STEPS == CLOCK_STEPS:
            self._refresh()
            return True
        return False

    def _refresh(self) -> None:
        """A host's clock offset: its starts and its ends against the median over hosts,
        each the median over the steps; a clock moves both alike and steadily (a pipeline
        stage that ends later starts as early as its peers)."""
        hosts = len(self._names)
        ends = _median3(self._ends.reshape(-1, PROBES)).reshape(CLOCK_STEPS, hosts)
        starts = _median3(self._starts.reshape(-1, PROBES)).reshape(CLOCK_STEPS, hosts)
        d_end = ends - _nanmedian0(ends.T)[:, None]
        d_start = starts - _nanmedian0(starts.T)[:, None]
        off_end = _nanmedian0(d_end)
        off_start = _nanmedian0(d_start)
        wander = _nanmedian0(np.abs(d_end - off_end))
        with np.errstate(invalid="ignore"):  # NaN: a host never seen, no clock
            clock = (np.abs(off_end - off_start) < AGREE_S) & (wander < AGREE_S)
        offset = np.where(clock, (off_end + off_start) / 2, 0.0)
        top = float(offset.max())  # the job's times are on the clock most ahead
        self.shift.clear()
        self.offset.clear()
        self.fine = dict(zip(self._names, offset.tolist(), strict=True))
        for name, s, o in zip(self._names, (offset - top).tolist(), offset.tolist(), strict=True):
            if abs(s) >= CLOCK_OFFSET_MIN_S:
                self.shift[name] = s
            if abs(o) >= CLOCK_OFFSET_MIN_S:
                self.offset[name] = o

    def on_job_clock(self, host: str, t: float) -> float:
        """A time stamped by ``host``, on the job's clock."""
        return t - self.shift.get(host, 0.0)

    def knows(self, host: str) -> bool:
        """Whether ``host``'s offset was worked out (it runs ranks of the job's placement
        and enough steps closed since it began)."""
        return self._n >= CLOCK_STEPS and host in self._names

    def in_order(self, host: str, t: float) -> float:
        """A time stamped by ``host`` on the median host's clock, corrected however small
        its offset (a second of offset, left alone elsewhere, made a job cancelled on
        every host at once look as if one host's ranks ended first)."""
        return t - self.fine.get(host, 0.0)

    def on_median_clock(self, host: str, t: float) -> float:
        """A time stamped by ``host``, on the median host's clock (the clock of the median
        rank's step times, on which goodput's wall time runs)."""
        return t - self.offset.get(host, 0.0)


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

    def host_view(self, t0: float, t1: float) -> View:
        return self._win.host_view(t0 + self._s, t1 + self._s)

    def events_in(self, t0: float, t1: float, *types: EventType) -> list[EventMessage]:
        return self._win.events_in(t0 + self._s, t1 + self._s, *types)

    def rise_start(self, device: str, port: int, t0: float, t1: float, level: float) -> float:
        return self._win.rise_start(device, port, t0 + self._s, t1 + self._s, level) - self._s

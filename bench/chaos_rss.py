"""The soak's memory report: each service's RSS over time, per-third medians,
fitted slopes and a verdict, plus where the sink's memory is (its /metrics).

A service *levels off* when the least-squares slope of its RSS over the last
third of the run is zero within noise: within two standard errors of zero, or
under ``FLAT_MIB_PER_MIN`` (3 MiB an hour) in magnitude.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

MIB = 2**20
FLAT_MIB_PER_MIN = 0.05

Row = dict[str, float]  # service (or sink memory part) -> bytes
Series = list[tuple[float, Row]]  # (seconds since the soak started, row)


@dataclass(frozen=True)
class Fit:
    """A least-squares line through (minutes, MiB): slope and its standard error."""

    slope: float  # MiB per minute
    stderr: float  # of the slope; inf with fewer than 3 points

    @property
    def flat(self) -> bool:
        return abs(self.slope) <= max(2 * self.stderr, FLAT_MIB_PER_MIN)


def fit(points: Sequence[tuple[float, float]]) -> Fit:
    """Slope of MiB over minutes through ``points`` (seconds, bytes)."""
    if len(points) < 2:
        return Fit(0.0, math.inf)
    xs = [t / 60 for t, _ in points]
    ys = [v / MIB for _, v in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return Fit(0.0, math.inf)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    if len(points) < 3:
        return Fit(slope, math.inf)
    resid = sum((y - my - slope * (x - mx)) ** 2 for x, y in zip(xs, ys, strict=True))
    return Fit(slope, math.sqrt(resid / (len(points) - 2) / sxx))


def thirds(series: Series) -> list[Series]:
    """The samples split into three runs of time (first, middle, last third)."""
    end = series[-1][0] if series else 0.0
    out: list[Series] = [[], [], []]
    for t, row in series:
        out[min(2, int(3 * t / end)) if end > 0 else 0].append((t, row))
    return out


@dataclass(frozen=True)
class Summary:
    """One service over the soak."""

    name: str
    medians: tuple[float, float, float]  # MiB, per third
    whole: Fit
    last: Fit  # over the last third

    @property
    def verdict(self) -> str:
        return "levels off" if self.last.flat else "grows" if self.last.slope > 0 else "shrinks"


def summarize(series: Series, name: str) -> Summary:
    parts = thirds(series)
    medians = tuple(
        statistics.median(r[name] for _, r in p) / MIB if p else math.nan for p in parts
    )
    points = [(t, r[name]) for t, r in series]
    last = [(t, r[name]) for t, r in parts[2]]
    return Summary(name, (medians[0], medians[1], medians[2]), fit(points), fit(last))


def print_table(series: Series, title: str, scale: float = MIB, fmt: str = "8.1f") -> None:
    names = list(series[0][1])
    width = max(8, *(len(n) for n in names))
    print(title)
    print(f"{'t_s':>7} " + " ".join(f"{n:>{width}}" for n in names))
    for t, row in series:
        print(
            f"{t:7.0f} "
            + " ".join(f"{row.get(n, math.nan) / scale:{width}{fmt[1:]}}" for n in names)
        )


def print_summaries(series: Series) -> list[Summary]:
    """Per-third medians, slopes and verdicts for every service; returns them."""
    out = [summarize(series, n) for n in series[0][1]]
    print("per-third RSS medians (MiB), slope over the run and over the last third (MiB/min)")
    print(
        f"{'service':<14} {'1st':>8} {'2nd':>8} {'3rd':>8} {'slope':>8} {'last 1/3':>16}  verdict"
    )
    for s in out:
        last = f"{s.last.slope:+.3f}±{s.last.stderr:.3f}"
        print(
            f"{s.name:<14} {s.medians[0]:8.1f} {s.medians[1]:8.1f} {s.medians[2]:8.1f} "
            f"{s.whole.slope:+8.3f} {last:>16}  {s.verdict}"
        )
    return out


def rss_split(pid: int | None) -> Row:
    """Anonymous and file-backed resident memory of ``pid`` in MiB (``/proc/<pid>/status``).

    File-backed pages are mostly the engine's code (the chdb library is a few
    hundred MiB, faulted in as code paths first run); growth that matters is
    anonymous.
    """
    out: Row = {"anon": math.nan, "file": math.nan}
    if pid is None:
        return out
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in ("RssAnon", "RssFile"):
                    out[key.removeprefix("Rss").lower()] = int(value.split()[0]) / 1024
    except (OSError, ValueError):
        pass
    return out


def soak_loop(
    seconds: float,
    every: float,
    rss: Callable[[], Row],
    inside: Callable[[], Row],
    clock: Callable[[], float],
    sleep: Callable[[float], None],
) -> tuple[Series, Series]:
    """Sample ``rss`` and the sink's ``inside`` every ``every`` seconds for ``seconds``."""
    t0 = clock()
    rss_series: Series = []
    inside_series: Series = []
    while True:
        t = clock() - t0
        rss_series.append((t, rss()))
        inside_series.append((t, inside()))
        if t >= seconds:
            return rss_series, inside_series
        sleep(max(0.0, min(every, seconds - (clock() - t0))))

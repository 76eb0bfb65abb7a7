"""Offline replay: the detection engine over a JSON Lines file of contract messages.

A JSON Lines file is the offline form of a topic (one message per line, the
bytes a producer sends). :func:`replay` decodes each line, validates it like
the stream workers do, feeds it to the same :class:`~stepwatch.streams.core.api.Analyzer`
and ticks the engine on event time: ``now`` is the largest timestamp seen so
far, ticked whenever it advanced by ``tick_seconds``. A silence (a message more
than ``tick_seconds`` after the latest one) is ticked through before the message
that ends it, as a live worker's timer ticks through it (up to
``MAX_GAP_TICKS`` ticks): a hang is judged at its limit, not when the next
message comes. Before, a hung job killed as a whole 2 minutes later was judged
only after the first ``rank_exit`` was read, and that rank, killed with the
rest, was named ``rank_missing`` (exited first) instead of the ``hang`` a live
worker reported at 60 s. A bad line is reported
(line number, reason, detail) to ``on_error`` and skipped; it never stops the
replay. At the end the engine is ticked once more at the last timestamp plus
``end_seconds`` so that the last steps close.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial

from stepwatch.contract import KIND_OF, DetectionMessage, decode
from stepwatch.errors import ContractError
from stepwatch.streams.core.api import Analyzer, JobStats

#: ticks through one silence at most (an hour at 1 s): the hang limit's default is a minute
MAX_GAP_TICKS = 3600

OnDetection = Callable[[DetectionMessage], None]
OnError = Callable[[int, ContractError, bytes], None]


@dataclass
class ReplaySummary:
    lines: int = 0
    messages: int = 0
    malformed: int = 0
    kinds: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)  # reason -> lines
    detections: Counter[str] = field(default_factory=Counter)  # "type/state" -> count
    first_ts: float | None = None
    last_ts: float | None = None
    seconds: float = 0.0
    jobs: list[JobStats] = field(default_factory=list)

    def lines_of_text(self) -> list[str]:
        """A human summary (the CLI prints it)."""
        span = (self.last_ts or 0.0) - (self.first_ts or 0.0)
        rate = self.messages / self.seconds if self.seconds > 0 else 0.0
        out = [
            f"replayed {self.messages} messages from {self.lines} lines in {self.seconds:.2f} s "
            f"({rate:,.0f} messages/s), {span:.0f} s of event time",
            "  by kind: " + (", ".join(f"{k} {v}" for k, v in sorted(self.kinds.items())) or "-"),
            f"  malformed lines: {self.malformed}"
            + (
                " (" + ", ".join(f"{k} {v}" for k, v in sorted(self.errors.items())) + ")"
                if self.errors
                else ""
            ),
            "  detections: "
            + (", ".join(f"{k} {v}" for k, v in sorted(self.detections.items())) or "none"),
        ]
        for s in self.jobs:
            out.append(
                f"  job {s.job_id}: {s.world_size} ranks, last step {s.last_step}, "
                f"step time {_f(s.step_seconds_median, 's')} (straggler-free baseline "
                f"{_f(s.step_seconds_baseline, 's')}), {_f(s.samples_per_second, 'samples/s')}, "
                f"{_f(s.tokens_per_second, 'tokens/s')}, MFU {_pct(s.mfu)}, "
                f"goodput {_pct(s.goodput_ratio)}, hung {s.hung}, open detections "
                f"{s.open_detections}"
            )
            lost = ", ".join(f"{k} {v:,.1f} s" for k, v in s.badput_seconds.items() if v > 0)
            out.append(f"    badput: {lost or 'none'}")
            if s.mfu is None and s.mfu_note:
                out.append(f"    MFU -: {s.mfu_note}")
        return out


def replay(
    lines: Iterable[bytes],
    engine: Analyzer,
    on_detection: OnDetection,
    on_error: OnError,
    *,
    tick_seconds: float = 1.0,
    end_seconds: float = 5.0,
    clock: Callable[[], float] = time.time,
) -> ReplaySummary:
    """Run ``engine`` over ``lines``; see the module docstring."""
    summary = ReplaySummary()
    started = time.perf_counter()
    wall = clock()
    now = 0.0
    last_tick = 0.0

    def emit(found: list[DetectionMessage]) -> None:
        for d in found:
            summary.detections[f"{d.type}/{d.state}"] += 1
            on_detection(d)

    for number, raw in enumerate(lines, start=1):
        summary.lines += 1
        if not raw.strip():
            continue
        try:
            message = decode(raw, now=partial(max, wall, now))
        except ContractError as err:
            summary.malformed += 1
            summary.errors[err.reason] += 1
            on_error(number, err, raw)
            continue
        summary.messages += 1
        summary.kinds[KIND_OF[type(message)].value] += 1
        if summary.first_ts is None or message.ts < summary.first_ts:
            summary.first_ts = message.ts
        if message.ts > now:
            if summary.messages > 1:
                last_tick = _through_silence(engine, emit, now, message.ts, tick_seconds, last_tick)
            now = message.ts
        emit(engine.process(message))
        if now - last_tick >= tick_seconds:
            last_tick = now
            emit(engine.tick(now))
    if summary.messages:
        emit(engine.tick(now + end_seconds))
    summary.last_ts = now or None
    summary.jobs = engine.stats()
    summary.seconds = time.perf_counter() - started
    return summary


def _f(x: float | None, unit: str) -> str:
    if x is None:
        return f"- {unit}"
    return f"{x:,.3g} {unit}" if x < 1000 else f"{x:,.0f} {unit}"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f} %"


def _through_silence(
    engine: Analyzer,
    emit: Callable[[list[DetectionMessage]], None],
    now: float,
    then: float,
    tick_seconds: float,
    last_tick: float,
) -> float:
    """Tick every ``tick_seconds`` from ``now`` (the latest timestamp so far) until before
    ``then`` (the next message's); return the last tick's time."""
    if not tick_seconds > 0:
        return last_tick
    t = max(now, last_tick)
    for _ in range(MAX_GAP_TICKS):
        t += tick_seconds
        if t >= then:
            break
        emit(engine.tick(t))
        last_tick = t
    return last_tick

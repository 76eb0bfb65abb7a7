"""The sink's duplicate filter levels off: its memory follows senders, not messages.

Pushes N encoded messages from K senders (agents: ``host``/``inst``, one GPU
sample a message, ``seq`` counting up) through the sink's real record path
(:class:`stepwatch.exporters.clickhouse.prepare.Preparer`: decode, contract
checks, the duplicate filter, row mapping; no store) and prints, after each
of two message counts with the same K, the filter's entries (senders) and the
process's RSS. Both must stay flat between the two counts. The filter before
issue 15 kept one entry per message up to 1M (about 280 MiB).

Run: ``python bench/bench_sink_dedup.py`` (about a minute on 2 cores);
``--senders``, ``--first``, ``--second`` to change K and the two counts.
"""

from __future__ import annotations

import argparse
import resource
import time

from stepwatch.contract import GpuMessage, GpuReading, encode
from stepwatch.exporters.clickhouse.prepare import Preparer, Record

BATCH = 5000


def rss_mib() -> float:
    """The current resident set size (Linux /proc), MiB."""
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
        return pages * resource.getpagesize() / 2**20
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def push(prep: Preparer, senders: int, start: int, count: int, t0: float) -> None:
    batch: list[Record] = []
    for n in range(start, start + count):
        k, seq = n % senders, n // senders
        msg = GpuMessage(
            host=f"node{k:05d}",
            ts=t0 + seq,
            inst=f"agent-{k}",
            seq=seq,
            gpus=[GpuReading(index=0, power_w=300.0, sm_clock_mhz=1980)],
        )
        batch.append(Record("b.gpu", 0, n, encode(msg)))
        if len(batch) == BATCH:
            prep.prepare(batch)
            batch = []
    if batch:
        prep.prepare(batch)


def entries(prep: Preparer) -> int:
    """The filter's entries (senders; on a checkout from before issue 15: messages remembered)."""
    senders = getattr(prep, "senders", None)
    return len(senders) if senders is not None else len(prep._recent)  # type: ignore[attr-defined]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--senders", type=int, default=2000)
    ap.add_argument("--first", type=int, default=200_000)
    ap.add_argument("--second", type=int, default=1_000_000)
    args = ap.parse_args()
    t0 = time.time() - args.second // args.senders - 60
    prep = Preparer(now=time.time)
    print(f"senders={args.senders}")
    print(f"{'messages':>10} {'filter_entries':>15} {'rss_mib':>8} {'msgs_per_s':>10}")
    done = 0
    for target in (args.first, args.second):
        started = time.perf_counter()
        push(prep, args.senders, done, target - done, t0)
        rate = (target - done) / (time.perf_counter() - started)
        done = target
        print(f"{done:>10} {entries(prep):>15} {rss_mib():>8.1f} {rate:>10.0f}")


if __name__ == "__main__":
    main()

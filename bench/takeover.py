"""Takeover after a stream-worker crash: how long until the survivor resumes the
dead worker's jobs, and how long the survivor's own jobs stall meanwhile.

Per configuration, on a fresh development broker: two ``stepwatch stream``
workers in one group, a live feed of 8 one-node jobs (a step every 0.5 s)
spread over 4 partitions. When both are ready and every job advances, worker
A is killed with SIGKILL. Worker B's ``/metrics`` is scraped every 0.2 s:

* **takeover** — kill → B reports every one of A's jobs at the step the feed
  was producing at the kill (caught up to live);
* **own stall** — the longest time, from 5 s before the kill to 10 s after
  the takeover, during which none of B's own jobs advanced; the same
  measured over 10 s before the kill is the **baseline** (tick + step
  cadence).

Goal (issue 11): takeover <= 20 s, own stall <= 5 s.

Run: ``python bench/takeover.py`` (all configurations, ~1-2 min each;
``--only faust,s6`` to pick). Prints one row per configuration.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import harness
from harness import job_steps, scrape, stream_worker, wait_until
from livefeed import LiveFeed

from stepwatch.daemons.broker import DevBroker
from stepwatch.kafka import ensure_topics
from stepwatch.settings import Settings

PARTITIONS = 4


@dataclass(frozen=True)
class Config:
    name: str
    note: str
    args: tuple[str, ...] = ()
    static: bool = False  # group.instance.id per worker (static membership)


CONFIGS = (
    Config(
        "faust",
        "Faust defaults: session 60 s, heartbeat 3 s, rebalance 60 s",
        ("--session-timeout", "60"),
    ),
    Config("s10", "session 10 s, heartbeat 1.7 s", ("--session-timeout", "10")),
    Config("s6", "session 6 s, heartbeat 1 s (stepwatch default)", ("--session-timeout", "6")),
    Config(
        "s6-r10",
        "session 6 s, rebalance timeout 10 s",
        ("--session-timeout", "6", "--rebalance-timeout", "10"),
    ),
    Config("s3", "session 3 s, heartbeat 0.5 s", ("--session-timeout", "3")),
    Config(
        "s6-static",
        "session 6 s + static membership (group.instance.id)",
        ("--session-timeout", "6"),
        static=True,
    ),
)


@dataclass(frozen=True)
class Result:
    config: Config
    takeover: float | None
    stall: float
    baseline: float
    note: str = ""

    def line(self) -> str:
        took = f"{self.takeover:8.1f}" if self.takeover is not None else "   never"
        ratio = self.stall / self.baseline if self.baseline else float("nan")
        return (
            f"{self.config.name:<10} {took} {self.stall:9.1f} {self.baseline:9.1f} "
            f"{ratio:6.1f}  {self.config.note}{'; ' + self.note if self.note else ''}"
        )


def longest_gap(
    series: list[tuple[float, dict[str, float]]], jobs: set[str], since: float, until: float
) -> float:
    """Longest time in [since, until] without any of ``jobs`` advancing."""
    last_t, last = since, None
    gap = 0.0
    for t, steps in series:
        if t < since or t > until:
            continue
        total = sum(steps.get(j, 0.0) for j in jobs)
        if last is None or total > last:
            gap = max(gap, t - last_t)
            last_t = t
        last = total if last is None else max(last, total)
    return max(gap, until - last_t) if series else float("nan")


def run(config: Config, workdir: Path, limit: float) -> Result:
    workdir.mkdir(parents=True, exist_ok=True)
    with DevBroker(log_path=str(workdir / "broker.log")) as broker:
        settings = Settings.load(
            env={}, bootstrap_servers=broker.bootstrap, topic_prefix="tk", partitions=PARTITIONS
        )
        ensure_topics(settings)
        feed = LiveFeed(broker.bootstrap, "tk").start()
        workers = []
        for name in ("a", "b"):
            extra = list(config.args) + (
                ["-X", f"group.instance.id=bench-{name}"] if config.static else []
            )
            workers.append(
                stream_worker(
                    name, workdir, broker.bootstrap, "tk", PARTITIONS, "bench-takeover", extra
                )
            )
        a, b = workers
        try:
            for w in workers:
                w.proc.start()
            procs = (a.proc, b.proc)
            wait_until(
                "both workers own jobs",
                lambda: (
                    len(job_steps(scrape(a.port))) > 0
                    and len(job_steps(scrape(b.port))) > 0
                    and len(job_steps(scrape(a.port)) | job_steps(scrape(b.port))) == 8
                ),
                180,
                procs,
            )
            time.sleep(12)  # steady state: the baseline window
            own_b = set(job_steps(scrape(b.port)))
            of_a = set(job_steps(scrape(a.port))) - own_b
            series: list[tuple[float, dict[str, float]]] = []
            t_base = time.monotonic()
            while time.monotonic() - t_base < 10:
                series.append((time.monotonic(), job_steps(scrape(b.port))))
                time.sleep(0.2)
            t_kill = time.monotonic()
            live_at_kill = feed.live_step()
            a.proc.kill9()
            takeover = None
            while time.monotonic() - t_kill < limit:
                now = time.monotonic()
                steps = job_steps(scrape(b.port))
                series.append((now, steps))
                if takeover is None and all(steps.get(j, -1) >= live_at_kill - 2 for j in of_a):
                    takeover = now - t_kill
                if takeover is not None and now - t_kill > takeover + 10:
                    break
                time.sleep(0.2)
            end = series[-1][0]
            baseline = longest_gap(series, own_b, t_base, t_kill)
            stall = longest_gap(series, own_b, t_kill - 5, end)
            return Result(
                config, takeover, stall, baseline, f"A had {len(of_a)} jobs, B {len(own_b)}"
            )
        finally:
            feed.stop()
            for w in workers:
                w.proc.kill9()


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--only", help="comma-separated configuration names")
    parser.add_argument("--limit", type=float, default=180.0, help="give up after (s)")
    parser.add_argument("--workdir", help="keep logs here (default: a temporary dir)")
    args = parser.parse_args()
    chosen = [c for c in CONFIGS if not args.only or c.name in args.only.split(",")]
    base = Path(args.workdir or tempfile.mkdtemp(prefix="stepwatch-takeover-"))
    print("takeover after kill -9 of one of two workers (goal: takeover <= 20 s, own stall <= 5 s)")
    print(f"{'config':<10} {'takeover':>8} {'stall_s':>9} {'base_s':>9} {'ratio':>6}  notes")
    for config in chosen:
        try:
            print(run(config, base / config.name, args.limit).line(), flush=True)
        except (TimeoutError, RuntimeError) as err:
            print(f"{config.name:<10} failed: {str(err).splitlines()[0]}", flush=True)
    print(f"logs: {base}")
    return 0


if __name__ == "__main__":
    assert harness.ROOT
    raise SystemExit(main())

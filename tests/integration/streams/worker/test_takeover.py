"""A worker killed with SIGKILL: its peer in the group takes its jobs over.

Two ``stepwatch stream`` workers (session timeout 6 s, the default) share a live
feed of 8 one-node jobs over 4 partitions. Worker A is killed with SIGKILL (no
leave-group, no commit). Worker B must report every one of A's jobs advancing
past the step the feed was producing at the kill, and keep its own jobs going.
The bound is generous (a crash is noticed after the session timeout); the time
it takes is measured in ``bench/takeover.py``, not asserted here.
"""

from __future__ import annotations

import sys
import time

import pytest

from stepwatch.kafka import ensure_topics
from tests.support import paths
from tests.support.stream_support import StreamWorker, wait_for

sys.path.insert(0, str(paths.ROOT / "bench"))
from livefeed import LiveFeed


def steps(worker: StreamWorker) -> dict[str, float]:
    return {lab["job_id"]: v for n, lab, v in worker.samples() if n == "stepwatch_job_last_step"}


@pytest.mark.integration
@pytest.mark.timeout(240)
def test_survivor_takes_over_a_killed_workers_jobs(settings, tmp_path) -> None:
    ensure_topics(settings)
    feed = LiveFeed(settings.bootstrap_servers, settings.topic_prefix).start()
    a = StreamWorker(settings, tmp_path, "a", app_id="it-takeover")
    b = StreamWorker(settings, tmp_path, "b", app_id="it-takeover")
    try:
        a.start(), b.start()
        wait_for(
            "both workers own jobs, all 8 jobs analysed",
            lambda: steps(a) and steps(b) and len(steps(a) | steps(b)) == 8,
            120,
            [a, b],
        )
        time.sleep(3)
        of_a = set(steps(a)) - set(steps(b))
        own_b = steps(b)
        assert of_a and own_b
        live = feed.live_step()
        assert a.proc is not None
        a.proc.kill()
        a.proc.wait(10)
        wait_for(
            "B resumes A's jobs past the kill",
            lambda: all(steps(b).get(job, -1) >= live for job in of_a),
            120,
            [b],
        )
        now = steps(b)
        assert all(now[job] > own_b[job] for job in own_b), (own_b, now)
        assert b.value("stepwatch_stream_assigned_partitions") == settings.partitions
        assert b.value("stepwatch_stream_ready") == 1
    finally:
        feed.stop()
        assert b.stop() == 0, b.log[-3000:]
        a.stop()

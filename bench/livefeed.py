"""A live simulated feed straight into Kafka (no agent): the traffic of the
takeover bench and its integration test. Jobs are spread over the partitions
by their key (the job id), as agents key them."""

from __future__ import annotations

import threading
import time

from stepwatch.contract import KIND_OF, Topics, encode, message_key
from stepwatch.sim import Scenario, simulate
from stepwatch.sim.pacing import paced


class LiveFeed:
    """Publishes ``jobs`` realtime jobs (one node, ``gpus`` ranks each) until stopped."""

    def __init__(
        self,
        bootstrap: str,
        prefix: str,
        jobs: int = 8,
        gpus: int = 2,
        step_seconds: float = 0.5,
        seconds: float = 3600.0,
        seed: int = 1,
    ) -> None:
        self.bootstrap, self.topics = bootstrap, Topics(prefix)
        steps = int(seconds / step_seconds)
        now = time.time()
        self.scenarios = [
            Scenario(
                seed=seed + i,
                job_id=f"live-{i}",
                nodes=1,
                gpus_per_node=gpus,
                nics_per_node=1,
                steps=steps,
                step_seconds=step_seconds,
                hosts=(f"lh{i:02d}",),
                start_ts=now,
                eval_every=0,
                checkpoint_every=0,
                tail_prob=0.0,
            )
            for i in range(jobs)
        ]
        self.step_seconds = step_seconds
        self.started = time.time()
        self.sent = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="livefeed")

    def start(self) -> LiveFeed:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def live_step(self) -> float:
        """The step the feed is producing now."""
        return (time.time() - self.started) / self.step_seconds

    def _run(self) -> None:
        from confluent_kafka import Producer

        producer = Producer(
            {
                "bootstrap.servers": self.bootstrap,
                "linger.ms": 5,
                "log_level": 0,
                "partitioner": "murmur2_random",  # the contract's placement
            }
        )
        start = min(s.start_ts for s in self.scenarios)
        self.started = start
        for message in paced(simulate(*self.scenarios), 1.0, start, self._stop.wait):
            if self._stop.is_set():
                break
            topic = self.topics.for_kind(KIND_OF[type(message)])
            producer.produce(
                topic, encode(message), key=message_key(message), timestamp=int(message.ts * 1000)
            )
            producer.poll(0)
            self.sent += 1
        producer.flush(10)

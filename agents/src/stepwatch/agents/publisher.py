"""The Kafka publisher: a :class:`~stepwatch.agents.sink.MessageSink` with a no-loss on-disk spool.

``send`` encodes each (already sequenced) message and appends it to the
:class:`~stepwatch.agents.spool.Spool`; it never touches the network. A sender thread
reads the spool in order, produces to Kafka (idempotent, lz4, batched; one
topic per kind, keyed by job id or host) and acknowledges spool positions only
when delivery reports confirm them, in order. When the broker is unreachable
or deliveries fail, the sender stops producing, probes the cluster (which also
re-creates missing topics: a restarted development broker has none), then
starts a fresh producer and rewinds to the first unacknowledged record.
Probes back off exponentially with jitter (a fleet of agents does not retry in
lockstep after an outage). While Kafka stays unreachable — from the start,
with a bad ``-X`` setting, or after an outage — a warning is logged at once
and then every ``DOWN_LOG_EVERY`` seconds; ``stats()`` carries the state and
the time of the last confirmed delivery for the agent's ``/metrics``.
Delivery is at-least-once: records in flight when the broker failed may be
sent twice; sequence numbers make that measurable downstream.

A record Kafka will never take is not retried: one larger than the limit
(``max_message_bytes`` and librdkafka's ``message.max.bytes``, checked before
producing, so a poison record left in an old spool is passed on restart), or
one refused for good (too large, invalid), goes to the dead letters
(:mod:`stepwatch.agents.deadletter`, counted) and the records behind it flow.
A small record refused as too large was in a produce batch the broker finds
too large: the batch size is halved (down to ``MIN_BATCH_BYTES``) and the
records resent; only a record still refused at that size is dead-lettered.
"""

from __future__ import annotations

import enum
import logging
import random
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from confluent_kafka import KafkaException

from stepwatch.agents import limits
from stepwatch.agents.deadletter import DeadLetters
from stepwatch.agents.limits import LIBRDKAFKA_MAX_BYTES, PERMANENT, TOO_LARGE
from stepwatch.agents.spool import End, Record, Spool, SpoolStats
from stepwatch.contract import KIND_OF, Kind, Message, Topics, encode, message_key
from stepwatch.errors import SpoolError, StepwatchError
from stepwatch.logs import LogOnce
from stepwatch.settings import Settings

log = logging.getLogger(__name__)

WINDOW = 50_000  # records produced and not yet confirmed
BATCH = 5_000  # records read from the spool per pump
BACKOFF_MIN, BACKOFF_MAX = 0.5, 5.0
JITTER = 0.5  # each wait is the backoff times a uniform factor in [1 - JITTER, 1 + JITTER]
DOWN_LOG_EVERY = 60.0  # while Kafka stays unreachable: one warning this often
GRACE_SECONDS = 5.0  # after an outage: time for in-flight records to land before a reset
PERSIST_EVERY = 1.0  # seconds between writes of the acknowledged position
ProducerFactory = Callable[[dict[str, Any]], Any]
Probe = Callable[[], None]


def jittered(backoff: float, rng: random.Random) -> float:
    """``backoff`` times a uniform factor in [1 - JITTER, 1 + JITTER]."""
    return backoff * rng.uniform(1 - JITTER, 1 + JITTER)


class BrokerState(enum.StrEnum):
    UP = "up"
    SUSPECT = "suspect"  # an error was seen: stop producing, check the cluster
    DOWN = "down"  # unreachable: spooling, probing with backoff


@dataclass(frozen=True)
class PublisherStats:
    state: BrokerState
    accepted: dict[str, int]  # messages taken by send(), by kind
    produced: dict[str, int]  # delivered (confirmed by the broker), by kind
    delivery_failures: dict[str, int]  # by reason (error code name)
    rejected: int  # permanently refused by the broker and dropped
    producer_resets: int
    rewinds: int
    spool: SpoolStats
    extra: dict[str, int] = field(default_factory=dict)
    last_success: float = 0.0  # wall clock of the last confirmed delivery (0: never)
    dead_letters: dict[str, int] = field(default_factory=dict)  # by reason
    batch_splits: int = 0  # times the produce batch size was halved


class _Slot:
    """One produced record awaiting its delivery report; is its own delivery callback."""

    __slots__ = ("end", "gen", "key", "owner", "state", "topic", "value")

    def __init__(
        self,
        owner: KafkaPublisher,
        end: End,
        topic: str,
        gen: int,
        key: bytes = b"",
        value: bytes = b"",
    ) -> None:
        self.owner, self.end, self.topic, self.gen = owner, end, topic, gen
        self.key, self.value = key, value
        self.state = 0  # 0 in flight, 1 delivered, 2 dropped (rejected), -1 failed

    def __call__(self, err: Any, _msg: Any) -> None:
        if err is None:
            self.state = 1
            self.owner._produced[self.topic] += 1
        else:
            self.owner._on_failure(self, err)


def _default_producer(config: dict[str, Any]) -> Any:
    from confluent_kafka import Producer

    return Producer(config)


class KafkaPublisher:
    """Spool-backed, at-least-once Kafka publisher for any number of hosts."""

    def __init__(
        self,
        settings: Settings,
        *,
        spool: Spool | None = None,
        producer_factory: ProducerFactory | None = None,
        probe: Probe | None = None,
        probe_timeout: float = 3.0,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        self.settings = settings
        self.topics = Topics(settings.topic_prefix)
        self._topic_of = {cls: self.topics.for_kind(kind) for cls, kind in KIND_OF.items()}
        self._kind_of_topic = {self.topics.for_kind(k): k.value for k in Kind}
        self.spool = spool or Spool(settings.spool_dir, settings.spool_max_bytes)
        self.dead = DeadLetters(self.spool.dir, settings.agent_dead_letter_max_bytes)
        self._limit = limits.record_limit(settings)
        self._batch_bytes = 0  # 0: the client's batch.size; else halved after a refusal
        self._split_gen = -1
        self._splits = 0
        self._factory = producer_factory or _default_producer
        self._probe = probe or partial(self._ensure_topics, probe_timeout)
        self._clock = clock
        self._log = LogOnce(log)
        self._rdlog = LogOnce(logging.getLogger(__name__ + ".rdkafka"))
        self._producer: Any = None
        self._gen = 0
        self._inflight: deque[_Slot] = deque()
        self._backlog: deque[Record] = deque()
        self._failed: str | None = None
        self._state = BrokerState.DOWN
        self._since_suspect = 0.0
        self._probed = False
        self._next_probe = 0.0
        self._backoff = BACKOFF_MIN
        self._rng = rng or random.Random()
        self._down_since = clock()
        self._next_down_log = 0.0  # the first failure to reach Kafka is logged at once
        self._last_success = 0.0
        self._last_persist = clock()
        self._accepted: Counter[str] = Counter()
        self._produced: Counter[str] = Counter()
        self._failures: Counter[str] = Counter()
        self._rejected = 0
        self._resets = 0
        self._skip: set[int] = set()  # record numbers delivered before a reset
        self._skipped = 0
        self._connected = False
        self._rewinds = 0
        self._wake = threading.Event()
        self._done = threading.Condition()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="stepwatch-publisher", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ MessageSink
    def send(self, messages: Sequence[Message]) -> None:
        """Spool the messages (never blocks on the network, never raises)."""
        if not messages:
            return
        topic_of = self._topic_of
        records = [
            (topic_of[type(m)], message_key(m), encode(m), int(m.ts * 1000)) for m in messages
        ]
        try:
            self.spool.append(records)
        except SpoolError as err:
            self.spool.dropped["spool_error"] += len(records)
            self._log(
                "spool_error",
                "spool write failed, messages dropped count=%d err=%s",
                len(records),
                err,
                level=logging.ERROR,
            )
            return
        self._accepted.update(r[0] for r in records)
        self._wake.set()

    def flush(self, timeout: float = 10.0) -> int:
        """Wait until every spooled record is confirmed; return how many are not."""
        deadline = time.monotonic() + timeout
        self._wake.set()
        with self._done:
            while self.spool.pending() and not self._stopped():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._done.wait(min(left, 0.2))
        return self.spool.pending()

    def close(self, timeout: float = 10.0) -> None:
        """Flush (up to ``timeout``), stop the sender, persist the spool position."""
        left = self.flush(timeout)
        if left:
            log.warning(
                "publisher closing with undelivered records kept in the spool records=%d dir=%s",
                left,
                self.spool.dir,
            )
        self._stopping = True
        self._wake.set()
        self._thread.join(timeout=max(5.0, timeout))
        self._drop_producer(purge=True)
        self.spool.close()

    # ------------------------------------------------------------------ state
    @property
    def state(self) -> BrokerState:
        return self._state

    def stats(self) -> PublisherStats:
        return PublisherStats(
            state=self._state,
            accepted=self._by_kind(self._accepted),
            produced=self._by_kind(self._produced),
            delivery_failures=dict(self._failures),
            rejected=self._rejected,
            producer_resets=self._resets,
            rewinds=self._rewinds,
            spool=self.spool.stats(),
            extra={"resends_skipped": self._skipped},
            last_success=self._last_success,
            dead_letters=dict(self.dead.counts),
            batch_splits=self._splits,
        )

    def _by_kind(self, per_topic: Counter[str]) -> dict[str, int]:
        out: Counter[str] = Counter()
        for topic, n in list(per_topic.items()):
            out[self._kind_of_topic.get(topic, topic)] += n
        return dict(out)

    def _stopped(self) -> bool:
        return not self._thread.is_alive()

    # ------------------------------------------------------------------ sender thread
    def _run(self) -> None:
        while not self._stopping:
            try:
                self._step()
            except Exception as err:  # the sender must survive anything
                self._log("sender", "publisher sender error err=%r", err, level=logging.ERROR)
                self._enter_down(f"sender error: {err!r}")
            self._maybe_persist()
        with self._done:
            self._done.notify_all()

    def _step(self) -> None:
        if self._state is BrokerState.DOWN:
            self._wait_probe()
            return
        producer = self._producer
        sent = self._pump(producer) if self._state is BrokerState.UP else 0
        busy = bool(self._inflight)
        if busy or sent:
            producer.poll(0 if sent else 0.05)
        else:
            self._wake.clear()
            if not self.spool.unread() or self._state is not BrokerState.UP:
                self._wake.wait(0.5)
            producer.poll(0)
        self._advance()
        if self._state is BrokerState.SUSPECT:
            self._check_suspect()

    def _pump(self, producer: Any) -> int:
        room = WINDOW - len(self._inflight)
        if room <= 0:
            return 0
        if not self._backlog:
            self._backlog.extend(self.spool.read(min(room, BATCH)))
        sent = 0
        gen, inflight, backlog, produce = self._gen, self._inflight, self._backlog, producer.produce
        skip = self._skip
        limit = self._limit
        while backlog and sent < room:
            topic, key, value, end, ts = backlog[0]
            slot = _Slot(self, end, topic, gen, key, value)
            if skip and end[2] in skip:  # landed before the last reset: not again
                skip.discard(end[2])
                slot.state = 1
                self._skipped += 1
            elif len(key) + len(value) > limit:
                self._dead_letter(slot, "too_large")
            else:
                try:
                    produce(topic, value, key, on_delivery=slot, timestamp=ts)
                except BufferError:
                    break  # librdkafka's queue is full: serve delivery reports first
                except KafkaException as err:  # refused before sending (size, arguments)
                    name = limits.error_name(err)
                    if name not in PERMANENT:
                        raise
                    self._dead_letter(slot, "too_large" if name in TOO_LARGE else name.lower())
            backlog.popleft()
            inflight.append(slot)
            sent += 1
        return sent

    def _on_failure(self, slot: _Slot, err: Any) -> None:
        if slot.gen != self._gen:
            return  # a report from a producer already reset
        name = err.name()
        if name in TOO_LARGE and self._split_batches(slot, name):
            return
        if name in PERMANENT:
            self._dead_letter(slot, "too_large" if name in TOO_LARGE else name.lower())
            return
        slot.state = -1
        self._failures[name] += 1
        if self._failed is None:
            self._failed = name
            self._log("fail:" + name, "delivery failed, will retry from the spool err=%s", err)
            self._suspect(f"delivery failed: {name}")

    def _dead_letter(self, slot: _Slot, reason: str) -> None:
        """Never retried, never blocking: counted, kept in <spool>/dead, acknowledged in order."""
        slot.state = 2
        self._rejected += 1
        self.spool.dropped["rejected"] += 1
        self.dead.put(slot.topic, slot.key, slot.value, reason)

    def _split_batches(self, slot: _Slot, name: str) -> bool:
        """A small record refused as too large: its produce batch was. Halve the batch
        size and resend (the failure path rewinds); False when the record itself is too
        large at the smallest batch size."""
        current = self._batch_bytes or min(self._limit, LIBRDKAFKA_MAX_BYTES)
        if (len(slot.key) + len(slot.value)) * 2 > current or current // 2 < limits.MIN_BATCH_BYTES:
            return False
        if self._split_gen != self._gen:  # once per producer, however many records failed
            self._split_gen = self._gen
            self._batch_bytes = current // 2
            self._splits += 1
            log.warning(
                "kafka refused a batch as too large, halving the batch size and "
                "resending batch_bytes=%d err=%s",
                self._batch_bytes,
                name,
            )
        slot.state = -1
        self._failures[name] += 1
        if self._failed is None:
            self._failed = name
            self._suspect(f"batch too large: {name}")
        return True

    def _on_error(self, err: Any) -> None:
        name = err.name()
        if err.fatal():
            self._failed = self._failed or name
            self._suspect(f"fatal producer error: {err}")
        elif name == "_ALL_BROKERS_DOWN":
            self._suspect("all brokers down")
        else:
            self._log("error:" + name, "kafka client error err=%s", err)

    def _advance(self) -> None:
        inflight, last = self._inflight, None
        while inflight and inflight[0].state > 0:
            last = inflight.popleft().end
        if last is not None:
            self._last_success = time.time()
            self.spool.ack(last)
            with self._done:
                self._done.notify_all()

    # ------------------------------------------------------------------ outage handling
    def _suspect(self, reason: str) -> None:
        if self._state is BrokerState.UP:
            log.warning(
                "kafka unhealthy, spooling reason=%s spool_records=%d", reason, self.spool.pending()
            )
            self._state = BrokerState.SUSPECT
            self._since_suspect = self._clock()
            self._probed = False

    def _check_suspect(self) -> None:
        """Probe the cluster once; then recover in place, or reset the producer and rewind."""
        if not self._probed:
            try:
                self._probe()
            except Exception as err:
                self._enter_down(f"probe failed: {err}")
                return
            self._probed = True
        if self._failed is None and not self._inflight:
            self._state = BrokerState.UP  # a blip: everything in flight landed
            log.info("kafka reachable again, no reset needed")
        elif self._failed is not None or self._clock() - self._since_suspect > GRACE_SECONDS:
            self._reset_producer()

    def _enter_down(self, reason: str) -> None:
        now = self._clock()
        if self._state is not BrokerState.DOWN:
            self._down_since = now
            self._next_down_log = 0.0
        if now >= self._next_down_log:  # at once, then every DOWN_LOG_EVERY while down
            self._next_down_log = now + DOWN_LOG_EVERY
            log.warning(
                "kafka unreachable, spooling to disk reason=%s down_seconds=%.0f "
                "spool_records=%d bootstrap=%s last_success=%s",
                reason,
                now - self._down_since,
                self.spool.pending(),
                self.settings.bootstrap_servers,
                f"{self._last_success:.0f}" if self._last_success else "never",
            )
        self._drop_producer(purge=True)
        self._state = BrokerState.DOWN
        self._next_probe = now + jittered(self._backoff, self._rng)
        self._backoff = min(BACKOFF_MAX, self._backoff * 2)

    def _wait_probe(self) -> None:
        wait = self._next_probe - self._clock()
        if wait > 0:
            self._wake.wait(min(wait, 0.5))
            self._wake.clear()
            return
        try:
            self._probe()
        except Exception as err:
            self._enter_down(f"probe failed: {err}")
            return
        self._reset_producer()

    def _reset_producer(self) -> None:
        """Fresh producer, rewind to the first unacknowledged record, state UP."""
        self._drop_producer(purge=True)
        self._producer = self._factory(self._producer_config())
        back = self.spool.rewind()
        self._backlog.clear()
        self._failed = None
        self._backoff = BACKOFF_MIN
        self._state = BrokerState.UP
        if self._connected:
            self._resets += 1
        self._connected = True
        self._rewinds += 1 if back else 0
        log.info(
            "kafka ready bootstrap=%s resent_from=%d pending_records=%d",
            self.settings.bootstrap_servers,
            self.spool.acked.record,
            self.spool.pending(),
        )

    def _drop_producer(self, purge: bool) -> None:
        """Retire the producer; remember which in-flight records did land, so the
        resend after the rewind skips them (fewer duplicates, same per-partition order:
        a partition's later records never land after an earlier one failed)."""
        self._gen += 1
        producer, self._producer = self._producer, None
        if producer is not None:
            try:
                if purge:
                    producer.purge()
                producer.flush(0)  # serve the reports still queued
            except Exception as err:
                self._log("purge", "producer purge failed err=%r", err)
        acked = self.spool.acked.record
        self._skip = {r for r in self._skip if r > acked}
        self._skip.update(slot.end[2] for slot in self._inflight if slot.state > 0)
        self._inflight.clear()

    def _producer_config(self) -> dict[str, Any]:
        from stepwatch.kafka import producer_config

        config = producer_config(
            self.settings, error_cb=self._on_error, logger=_RdLogger(self._rdlog)
        )
        if self._batch_bytes:
            config["batch.size"] = self._batch_bytes
        return config

    def _ensure_topics(self, timeout: float) -> None:
        from stepwatch.kafka import ensure_topics

        # the admin client's own log lines go through the same once-per-kind logger
        quiet: Any = {**self.settings.kafka_config, "logger": _RdLogger(self._rdlog)}
        settings = self.settings.replace(kafka_config=quiet)
        try:
            ensure_topics(settings, [self.topics.for_kind(k) for k in Kind], timeout=timeout)
        except StepwatchError:
            raise
        except Exception as err:
            raise StepwatchError(f"kafka probe failed: {err}") from err

    def _maybe_persist(self) -> None:
        now = self._clock()
        if now - self._last_persist < PERSIST_EVERY:
            return
        self._last_persist = now
        try:
            self.spool.persist()
        except SpoolError as err:
            self._log("persist", "cannot persist spool position err=%s", err, level=logging.ERROR)


class _RdLogger(logging.LoggerAdapter[logging.Logger]):
    """librdkafka's log lines, each distinct facility logged once (reconnects are noisy)."""

    def __init__(self, once: LogOnce) -> None:
        super().__init__(logging.getLogger(__name__ + ".rdkafka"), {})
        self._once = once

    def log(self, level: int, msg: object, *args: object, **kwargs: Any) -> None:
        text = str(msg) % args if args else str(msg)
        self._once(text.split(" ", 1)[0], "librdkafka: %s", text, level=min(level, logging.WARNING))

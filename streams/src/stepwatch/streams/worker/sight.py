"""When the worker cannot read a partition, its jobs' silence is not theirs.

The detection core judges hangs on the worker's clock at arrival (a job is hung
when its step records stopped making progress for longer than its limit). While
the broker is down, or this worker is cut off from it, nothing arrives from any
job: before, every job the worker owned was called hung (a ``hang`` for each,
published when the broker came back and resolved a minute later), each one a page
and an input to remediation.

A partition is **unread** while both hold for longer than ``after`` seconds:

* the broker has not answered this worker's fetches of it (the driver says so:
  Kafka's fetch responses come every ``fetch.max.wait`` even when a partition
  has nothing new, so an idle partition is answered, a lost broker is not), and
* no record of it came.

The worker's own publish stalling (the batch handler, and so the consumer,
waits with it) makes every partition unread at once (:meth:`Sight.lose`).

While a partition is unread its core is not ticked: no hang, no step deadline, no
silence resolution. The core runs on **seen time**: the worker's clock less the
time the partition could not be read (:meth:`Sight.clock`), so when it is read
again a job's silence counts only the time the worker could have seen it
report. A job that really hung during the outage is found that much later: its
limit runs on seen time. The few seconds before a partition counts as unread
(``after``) count as seen.
"""

from __future__ import annotations

import logging
import math

log = logging.getLogger(__name__)


class Sight:
    """Whether one partition's input can be read now, and for how long it could not."""

    __slots__ = ("partition", "read_at", "unread_since", "unread_total")

    def __init__(self, partition: int) -> None:
        self.partition = partition
        self.read_at = -math.inf  # the worker's clock when a record of it last came
        self.unread_since: float | None = None  # unread since then (worker's clock)
        self.unread_total = 0.0  # seconds it could not be read, before ``unread_since``

    @property
    def unread(self) -> bool:
        return self.unread_since is not None

    def clock(self, now: float) -> float:
        """Seen time at the worker's ``now``: stands still while the partition is unread."""
        if self.unread_since is not None:
            now = min(now, self.unread_since)
        return now - self.unread_total

    def read(self, now: float) -> None:
        """A record of the partition came at ``now``."""
        self.read_at = now
        if self.unread_since is not None:
            self._regain(now)

    def judge(self, now: float, unanswered_s: float | None, after: float) -> bool:
        """At a tick: is the partition unread now? ``unanswered_s``: seconds since the
        broker last answered a fetch of it (None: answered, or not known)."""
        lost = unanswered_s is not None and unanswered_s > after and now - self.read_at > after
        if lost:
            self.lose(now)
        elif self.unread_since is not None:
            self._regain(now)
        return lost

    def lose(self, now: float) -> None:
        """The partition cannot be read from ``now`` (kept if already unread)."""
        if self.unread_since is None:
            self.unread_since = now
            log.warning(
                "partition input unread partition=%d: its hang checks wait until it is read",
                self.partition,
            )

    def _regain(self, now: float) -> None:
        assert self.unread_since is not None
        gone = max(0.0, now - self.unread_since)
        self.unread_total += gone
        self.unread_since = None
        log.warning(
            "partition input read again partition=%d after %.1f s: that time does not count "
            "against its jobs' hang limits",
            self.partition,
            gone,
        )

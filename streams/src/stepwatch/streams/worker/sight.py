"""When the worker cannot read a partition, its jobs' silence is not theirs.

The detection core judges hangs on the worker's clock at arrival (a job is hung
when its step records stopped making progress for longer than its limit). While
the broker is down, or this worker is cut off from it, nothing arrives from any
job: before, every job the worker owned was called hung (a ``hang`` for each,
published when the broker came back and resolved a minute later), each one a page
and an input to remediation.

A partition (number) is **heard** on an input topic at the later of: the broker's
last answer to this worker's fetch of that topic-partition (the driver's:
Kafka's fetch responses come every ``fetch.max.wait`` even when a partition has
nothing new, so an idle partition is answered and a lost broker is not; none
since the assignment: not heard), and the last record of it processed. It is
**unread** from the moment one of its topics was not heard for ``after``
seconds (counted from its assignment at the earliest), and also:

* while this worker's publish stalls (the consumer waits with it: :meth:`Sight.lose`),
* from a rebalance's revocation (a new assignment is heard only by a new answer),
* from the last tick when ticks stopped for ``after`` seconds (the worker itself
  was paused: a frozen VM, a SIGSTOP, a blocked loop).

It is read again only once every topic was heard *after* it became unread: a
fresh answer or record, never "not known". Where the driver cannot read its
client at all (no hearing given), the hang checks run as before.

While a partition is unread its core is not ticked: no hang, no step deadline, no
silence resolution; records that come meanwhile are stamped with the stopped
clock. The core runs on **seen time**: the worker's clock less the time the
partition could not be read (:meth:`Sight.clock`), so when it is read again a
job's silence counts only the time the worker could have seen it report. A job
that really hung during the outage is found that much later: its limit runs on
seen time (the detection's "no step progress for N s" is seen time too). The
``after`` seconds before a partition counts as unread count as seen.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

log = logging.getLogger(__name__)

NEVER = float("-inf")


class Sight:
    """Whether one partition's input can be read now, and for how long it could not."""

    __slots__ = ("partition", "unread_since", "unread_total")

    def __init__(self, partition: int) -> None:
        self.partition = partition
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

    def judge(self, now: float, heard: Iterable[float] | None, since: float, after: float) -> bool:
        """At a tick: is the partition unread now? ``heard``: when each of its input
        topics was last heard (``NEVER``: not since ``since``, its assignment); None:
        nothing is known (judged read)."""
        if heard is None:
            if self.unread_since is not None:
                self._regain(now)
            return False
        times = list(heard)
        if not times:  # no topic could be read from the client: as not known
            return self.judge(now, None, since, after)
        if any(now - max(t, since) > after for t in times):
            self.lose(now)
            return True
        if self.unread_since is not None:
            if min(times) <= self.unread_since:  # not every topic heard since: wait
                return True
            self._regain(now)
        return False

    def lose(self, when: float) -> None:
        """The partition cannot be read from ``when`` (kept if already unread)."""
        if self.unread_since is None:
            self.unread_since = when
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

"""Ranks that report from another host: a move is decided on evidence that lasts.

A rank's history (its window, CUSUM, flags) belongs to the machine it ran on.
When the rank reports from another host - a requeue on a new allocation, a node
swapped - that history must not be carried over, or an open straggler is
re-attributed to the healthy host the rank now runs on. But a step record's
host is the sender's claim: one forged record must not resolve a real
straggler. So a rank counts as moved only after it reported from its new host
for ``MOVE_STEPS`` closed steps in a row (a record from its old host in
between cancels it), and half the job or more moving at once is a restart only
when the job was also down (a gap of ``RESTART_GAP_STEPS`` steps, at least
``RESTART_GAP_MIN_S``) between its last closed step and the moved records.
"""

from __future__ import annotations

from dataclasses import dataclass

MOVE_STEPS = 3  # closed steps a rank must report from its new host before it counts as moved
RESTART_GAP_STEPS = 3.0  # the job was down this many of its steps ...
RESTART_GAP_MIN_S = 2.0  # ... and at least this long: a restart, not a live move


@dataclass
class _Candidate:
    before: str  # the host the rank's history belongs to
    host: str  # the host it reports from now
    since: int  # the step of its first record from there


class Moves:
    """The ranks of one job that may have moved, and those that moved since the last
    closed step (``burst``: a requeue moves most of the job at once)."""

    def __init__(self) -> None:
        self.candidates: dict[int, _Candidate] = {}
        self.burst: set[int] = set()

    def note(self, moved: list[tuple[int, str]], hosts: list[str], step: int) -> None:
        """``moved``: (rank, its former host) as the rank table saw them; ``hosts``: each
        rank's host now; ``step``: the records' step."""
        for rank, before in moved:
            now = hosts[rank]
            cand = self.candidates.get(rank)
            if cand is None:
                self.candidates[rank] = _Candidate(before, now, step)
            elif now == cand.before:
                del self.candidates[rank]  # back where its history is: nothing moved
                self.burst.discard(rank)
                continue
            elif now != cand.host:
                self.candidates[rank] = _Candidate(cand.before, now, step)
            self.burst.add(rank)

    def settled(self, hosts: list[str], step: int) -> list[tuple[int, str]]:
        """Ranks that reported from their new host for ``MOVE_STEPS`` closed steps up to
        ``step``, with their former host; they are no longer candidates."""
        done = [
            (rank, c.before)
            for rank, c in self.candidates.items()
            if hosts[rank] == c.host and step - c.since >= MOVE_STEPS - 1
        ]
        for rank, _ in done:
            del self.candidates[rank]
        return done

    def restart_gap(self, cadence: float | None) -> float:
        """The least gap (seconds) with which a burst of moves is a restart."""
        return max(RESTART_GAP_MIN_S, RESTART_GAP_STEPS * (cadence or 0.0))

    def clear(self) -> None:
        self.candidates.clear()
        self.burst.clear()

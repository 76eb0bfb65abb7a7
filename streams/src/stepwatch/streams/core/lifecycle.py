"""Detection lifecycle: open -> update* -> resolved, one stable id per incident.

A detection is keyed by (type, rank, where) within its job (``where`` names a
NIC for link flaps and is empty otherwise). ``observe`` opens
it (or keeps it open, emitting a rate-limited ``update`` when the score or the
cause changed materially); ``clear`` counts steps without the condition and
resolves after ``resolve_steps`` of them; ``resolve`` closes at once (progress
resumed, job ended). The id is a hash of job, type, rank, group and the step
it opened at, so a replay of the same data gives the same ids. Each state
change carries its identity in the message header: ``inst`` = the detection id
and ``seq`` = the change's number (0 = the open), so a store de-duplicating on
(host, inst, kind, seq) keeps every change of every detection exactly once.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from stepwatch.contract import DetectionMessage, clip_text
from stepwatch.streams.core.causes import Attribution, Evidence
from stepwatch.streams.core.config import DetectConfig
from stepwatch.streams.core.kinds import Cause, DetectionType, State

Key = tuple[DetectionType, int | None, str]


@dataclass
class Finding:
    """What a detector says now about one (type, rank, group)."""

    type: DetectionType
    score: float | None
    step: int | None
    ts: float
    summary: str
    attribution: Attribution
    rank: int | None = None
    gpu: int | None = None
    group: str = ""
    host: str = ""
    evidence: Evidence = field(default_factory=dict)
    where: str = ""
    device: str | None = None
    port: int | None = None
    ranks: tuple[int, ...] = ()
    related: str = ""
    onset_step: int | None = None  # estimated first step of the fault (None: the open step)

    @property
    def key(self) -> Key:
        return (self.type, self.rank, self.where)


@dataclass
class _Open:
    id: str
    finding: Finding
    first_step: int | None
    opened_at: float
    last_emit: float
    emitted_score: float | None
    emitted_cause: Cause
    clear_steps: int = 0
    changes: int = 0  # state changes emitted so far: the next message's ``seq``
    open_step: int | None = None  # the step it opened at (first_step is the onset)
    last_check: float = 0.0  # event time a finding was last built for it (cause refresh)
    score_now: float | None = None  # its score at the latest step it held (see hold)


class DetectionBook:
    """The open detections of one job."""

    def __init__(self, job_id: str, cfg: DetectConfig) -> None:
        self.job_id = job_id
        self.cfg = cfg
        self.open: dict[Key, _Open] = {}
        self.emitted = 0

    def is_open(self, type_: DetectionType, rank: int | None = None, where: str = "") -> bool:
        return (type_, rank, where) in self.open

    def opened_at(self, key: Key) -> float | None:
        cur = self.open.get(key)
        return None if cur is None else cur.opened_at

    def id_of(self, key: Key) -> str:
        cur = self.open.get(key)
        return "" if cur is None else cur.id

    def keys(self, type_: DetectionType) -> list[Key]:
        return [k for k in self.open if k[0] == type_]

    def observe(self, f: Finding) -> list[DetectionMessage]:
        """The condition holds now: open, or maybe update."""
        cur = self.open.get(f.key)
        if cur is None:
            digest = hashlib.sha1(
                f"{self.job_id}|{f.type}|{f.rank}|{f.where}|{f.step}".encode()
            ).hexdigest()[:16]
            first = f.step
            if f.onset_step is not None and (f.step is None or f.onset_step <= f.step):
                first = f.onset_step
            self.open[f.key] = _Open(
                digest,
                f,
                first,
                f.ts,
                f.ts,
                f.score,
                f.attribution.cause,
                open_step=f.step,
                last_check=f.ts,
                score_now=f.score,
            )
            return [self._message(self.open[f.key], State.OPEN, f)]
        cur.clear_steps = 0
        cur.score_now = f.score
        changed_cause = f.attribution.cause != cur.emitted_cause
        changed_score = _changed(
            cur.emitted_score, f.score, self.cfg.update_score_change, self.cfg.update_score_abs
        )
        cur.finding = f
        # a new cause is published at once; a new score at most every update_min_seconds
        if changed_cause or (changed_score and f.ts - cur.last_emit >= self.cfg.update_min_seconds):
            cur.last_emit = f.ts
            cur.emitted_score = f.score
            cur.emitted_cause = f.attribution.cause
            return [self._message(cur, State.UPDATE, f)]
        return []

    def hold(self, key: Key, ts: float, score: float | None = None) -> bool:
        """The condition of an open detection still holds (its clearing restarts).

        True when an update may be due: the cause is due for a fresh look (every
        ``cause_refresh_seconds`` during the detection's first ``update_min_seconds``,
        every ``update_min_seconds`` after), or the score's rate limit passed and its
        ``score`` now (when the caller knows it before building a :class:`Finding`) moved
        enough for an update: only then is it worth building a new Finding for
        :meth:`observe`. A detection that holds steadily is looked at once per cause
        refresh, not at every step; its resolution carries the Finding of that last look
        (``score_now`` keeps the latest score for the live view).
        """
        cur = self.open.get(key)
        if cur is None:
            return True
        cur.clear_steps = 0
        if score is not None:
            cur.score_now = score
        # young detections are re-decided often (their first cause may have been read
        # early), older ones at the score's pace
        young = ts - cur.opened_at < self.cfg.update_min_seconds
        every = self.cfg.cause_refresh_seconds if young else self.cfg.update_min_seconds
        if ts - cur.last_check >= every:
            cur.last_check = ts
            return True
        if ts - cur.last_emit < self.cfg.update_min_seconds:
            return False
        return score is None or _changed(
            cur.emitted_score, score, self.cfg.update_score_change, self.cfg.update_score_abs
        )

    def clear(self, key: Key, ts: float, step: int | None) -> list[DetectionMessage]:
        """The condition did not hold this step; resolve after ``resolve_steps`` such steps."""
        cur = self.open.get(key)
        if cur is None:
            return []
        cur.clear_steps += 1
        if cur.clear_steps < self.cfg.resolve_steps:
            return []
        return self.resolve(key, ts, step, f"clear for {cur.clear_steps} steps")

    def resolve(self, key: Key, ts: float, step: int | None, why: str) -> list[DetectionMessage]:
        cur = self.open.pop(key, None)
        if cur is None:
            return []
        # never before its own open or last update: a hang opened while a transport outage
        # held the job's messages back was resolved at the backlog's first record, 59 s
        # before it opened
        ts = max(ts, cur.opened_at, cur.last_emit)
        f = cur.finding
        done = Finding(
            f.type,
            f.score,
            step if step is not None else f.step,
            ts,
            f"{f.summary} - resolved: {why}",
            f.attribution,
            f.rank,
            f.gpu,
            f.group,
            f.host,
            {**f.evidence, "resolved_because": why},
            f.where,
            f.device,
            f.port,
            f.ranks,
            f.related,
            f.onset_step,
        )
        return [self._message(cur, State.RESOLVED, done)]

    def resolve_all(self, ts: float, step: int | None, why: str) -> list[DetectionMessage]:
        out: list[DetectionMessage] = []
        for key in list(self.open):
            out.extend(self.resolve(key, ts, step, why))
        return out

    def _message(self, cur: _Open, state: State, f: Finding) -> DetectionMessage:
        self.emitted += 1
        a = f.attribution
        evidence: Evidence = {
            **f.evidence,
            **a.evidence,
            "cause_reason": a.reason,
            "open_step": cur.open_step,
        }
        seq = cur.changes
        cur.changes += 1
        return DetectionMessage(
            host=f.host or "stepwatch",
            ts=f.ts,
            inst=cur.id,
            seq=seq,
            id=cur.id,
            job_id=self.job_id,
            type=f.type.value,
            state=state.value,
            rank=f.rank,
            gpu=f.gpu,
            group=f.group,
            cause=a.cause.value,
            fault=a.fault.value,
            score=None if f.score is None else round(f.score, 4),
            step=f.step,
            first_step=cur.first_step,
            opened_at=cur.opened_at,
            summary=clip_text(f.summary),
            evidence=evidence,
            device=f.device,
            port=f.port,
            ranks=list(f.ranks),
            related=f.related,
        )


def _changed(old: float | None, new: float | None, rel: float, floor: float) -> bool:
    if old is None or new is None:
        return old is not new
    return abs(new - old) > max(rel * abs(old), floor)

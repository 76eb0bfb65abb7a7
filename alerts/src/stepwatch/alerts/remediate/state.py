"""The remediator's memory, persisted in one SQLite file so a restart keeps it.

- ``actions``: one row per action id (named from node + alert), with its status
  and attempt count: a retried webhook finds the earlier action.
- ``history``: timestamped facts the guardrails count over windows
  (``drain`` for the breaker, ``remediation`` for cooldowns, the rate limit
  and repeat offenders, ``attempt`` for the per-node attempt budget,
  ``notify`` for the owners' notification limits). ``ref`` is the alert's key
  (one remediation per alert, however many actions; for ``notify`` the owner),
  ``action`` the action id. A queued action *reserves* its place
  (``reserve``, and ``reserve_drain`` for a drain) until it is approved or
  refused: queued work counts against the limits.
- ``breaker``: open or closed; only a person closes it.
- ``outcomes``: executed remediations waiting for their alert to resolve
  (see :mod:`.outcome`).
"""

from __future__ import annotations

import sqlite3
import threading
from dataclasses import dataclass
from pathlib import Path

from stepwatch.errors import RemediationError

_SCHEMA = """
CREATE TABLE IF NOT EXISTS actions (
    id TEXT PRIMARY KEY, kind TEXT, node TEXT, job_id TEXT, alertname TEXT, fingerprint TEXT,
    status TEXT, attempts INTEGER, created REAL, updated REAL, reason TEXT, detail TEXT,
    alert TEXT);
CREATE TABLE IF NOT EXISTS history (ts REAL, what TEXT, node TEXT, job_id TEXT);
CREATE INDEX IF NOT EXISTS history_what_ts ON history (what, ts);
CREATE TABLE IF NOT EXISTS breaker (id INTEGER PRIMARY KEY CHECK (id = 1), open INTEGER,
    changed REAL, reason TEXT);
CREATE TABLE IF NOT EXISTS outcomes (key TEXT PRIMARY KEY, fingerprint TEXT, alertname TEXT,
    action TEXT, node TEXT, job_id TEXT, acted REAL, deadline REAL, outcome TEXT, decided REAL,
    before REAL, after REAL, resolved_at REAL NOT NULL DEFAULT 0);
"""
_HISTORY_COLUMNS = (("ref", "TEXT NOT NULL DEFAULT ''"), ("action", "TEXT NOT NULL DEFAULT ''"))
RESERVE, RESERVE_DRAIN = "reserve", "reserve_drain"
# one remediation per alert key: rows without a key (older state files) count one each
_DISTINCT_REF = "count(DISTINCT CASE WHEN ref = '' THEN 'row' || rowid ELSE ref END)"


class Status:
    """Action statuses (strings in the state file)."""

    DONE = "done"
    SKIPPED = "skipped"  # decided not to act; remembered for a while (a retry is a duplicate)
    DRY_RUN = "dry_run"
    QUEUED = "queued"
    FAILED_TRANSIENT = "failed_transient"
    FAILED_PERMANENT = "failed_permanent"
    REJECTED = "rejected"
    # written before the actuator is called: a row still "started" when the remediator starts
    # again was cut off mid-action (kill -9, SIGTERM): Remediator.recover_interrupted
    STARTED = "started"


@dataclass(frozen=True)
class ActionRow:
    id: str
    kind: str
    node: str
    job_id: str
    alertname: str
    fingerprint: str
    status: str
    attempts: int
    created: float
    updated: float
    reason: str
    detail: str
    alert: str = ""  # the alert as JSON, to act on it when a person approves


@dataclass(frozen=True)
class OutcomeRow:
    """One executed remediation and what became of it (``outcome`` '' while pending)."""

    key: str  # the alert key: one outcome per remediated alert
    fingerprint: str
    alertname: str
    action: str  # the actions taken, e.g. "drain+requeue"
    node: str
    job_id: str
    acted: float
    deadline: float
    outcome: str = ""
    decided: float = 0.0
    before: float | None = None  # the job's step time before the action (s), when known
    after: float | None = None
    resolved_at: float = 0.0  # when its alert resolved (0: firing); decided after settling


@dataclass(frozen=True)
class BreakerState:
    open: bool
    changed: float
    reason: str


class State:
    """Thread-safe access to the state file (``<state_dir>/remediator.sqlite3``)."""

    def __init__(self, state_dir: str | Path) -> None:
        path = Path(state_dir)
        try:
            path.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(
                path / "remediator.sqlite3", check_same_thread=False, isolation_level=None
            )
            self._db.executescript(_SCHEMA)
            have = {r[1] for r in self._db.execute("PRAGMA table_info(history)")}
            for name, decl in _HISTORY_COLUMNS:  # state files from before the column
                if name not in have:
                    self._db.execute(f"ALTER TABLE history ADD COLUMN {name} {decl}")
            have = {r[1] for r in self._db.execute("PRAGMA table_info(outcomes)")}
            if "resolved_at" not in have:  # state files from before the settle period
                self._db.execute(
                    "ALTER TABLE outcomes ADD COLUMN resolved_at REAL NOT NULL DEFAULT 0"
                )
        except (OSError, sqlite3.Error) as err:
            raise RemediationError(f"cannot open the remediator state in {path}: {err}") from err
        self._lock = threading.Lock()

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def action(self, action_id: str) -> ActionRow | None:
        with self._lock:
            row = self._db.execute("SELECT * FROM actions WHERE id = ?", (action_id,)).fetchone()
        return ActionRow(*row) if row else None

    def actions(self, status: str | None = None, limit: int = 200) -> list[ActionRow]:
        sql = "SELECT * FROM actions" + (" WHERE status = ?" if status else "")
        args: tuple[object, ...] = (status,) if status else ()
        with self._lock:
            rows = self._db.execute(
                sql + " ORDER BY updated DESC LIMIT ?", (*args, limit)
            ).fetchall()
        return [ActionRow(*r) for r in rows]

    def put_action(self, row: ActionRow) -> None:
        with self._lock:
            self._db.execute(
                "INSERT OR REPLACE INTO actions VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (
                    row.id,
                    row.kind,
                    row.node,
                    row.job_id,
                    row.alertname,
                    row.fingerprint,
                    row.status,
                    row.attempts,
                    row.created,
                    row.updated,
                    row.reason,
                    row.detail,
                    row.alert,
                ),
            )

    def record(
        self,
        ts: float,
        what: str,
        node: str = "",
        job_id: str = "",
        ref: str = "",
        action: str = "",
    ) -> None:
        with self._lock:
            self._db.execute(
                "INSERT INTO history (ts, what, node, job_id, ref, action) VALUES (?,?,?,?,?,?)",
                (ts, what, node, job_id, ref, action),
            )

    def count(
        self,
        what: str,
        since: float,
        *,
        node: str | None = None,
        job_id: str | None = None,
        ref: str | None = None,
    ) -> int:
        sql, args = _where((what,), since, node, job_id, None)
        if ref is not None:
            sql, args = sql + " AND ref = ?", [*args, ref]
        return self._scalar("SELECT count(*) FROM history WHERE " + sql, args)

    def remediations(
        self,
        since: float,
        *,
        node: str | None = None,
        job_id: str | None = None,
        exclude_ref: str | None = None,
    ) -> int:
        """Alerts remediated or queued (reserved) since ``since``: one per alert key."""
        sql, args = _where(("remediation", RESERVE), since, node, job_id, exclude_ref)
        return self._scalar(f"SELECT {_DISTINCT_REF} FROM history WHERE " + sql, args)

    def drained_nodes(self, since: float, exclude_ref: str | None = None) -> set[str]:
        """Distinct nodes drained or queued for a drain since ``since`` (the breaker's count)."""
        sql, args = _where(("drain", RESERVE_DRAIN), since, None, None, exclude_ref)
        with self._lock:
            rows = self._db.execute(
                "SELECT DISTINCT node FROM history WHERE " + sql, args
            ).fetchall()
        return {r[0] for r in rows}

    def unreserve(self, action_id: str) -> None:
        """Drop the reservations of one queued action (approved, refused or gone)."""
        with self._lock:
            self._db.execute(
                "DELETE FROM history WHERE action = ? AND what IN (?, ?)",
                (action_id, RESERVE, RESERVE_DRAIN),
            )

    def prune(self, skipped_before: float, history_before: float) -> tuple[int, int]:
        """Forget what no decision reads any more: skips last seen before ``skipped_before``
        (past the skip memory), other decided actions and history before
        ``history_before`` (past every guardrail window; a queued action and its
        reservations stay until it is decided). Without it, a sender of fresh label sets
        grows the file by a row each (the audit log keeps every decision). Returns
        (actions, history rows) deleted."""
        with self._lock:
            actions = self._db.execute(
                "DELETE FROM actions WHERE status = ? AND updated < ?",
                (Status.SKIPPED, skipped_before),
            ).rowcount
            actions += self._db.execute(
                "DELETE FROM actions WHERE status NOT IN (?, ?) AND updated < ?",
                (Status.SKIPPED, Status.QUEUED, history_before),
            ).rowcount
            history = self._db.execute(
                "DELETE FROM history WHERE ts < ? AND what NOT IN (?, ?)",
                (history_before, RESERVE, RESERVE_DRAIN),
            ).rowcount
        return actions, history

    def put_outcome(self, row: OutcomeRow) -> None:
        with self._lock:
            self._db.execute(
                "INSERT OR REPLACE INTO outcomes VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (
                    row.key,
                    row.fingerprint,
                    row.alertname,
                    row.action,
                    row.node,
                    row.job_id,
                    row.acted,
                    row.deadline,
                    row.outcome,
                    row.decided,
                    row.before,
                    row.after,
                    row.resolved_at,
                ),
            )

    def outcome(self, key: str) -> OutcomeRow | None:
        with self._lock:
            row = self._db.execute("SELECT * FROM outcomes WHERE key = ?", (key,)).fetchone()
        return OutcomeRow(*row) if row else None

    def pending_for(self, fingerprint: str) -> list[OutcomeRow]:
        """Pending outcomes of one alert fingerprint (a resolved webhook names only that)."""
        return self._outcome_rows("outcome = '' AND fingerprint = ?", (fingerprint,))

    def overdue(self, now: float) -> list[OutcomeRow]:
        """Pending past the deadline with the alert still firing."""
        return self._outcome_rows("outcome = '' AND resolved_at = 0 AND deadline <= ?", (now,))

    def settled(self, now: float, settle_s: float) -> list[OutcomeRow]:
        """Pending whose alert has stayed resolved for ``settle_s``."""
        return self._outcome_rows(
            "outcome = '' AND resolved_at > 0 AND resolved_at <= ?", (now - settle_s,)
        )

    def outcomes(self, limit: int = 200) -> list[OutcomeRow]:
        return self._outcome_rows("1 = 1 ORDER BY acted DESC LIMIT ?", (limit,))

    def _outcome_rows(self, where: str, args: tuple[object, ...]) -> list[OutcomeRow]:
        with self._lock:
            rows = self._db.execute("SELECT * FROM outcomes WHERE " + where, args).fetchall()
        return [OutcomeRow(*r) for r in rows]

    def _scalar(self, sql: str, args: list[object]) -> int:
        with self._lock:
            return int(self._db.execute(sql, args).fetchone()[0])

    def breaker(self) -> BreakerState:
        with self._lock:
            row = self._db.execute(
                "SELECT open, changed, reason FROM breaker WHERE id = 1"
            ).fetchone()
        return BreakerState(bool(row[0]), row[1], row[2]) if row else BreakerState(False, 0.0, "")

    def set_breaker(self, is_open: bool, ts: float, reason: str) -> None:
        with self._lock:
            self._db.execute(
                "INSERT OR REPLACE INTO breaker VALUES (1, ?, ?, ?)", (int(is_open), ts, reason)
            )


def _where(
    whats: tuple[str, ...],
    since: float,
    node: str | None,
    job_id: str | None,
    exclude_ref: str | None,
) -> tuple[str, list[object]]:
    sql = f"what IN ({','.join('?' * len(whats))}) AND ts >= ?"
    args: list[object] = [*whats, since]
    for column, value in (("node", node), ("job_id", job_id)):
        if value is not None:
            sql, args = sql + f" AND {column} = ?", [*args, value]
    if exclude_ref:
        sql, args = sql + " AND ref != ?", [*args, exclude_ref]
    return sql, args

"""The remediator's memory, persisted in one SQLite file so a restart keeps it.

- ``actions``: one row per action id (named from node + alert), with its status
  and attempt count: a retried webhook finds the earlier action.
- ``history``: timestamped facts the guardrails count over windows
  (``drain`` for the breaker, ``remediation`` for cooldowns, the rate limit
  and repeat offenders, ``attempt`` for the per-node attempt budget).
- ``breaker``: open or closed; only a person closes it.
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
"""


class Status:
    """Action statuses (strings in the state file)."""

    DONE = "done"
    DRY_RUN = "dry_run"
    QUEUED = "queued"
    FAILED_TRANSIENT = "failed_transient"
    FAILED_PERMANENT = "failed_permanent"
    REJECTED = "rejected"


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
            self._db = sqlite3.connect(path / "remediator.sqlite3", check_same_thread=False,
                                       isolation_level=None)
            self._db.executescript(_SCHEMA)
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
            rows = self._db.execute(sql + " ORDER BY updated DESC LIMIT ?", (*args, limit)).fetchall()
        return [ActionRow(*r) for r in rows]

    def put_action(self, row: ActionRow) -> None:
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO actions VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
                             (row.id, row.kind, row.node, row.job_id, row.alertname,
                              row.fingerprint, row.status, row.attempts, row.created,
                              row.updated, row.reason, row.detail, row.alert))

    def record(self, ts: float, what: str, node: str = "", job_id: str = "") -> None:
        with self._lock:
            self._db.execute("INSERT INTO history VALUES (?,?,?,?)", (ts, what, node, job_id))

    def count(self, what: str, since: float, *, node: str | None = None,
              job_id: str | None = None) -> int:
        sql = "SELECT count(*) FROM history WHERE what = ? AND ts >= ?"
        args: list[object] = [what, since]
        if node is not None:
            sql, args = sql + " AND node = ?", [*args, node]
        if job_id is not None:
            sql, args = sql + " AND job_id = ?", [*args, job_id]
        with self._lock:
            return int(self._db.execute(sql, args).fetchone()[0])

    def breaker(self) -> BreakerState:
        with self._lock:
            row = self._db.execute("SELECT open, changed, reason FROM breaker WHERE id = 1").fetchone()
        return BreakerState(bool(row[0]), row[1], row[2]) if row else BreakerState(False, 0.0, "")

    def set_breaker(self, is_open: bool, ts: float, reason: str) -> None:
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO breaker VALUES (1, ?, ?, ?)",
                             (int(is_open), ts, reason))

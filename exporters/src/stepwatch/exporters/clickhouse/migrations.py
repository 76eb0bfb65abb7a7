"""Versioned, idempotent schema migrations.

Migrations are the numbered files ``schema/NNNN_name.sql``, applied in order,
each once; ``schema_migrations`` records what was applied with the checksum of
the file. Every statement is written to be re-runnable (``IF NOT EXISTS``), so a
migration interrupted half-way is simply applied again. A migration never
destroys data: :func:`check_non_destructive` refuses ``DROP TABLE``,
``TRUNCATE``, ``DELETE`` and friends, and a test runs it over every file.

``{{raw_ttl_days}}`` in a file is filled from the settings; the checksum covers
the file as written, so changing the retention later is not "an edited
migration": :meth:`Migrator.ensure_ttl` adjusts the tables instead.

On a cluster (``Settings.clickhouse_cluster``) the same files are applied in
their cluster form (:mod:`stepwatch.exporters.clickhouse.cluster`): replicated
local tables ``ON CLUSTER`` behind ``Distributed`` tables of the usual names.
The ledger is one such table, so the checksums are the same in both forms.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from stepwatch.errors import ConfigError, StoreError
from stepwatch.exporters.clickhouse.cluster import LOCAL_SUFFIX, Cluster, cluster_of
from stepwatch.exporters.clickhouse.store import Store

log = logging.getLogger(__name__)

SCHEMA_DIR = Path(__file__).with_name("schema")
_FILE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")
_PLACEHOLDER = re.compile(r"\{\{(\w+)\}\}")
_DESTRUCTIVE = re.compile(
    r"\b(DROP\s+(TABLE|DATABASE|DICTIONARY|COLUMN|PARTITION|PART)|TRUNCATE|DELETE\s+WHERE|"
    r"DELETE\s+FROM|CLEAR\s+COLUMN|RENAME\s+TABLE|EXCHANGE\s+TABLES)\b",
    re.IGNORECASE,
)
RAW_TTL_COLUMNS = {
    "step_events": "start_ts",
    "gpu_samples": "ts",
    "port_samples": "ts",
    "sender_seqs": "accepted_at",  # the sink's ledger of accepted numbers lives as long
}
_TTL = re.compile(r"TTL toDateTime\((\w+)\) \+ toIntervalDay\((\d+)\)")

LEDGER_DDL = """
CREATE TABLE IF NOT EXISTS schema_migrations
(
    version UInt32,
    name String,
    checksum String,
    applied_at DateTime64(3, 'UTC') DEFAULT now64(3)
)
ENGINE = ReplacingMergeTree
ORDER BY version
"""


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        """Of the statements as written, comments and layout left out."""
        code = [ln.split("--", 1)[0].strip() for ln in self.sql.splitlines()]
        normal = " ".join(" ".join(c for c in code if c).split())
        return hashlib.sha256(normal.encode()).hexdigest()[:16]

    def statements(
        self, variables: Mapping[str, object], cluster: Cluster | None = None
    ) -> list[str]:
        """The statements to run: as written, or their cluster form."""
        single = split_statements(render(self.sql, variables))
        return single if cluster is None else [c for s in single for c in cluster.statements(s)]


@dataclass(frozen=True)
class MigrationStatus:
    version: int
    name: str
    applied: bool
    checksum_ok: bool  # False: the file changed after it was applied


def load_migrations(directory: Path = SCHEMA_DIR) -> list[Migration]:
    """The migration files in version order; gaps and duplicates are errors."""
    found: list[Migration] = []
    for path in sorted(directory.glob("*.sql")):
        match = _FILE.match(path.name)
        if not match:
            raise StoreError(f"migration file {path.name} is not named NNNN_name.sql")
        found.append(Migration(int(match.group(1)), match.group(2), path.read_text()))
    for expected, migration in enumerate(found, start=1):
        if migration.version != expected:
            raise StoreError(
                f"migration versions must run 1..n without gaps; found {migration.version}"
            )
        for statement in migration.statements({"raw_ttl_days": 1}):
            check_non_destructive(statement, migration.name)
    return found


def render(sql: str, variables: Mapping[str, object]) -> str:
    def sub(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in variables:
            raise StoreError(f"migration placeholder {{{{{name}}}}} has no value")
        return str(variables[name])

    return _PLACEHOLDER.sub(sub, sql)


def split_statements(sql: str) -> list[str]:
    """Statements end with ``;`` at the end of a line; comment-only chunks are dropped."""
    out: list[str] = []
    current: list[str] = []
    for line in sql.splitlines():
        current.append(line)
        if line.rstrip().endswith(";"):
            out.append("\n".join(current).rstrip().rstrip(";"))
            current = []
    out.append("\n".join(current))
    return [s.strip() for s in out if _has_code(s)]


def _has_code(chunk: str) -> bool:
    return any(ln.strip() and not ln.strip().startswith("--") for ln in chunk.splitlines())


def check_non_destructive(statement: str, where: str = "") -> None:
    code = "\n".join(ln.split("--", 1)[0] for ln in statement.splitlines())
    match = _DESTRUCTIVE.search(code)
    if match:
        raise StoreError(
            f"migration {where} would destroy data ({match.group(0)!r}); write a new table instead"
        )


class Migrator:
    """Applies pending migrations to a store and reports their status."""

    def __init__(
        self,
        store: Store,
        raw_ttl_days: int = 90,
        migrations: list[Migration] | None = None,
        cluster: str = "",
    ):
        self.store = store
        self.raw_ttl_days = raw_ttl_days
        self.migrations = load_migrations() if migrations is None else migrations
        self.cluster = cluster_of(cluster, store.database)
        if self.cluster is not None and store.backend == "chdb":
            raise ConfigError(
                "setting clickhouse_cluster: the embedded store is one node; "
                "a cluster needs a server (clickhouse_url)"
            )
        self.ttl_changed: list[str] = []  # tables whose raw TTL the last migrate() changed

    def _ddl(self, statement: str) -> list[str]:
        return [statement] if self.cluster is None else self.cluster.statements(statement)

    def _ledger_exists(self) -> bool:
        exists = self.store.query(
            "SELECT count() FROM system.tables "
            "WHERE database = currentDatabase() AND name = 'schema_migrations'"
        )
        return bool(exists.scalar())

    def _create_ledger(self) -> None:
        if self.cluster is None:
            self.store.command(LEDGER_DDL)
            return
        # ON CLUSTER waits for every host: only when the ledger is missing, so
        # a sink starting while a replica is down is not held up.
        if self._ledger_exists():
            return
        self.store.command(self.cluster.create_database())
        for statement in self._ddl(LEDGER_DDL.strip()):
            self.store.command(statement)

    def _applied(self, create: bool = True) -> dict[int, str]:
        if create:
            self._create_ledger()
        elif not self._ledger_exists():
            return {}
        result = self.store.query(
            "SELECT version, any(checksum) FROM schema_migrations GROUP BY version"
        )
        return {int(v): str(c) for v, c in result.rows}

    def status(self) -> list[MigrationStatus]:
        """What is applied (read-only: works through a read-only endpoint)."""
        applied = self._applied(create=False)
        return [
            MigrationStatus(
                m.version,
                m.name,
                m.version in applied,
                applied.get(m.version, m.checksum) == m.checksum,
            )
            for m in self.migrations
        ]

    def migrate(self) -> list[Migration]:
        """Apply what is pending, in order; return what was applied (empty: nothing to do)."""
        applied = self._applied()
        done: list[Migration] = []
        for migration in self.migrations:
            if migration.version in applied:
                if applied[migration.version] != migration.checksum:
                    log.warning(
                        "migration changed after it was applied version=%d name=%s",
                        migration.version,
                        migration.name,
                    )
                continue
            for statement in migration.statements(
                {"raw_ttl_days": self.raw_ttl_days}, self.cluster
            ):
                self.store.command(statement)
            self.store.insert(
                "schema_migrations",
                ("version", "name", "checksum"),
                [(migration.version, migration.name, migration.checksum)],
            )
            log.info("migration applied version=%d name=%s", migration.version, migration.name)
            done.append(migration)
        self.ttl_changed = self.ensure_ttl()
        return done

    def current_ttl(self) -> dict[str, int]:
        result = self.store.query(
            "SELECT name, engine_full FROM system.tables WHERE database = currentDatabase()"
        )
        out: dict[str, int] = {}
        for name, engine in result.rows:
            table = self._table_of(str(name))
            match = _TTL.search(str(engine))
            if table in RAW_TTL_COLUMNS and match:
                out[table] = int(match.group(2))
        return out

    def _table_of(self, name: str) -> str:
        """The table a stored name holds (on a cluster, the local table's rows)."""
        if self.cluster is None:
            return name
        return name.removesuffix(LOCAL_SUFFIX) if name.endswith(LOCAL_SUFFIX) else ""

    def ensure_ttl(self) -> list[str]:
        """Make the raw tables' TTL match the setting; return the tables changed."""
        changed: list[str] = []
        for table, days in self.current_ttl().items():
            if days == self.raw_ttl_days:
                continue
            column = RAW_TTL_COLUMNS[table]
            for statement in self._ddl(
                f"ALTER TABLE {table} MODIFY TTL toDateTime({column}) "
                f"+ INTERVAL {self.raw_ttl_days} DAY"
            ):
                self.store.command(statement)
            log.info("ttl changed table=%s days=%d previous=%d", table, self.raw_ttl_days, days)
            changed.append(table)
        return changed

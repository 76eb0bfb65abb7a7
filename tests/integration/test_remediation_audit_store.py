"""Audit rows reach the store's remediation_actions table through its HTTP interface."""

from __future__ import annotations

import time

import pytest

from stepwatch.alerts.remediate.audit import ClickHouseWriter
from stepwatch.alerts.remediate.model import ActionKind, Decision, Mode, Outcome
from stepwatch.exporters.clickhouse.connect_backend import ClickHouseConnectStore
from stepwatch.exporters.clickhouse.migrations import Migrator
from stepwatch.exporters.clickhouse.service import USER, QueryService

pytestmark = pytest.mark.integration


def test_decisions_are_rows_of_remediation_actions(tmp_path):
    service = QueryService(str(tmp_path / "chdb"), allow_writes=True).start()
    try:
        store = ClickHouseConnectStore(service.url, USER, service.password, "stepwatch")
        Migrator(store, raw_ttl_days=20000).migrate()
        writer = ClickHouseWriter(service.url, USER, service.password, "stepwatch")
        decision = Decision(time.time(), "drain-node02-X-abc", ActionKind.DRAIN, Outcome.SKIPPED,
                            Mode.EXECUTE, "breaker_open", "node02", "42", "StragglerPersistent",
                            "fp1", "gpu", "system", "")
        writer.write([decision.as_dict()])
        row = store.query("SELECT id, action, status, dry_run, host, reason, mode, alertname, cause, "
                          "alert_class, actor FROM remediation_actions").rows
        assert row == [("drain-node02-X-abc", "drain", "skipped", False, "node02", "breaker_open",
                        "execute", "StragglerPersistent", "gpu", "system", "stepwatch-remediator")]
    finally:
        service.stop()

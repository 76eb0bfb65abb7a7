"""Issue 16: a remediation that did not help is itself a finding.

The real remediator service (HTTP, bearer token, its background deadline
check) with the recording fake ``scontrol``: an executed drain whose alert then
resolves is ``recovered``; one whose alert is still firing at the deadline is
``not_recovered`` and the on-call is paged (a recording webhook). Both show in
``/metrics``, ``/api/outcomes`` and ``stepwatch remediate outcomes``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from stepwatch.daemons.prometheus import wait_for
from tests.support import paths
from tests.support.alert_support import WebhookReceiver
from tests.support.fake_slurm import install
from tests.support.remediator_http import OPERATOR_TOKEN, TOKEN, alert, get, send, start

pytestmark = pytest.mark.integration
ROOT = paths.ROOT


def test_resolved_in_time_is_recovered_else_not_recovered_and_paged(tmp_path, monkeypatch):
    fake = install(
        tmp_path / "bin",
        [f"gpu-{i:03d}" for i in range(1, 11)],
        {"43": "gpu-[001-004]", "44": "gpu-[005-008]"},
    )
    monkeypatch.setenv("PATH", f"{fake.folder}:{os.environ['PATH']}")
    with WebhookReceiver() as hooks:
        svc = start(
            tmp_path,
            page=hooks.url("/page"),
            outcome={"deadline": "3s", "check_every": "0.2s", "settle": "1s"},
        )
        try:
            helped, did_not = alert("gpu-002", "43"), alert("gpu-006", "44")
            assert {d["outcome"] for d in send(svc, [helped, did_not])} == {"acted"}
            resolved = dict(helped, status="resolved")
            assert send(svc, [resolved]) == []  # Alertmanager's send_resolved: settling 1 s
            page = wait_for(lambda: hooks.received("/page"), 15, what="the page")[0]
            assert page.body["host"] == "gpu-006" and "did not resolve" in page.body["text"]
            rows = {r["node"]: r for r in get(svc, "/api/outcomes")["outcomes"]}
            assert rows["gpu-002"]["outcome"] == "recovered"
            assert rows["gpu-006"]["outcome"] == "not_recovered"
            assert rows["gpu-006"]["action"] == "drain+requeue"
            metrics = get(svc, "/metrics")
            assert 'stepwatch_remediation_outcomes_total{outcome="recovered"} 1.0' in metrics
            assert 'stepwatch_remediation_outcomes_total{outcome="not_recovered"} 1.0' in metrics
            token = tmp_path / "operator.token"
            token.write_text(OPERATOR_TOKEN)
            listed = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "stepwatch.cli",
                    "remediate",
                    "outcomes",
                    "--url",
                    svc.url,
                    "--token-file",
                    str(token),
                ],
                cwd=ROOT,
                capture_output=True,
                text=True,
                timeout=60,
                env={**os.environ, "STEPWATCH_REMEDIATE_OPERATOR_TOKEN": ""},
                check=False,
            )
            assert listed.returncode == 0, listed.stderr
            assert {r["outcome"] for r in json.loads(listed.stdout)["outcomes"]} == {
                "recovered",
                "not_recovered",
            }
            assert TOKEN not in listed.stdout and OPERATOR_TOKEN not in listed.stdout
        finally:
            svc.stop()

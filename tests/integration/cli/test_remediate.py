"""``stepwatch remediate serve`` as a process: ready, the operator commands, clean SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request

import pytest

from stepwatch.daemons.process import free_port
from stepwatch.daemons.prometheus import wait_for
from tests.support import paths

pytestmark = pytest.mark.integration
ROOT = paths.ROOT
POLICY = ROOT / "alerts" / "src" / "stepwatch" / "alerts" / "remediate" / "policy.example.yaml"


def cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "stepwatch.cli", "remediate", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_serve_answers_the_operator_commands_and_stops_on_sigterm(tmp_path):
    token = tmp_path / "token"
    token.write_text("cli-token\n")
    operators, mine = tmp_path / "operators", tmp_path / "operator.token"
    operators.write_text("ada:cli-operator-token\n")
    mine.write_text("cli-operator-token\n")
    port = free_port()
    env = {
        **os.environ,
        "STEPWATCH_REMEDIATE_TOKEN_FILE": str(token),
        "STEPWATCH_REMEDIATE_OPERATORS_FILE": str(operators),
        "STEPWATCH_REMEDIATE_OPERATOR_TOKEN_FILE": str(mine),
        "STEPWATCH_REMEDIATE_URL": f"http://127.0.0.1:{port}",
        "STEPWATCH_BOOTSTRAP_SERVERS": "",
    }
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "stepwatch.cli",
            "remediate",
            "serve",
            "--policy",
            str(POLICY),
            "--port",
            str(port),
            "--state-dir",
            str(tmp_path / "state"),
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        health = wait_for(lambda: _get(f"http://127.0.0.1:{port}/healthz"), 30, what="healthz")
        assert health == {"status": "ok", "mode": "observe"}
        listed = cli("list", env=env)
        assert listed.returncode == 0 and json.loads(listed.stdout) == {"actions": []}
        bad = cli("approve", "nope", env=env)
        assert bad.returncode != 0 and "404" in bad.stderr and "Traceback" not in bad.stderr
        closed = cli("close-breaker", env=env)
        assert json.loads(closed.stdout) == {"was_open": False, "open": False}
        wrong = cli(
            "list",
            env={
                **env,
                "STEPWATCH_REMEDIATE_OPERATOR_TOKEN_FILE": "",
                "STEPWATCH_REMEDIATE_OPERATOR_TOKEN": "x",
            },
        )
        assert "401" in wrong.stderr
        webhook = cli("close-breaker", "--token-file", str(token), env=env)
        assert webhook.returncode != 0 and "403" in webhook.stderr  # the webhook token
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    assert "cli-token" not in out and "cli-operator-token" not in out  # tokens never logged


def test_a_bad_policy_is_one_line(tmp_path):
    bad = tmp_path / "p.yaml"
    bad.write_text("mode: yolo\n")
    done = cli("check-policy", str(bad), env=dict(os.environ))
    assert (
        done.returncode != 0
        and "mode: 'yolo' is not one of observe, recommend, execute" in done.stderr
    )
    assert "Traceback" not in done.stderr


def _get(url: str) -> dict | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return json.loads(resp.read())
    except OSError:
        return None


@pytest.mark.parametrize(
    "policy, confirm",
    [
        (POLICY, "off"),  # the example: no Prometheus URL
        (ROOT / "deploy" / "compose" / "remediator-policy.yaml", "on"),
    ],
)
def test_check_policy_says_whether_prometheus_confirms_alerts(policy, confirm):
    done = cli("check-policy", str(policy), env=dict(os.environ))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("policy ok:") and f"confirm_firing={confirm}" in done.stdout

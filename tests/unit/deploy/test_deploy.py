"""deploy/: each file checked by the tool that reads it (where one installs here), and the
Slurm scripts run against a temporary mapping directory."""

from __future__ import annotations

import copy
import dataclasses
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support import paths

pytestmark = pytest.mark.unit
ROOT = paths.ROOT
DEPLOY = ROOT / "deploy"
UNIT = DEPLOY / "systemd" / "stepwatch-agent.service"
SCRIPTS = sorted((DEPLOY / "slurm").glob("*.sh"))


def _verify(tmp_path: Path, text: str) -> subprocess.CompletedProcess[str]:
    """systemd-analyze verify in a private root holding the unit and its ExecStart binary."""
    root = tmp_path / "root"
    exe = root / "opt/stepwatch/venv/bin/stepwatch"
    exe.parent.mkdir(parents=True, exist_ok=True)
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    unit_dir = root / "etc/systemd/system"
    unit_dir.mkdir(parents=True, exist_ok=True)
    (unit_dir / UNIT.name).write_text(text)
    return subprocess.run(
        [
            "systemd-analyze",
            f"--root={root}",
            "verify",
            "--recursive-errors=no",
            str(unit_dir / UNIT.name),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_systemd_unit_verifies_and_a_broken_one_does_not(tmp_path: Path) -> None:
    good = _verify(tmp_path, UNIT.read_text())
    assert good.returncode == 0, good.stderr
    bad = _verify(tmp_path, UNIT.read_text().replace("Restart=always", "Restart=sometimes"))
    assert bad.returncode != 0 and "restart" in bad.stderr.lower()


def _unit_settings() -> dict[str, str]:
    out = {}
    for line in UNIT.read_text().splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            key, value = line.split("=", 1)
            out[key.strip()] = value.strip()
    return out


def test_systemd_agent_runs_as_its_own_user_without_capabilities() -> None:
    unit = _unit_settings()
    assert unit["User"] == "stepwatch" and unit["Group"] == "stepwatch"
    assert unit["DynamicUser"] == "yes"
    assert unit["CapabilityBoundingSet"] == "" and unit["AmbientCapabilities"] == ""
    assert unit["NoNewPrivileges"] == "yes"
    # other users' ranks reach the socket: the directory is traversable by all, and the
    # socket (0620) is of their group, which the agent is in (to give the socket that
    # group); with the agent's own group, they got EACCES and their steps were dropped
    assert int(unit["RuntimeDirectoryMode"], 8) & 0o005 == 0o005
    command = unit["ExecStart"].split()
    group = command[command.index("--socket-group") + 1]
    assert group not in ("stepwatch", "") and group in unit["SupplementaryGroups"].split()
    assert "AF_UNIX" in unit["RestrictAddressFamilies"]
    sysusers = (DEPLOY / "systemd" / "stepwatch.sysusers.conf").read_text().splitlines()
    entries = [line.split() for line in sysusers if line and not line.startswith("#")]
    assert entries and entries[0][:2] == ["u", "stepwatch"]


def test_agent_env_example_names_real_settings() -> None:
    import dataclasses

    from stepwatch.settings import Settings

    fields = {f.name for f in dataclasses.fields(Settings)}
    for line in (DEPLOY / "systemd" / "agent.env.example").read_text().splitlines():
        if line and not line.startswith("#"):
            key = line.split("=", 1)[0]
            assert key.startswith("STEPWATCH_")
            assert key.startswith("STEPWATCH_KAFKA__") or key[10:].lower() in fields, key


def test_daemonset_matches_the_kubernetes_models() -> None:
    yaml = pytest.importorskip("yaml")
    pytest.importorskip("kubernetes")
    from kubernetes.client import ApiClient

    raw = yaml.safe_load((DEPLOY / "kubernetes" / "agent-daemonset.yaml").read_text())
    client = ApiClient()
    _same_after_the_models(raw, "V1DaemonSet")
    ds = client._ApiClient__deserialize(copy.deepcopy(raw), "V1DaemonSet")
    # every key is a field of the models (unknown ones would be dropped on the way back)
    assert client.sanitize_for_serialization(ds) == raw
    spec = ds.spec.template.spec
    assert ds.spec.selector.match_labels == ds.spec.template.metadata.labels
    socket = next(v for v in spec.volumes if v.name == "socket")
    assert socket.host_path.path == "/run/stepwatch"
    agent = spec.containers[0]
    env = {e.name: e for e in agent.env}
    assert env["STEPWATCH_HOST"].value_from.field_ref.field_path == "spec.nodeName"
    assert "/run/stepwatch/agent.sock" in agent.args
    mounts = {m.name: m.mount_path for m in agent.volume_mounts}
    assert mounts["socket"] == "/run/stepwatch"
    from stepwatch.settings import Settings

    assert agent.ports[0].container_port == Settings.load(env={}).metrics_port
    # probes: alive while /metrics answers, ready once the loop runs
    assert agent.liveness_probe.http_get.path == "/metrics"
    assert agent.liveness_probe.http_get.port == agent.ports[0].name
    ready = agent.readiness_probe._exec.command
    assert ready == [
        "stepwatch-healthcheck",
        str(agent.ports[0].container_port),
        "stepwatch_agent_ready",
    ]
    # every env var is read by someone: a stepwatch setting, or the NVIDIA runtime
    fields = {f.name for f in dataclasses.fields(Settings)}
    for name in env:
        assert name == "NVIDIA_VISIBLE_DEVICES" or name[10:].lower() in fields, f"unused {name}"
    # a misspelled field is caught
    broken = copy.deepcopy(raw)
    broken["spec"]["template"]["spec"]["nodeSelektor"] = {"a": "b"}
    again = client.sanitize_for_serialization(client._ApiClient__deserialize(broken, "V1DaemonSet"))
    assert again != broken


def _same_after_the_models(raw: dict, model: str) -> object:
    """Deserialize ``raw`` into the official client model; every key must survive."""
    pytest.importorskip("kubernetes")
    from kubernetes.client import ApiClient

    client = ApiClient()
    obj = client._ApiClient__deserialize(copy.deepcopy(raw), model)
    assert client.sanitize_for_serialization(obj) == raw, f"a field {model} does not have"
    return obj


def _k8s(name: str) -> dict:
    yaml = pytest.importorskip("yaml")
    return yaml.safe_load((DEPLOY / "kubernetes" / name).read_text())


def test_the_daemonset_needs_a_privileged_namespace_for_hostpath_and_hostpid_only() -> None:
    from tests.support.pod_security import baseline

    spec = _k8s("agent-daemonset.yaml")["spec"]["template"]["spec"]
    # hostPID: the agent reads the senders' /proc entries to verify their job (security.md)
    assert sorted(baseline(spec)) == [
        "host namespace hostPID",
        "hostPath volume socket",
        "hostPath volume spool",
        "hostPath volume sys",
    ]
    ns = _k8s("namespace.yaml")
    _same_after_the_models(ns, "V1Namespace")
    assert ns["metadata"]["name"] == _k8s("agent-daemonset.yaml")["metadata"]["namespace"]
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"


def test_the_sidecar_job_passes_pod_security_restricted() -> None:
    from tests.support.pod_security import restricted

    raw = _k8s("training-job-sidecar.yaml")
    job = _same_after_the_models(raw, "V1Job")
    spec = raw["spec"]["template"]["spec"]
    assert restricted(spec) == []
    sidecar = job.spec.template.spec.init_containers[0]  # type: ignore[attr-defined]
    trainer = job.spec.template.spec.containers[0]  # type: ignore[attr-defined]
    assert sidecar.restart_policy == "Always", "a native sidecar outlives nothing it serves"
    socket = next(v for v in job.spec.template.spec.volumes if v.name == "stepwatch-socket")  # type: ignore[attr-defined]
    assert socket.empty_dir is not None
    path = next(e.value for e in trainer.env if e.name == "STEPWATCH_AGENT_SOCKET")
    assert sidecar.args[sidecar.args.index("--socket") + 1] == path
    for c in (sidecar, trainer):
        mount = next(m for m in c.volume_mounts if m.name == "stepwatch-socket")
        assert path.startswith(mount.mount_path + "/")
    assert sidecar.args[sidecar.args.index("--collectors") + 1] == "steps"


def test_the_pod_security_check_catches_what_restricted_forbids() -> None:
    from tests.support.pod_security import restricted

    spec = _k8s("training-job-sidecar.yaml")["spec"]["template"]["spec"]
    broken = copy.deepcopy(spec)
    broken["containers"][0]["securityContext"]["allowPrivilegeEscalation"] = True
    broken["volumes"].append({"name": "run", "hostPath": {"path": "/run/stepwatch"}})
    broken["securityContext"].pop("seccompProfile")
    problems = restricted(broken)
    assert "trainer: allowPrivilegeEscalation must be false" in problems
    assert "hostPath volume run" in problems
    assert any("seccompProfile" in p for p in problems)


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_slurm_scripts_parse(script: Path) -> None:
    done = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert os.access(script, os.X_OK)


def _run(name: str, tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    full = {
        "PATH": os.environ["PATH"],
        "STEPWATCH_JOB_MAP_DIR": str(tmp_path / "jobs"),
        "STEPWATCH_PROLOG_NO_SYSTEMD": "1",
        **env,
    }
    return subprocess.run(
        ["bash", str(DEPLOY / "slurm" / name)], env=full, capture_output=True, text=True, timeout=30
    )


def test_prolog_maps_the_jobs_gpus_and_epilog_removes_only_its_own(tmp_path: Path) -> None:
    assert _run("prolog.sh", tmp_path, SLURM_JOB_ID="4242", SLURM_JOB_GPUS="0,3").returncode == 0
    jobs = tmp_path / "jobs"
    assert {p.name: p.read_text() for p in jobs.iterdir()} == {"0": "4242\n", "3": "4242\n"}
    (jobs / "5").write_text("777\n")  # another job's GPU
    assert _run("epilog.sh", tmp_path, SLURM_JOB_ID="4242").returncode == 0
    assert sorted(p.name for p in jobs.iterdir()) == ["5"]
    # no job id or no GPUs: nothing to do, never a failure
    assert _run("prolog.sh", tmp_path).returncode == 0
    assert _run("epilog.sh", tmp_path / "none", SLURM_JOB_ID="1").returncode == 0


def test_task_prolog_exports_the_sdk_settings(tmp_path: Path) -> None:
    out = _run("task_prolog.sh", tmp_path, SLURM_JOB_ID="4242").stdout.splitlines()
    assert out == [
        "export STEPWATCH_AGENT_SOCKET=/run/stepwatch/agent.sock",
        "export STEPWATCH_JOB_ID=4242",
    ]

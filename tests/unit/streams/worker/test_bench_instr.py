"""bench_instr measures the processor it names: the workload runs the processor-only
path of the tree given, on the records written once, and processes every one."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support import paths

sys.path.insert(0, str(paths.ROOT / "bench"))
import bench_instr

pytestmark = pytest.mark.unit


def _run(tree: Path, data: Path, *extra: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, str(paths.ROOT / "bench" / "bench_instr.py"), "--run", str(tree),
         str(data), *extra],
        capture_output=True, text=True, check=True, timeout=300,
    )  # fmt: skip
    got: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return got


def test_the_workload_processes_every_record_it_was_given(tmp_path: Path) -> None:
    data = tmp_path / "records.msgpack"
    events = bench_instr.make_workload(data, 1, 2, 40)
    assert events > 0
    got = _run(paths.ROOT, data)
    outputs = got["outputs"]
    assert isinstance(outputs, dict)
    assert got["records"] > 0
    assert not any(topic.endswith("dlq") for topic in outputs), outputs  # none refused
    setup = _run(paths.ROOT, data, "--setup-only")
    assert setup == {"records": got["records"], "outputs": {}}


def test_the_workload_imports_the_tree_it_is_given(tmp_path: Path) -> None:
    fake = tmp_path / "tree"
    (fake / "stepwatch").mkdir(parents=True)
    (fake / "stepwatch" / "__init__.py").write_text("raise SystemExit('fake tree imported')\n")
    done = subprocess.run(
        [sys.executable, str(paths.ROOT / "bench" / "bench_instr.py"), "--run", str(fake),
         str(tmp_path / "none")],
        capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip
    assert done.returncode != 0 and "fake tree imported" in done.stderr

"""bench_stream --against measures what it says: the other worker is the other tree's
code (tree_cli.py runs the CLI of the tree it is given, nothing else), and the
comparison is of medians, per tree, of rates taken against their own raw consume."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import paths

sys.path.insert(0, str(paths.ROOT / "bench"))
from bench_stream import Row, decode_floor, print_against

pytestmark = pytest.mark.unit

TREE_CLI = str(paths.ROOT / "bench" / "tree_cli.py")


def _fake_tree(root: Path, cli: str) -> Path:
    (root / "stepwatch" / "cli").mkdir(parents=True)
    (root / "stepwatch" / "__init__.py").write_text("")
    (root / "stepwatch" / "cli" / "__init__.py").write_text(cli)
    return root


def test_the_cli_of_the_tree_given_runs_with_the_arguments(tmp_path: Path) -> None:
    tree = _fake_tree(
        tmp_path / "tree",
        "def main(argv):\n    print('other tree', list(argv))\n    return 3\n",
    )
    done = subprocess.run(
        [sys.executable, TREE_CLI, str(tree), "stream", "--partitions", "8"],
        capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip
    assert done.returncode == 3, done.stderr
    assert done.stdout.strip() == "other tree ['stream', '--partitions', '8']"


def test_a_tree_without_stepwatch_is_refused_not_replaced_by_the_installed_one(
    tmp_path: Path,
) -> None:
    (tmp_path / "empty").mkdir()
    done = subprocess.run(
        [sys.executable, TREE_CLI, str(tmp_path / "empty"), "--help"],
        capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip
    assert done.returncode != 0
    assert "usage: stepwatch" not in done.stdout  # the installed CLI did not run


def _pair(raw: float, rate: float, name: str) -> tuple[Row, Row]:
    return Row("raw", 10, int(raw), 1.0, 1.0), Row(name, 10, int(rate), 1.0, 2.0)


def test_the_comparison_is_of_each_trees_medians(capsys: pytest.CaptureFixture[str]) -> None:
    pairs = [
        _pair(1_000_000, 150_000, "this tree"),
        _pair(1_000_000, 100_000, "REV"),
        _pair(500_000, 100_000, "REV"),  # a slow sitting: its raw consume is slow too
        _pair(1_000_000, 160_000, "this tree"),
        _pair(1_000_000, 120_000, "REV"),
        _pair(2_000_000, 999_000, "this tree"),  # one outlier moves no median
    ]
    print_against(pairs, "REV")
    out = capsys.readouterr().out
    assert "this tree: median 160,000 events/s per core, median ratio 0.160 (3 runs)" in out
    assert "REV: median 100,000 events/s per core, median ratio 0.120 (3 runs)" in out
    assert "this tree / REV: events per CPU-second 1.600, ratio to raw consume 1.333" in out
    # rounds: (150k, 100k), (100k, 160k), (120k, 999k): each tree's run against the other's
    assert "1.500, 1.600, 8.325; median 1.600, this tree faster in 3 of 3" in out


def test_a_module_the_tree_lacks_is_not_taken_from_the_installed_package(
    tmp_path: Path,
) -> None:
    tree = _fake_tree(
        tmp_path / "tree",
        "def main(argv):\n    import stepwatch.streams.worker.app\n    return 0\n",
    )
    done = subprocess.run(
        [sys.executable, TREE_CLI, str(tree), "stream"],
        capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip
    assert done.returncode != 0
    assert "ModuleNotFoundError: No module named 'stepwatch.streams'" in done.stderr


def test_the_decode_ceiling_adds_decodings_cost_to_the_layers() -> None:
    """raw 1 s, decode 2 s (1 s of decoding), layer 2 s: 3 s for the events, ratio 1/3."""
    raw = Row("raw consume (baseline)", 10, 300, 1.0, 1.0)
    decoded = Row("raw consume + decode", 10, 300, 2.0, 2.0)
    line = decode_floor(raw, decoded, Row("worker, layer", 10, 300, 2.0, 3.0))
    assert "100 events/s per core, ratio 0.333" in line and "reachable" in line, line
    line = decode_floor(raw, decoded, Row("worker, layer", 10, 300, 2.5, 3.0))
    assert "ratio 0.286" in line and "out of reach" in line, line

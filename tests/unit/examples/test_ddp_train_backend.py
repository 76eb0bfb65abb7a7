"""examples/ddp_train.py's choice of process-group backend (no GPU needed)."""

from __future__ import annotations

import importlib.util
from types import ModuleType

import pytest

from tests.support import paths

pytest.importorskip("torch")


def example() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "ddp_train", paths.ROOT / "examples" / "ddp_train.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    "requested,gpus,ranks_here,expected",
    [
        ("auto", 8, 8, "nccl"),  # torchrun, one rank per GPU
        ("auto", 8, 4, "nccl"),
        ("auto", 1, 4, "gloo"),  # four ranks share one GPU: NCCL would refuse
        ("auto", 0, 4, "gloo"),  # no GPU
        ("nccl", 1, 4, "nccl"),  # asked for: the user's choice
        ("gloo", 8, 8, "gloo"),
        ("nccl", 0, 4, "gloo"),  # NCCL without a GPU cannot work
    ],
)
def test_backend_for(requested: str, gpus: int, ranks_here: int, expected: str) -> None:
    assert example().backend_for(requested, gpus, ranks_here) == expected


def test_backend_option_defaults_to_auto() -> None:
    mod = example()
    assert mod.parse([]).backend == "auto"
    assert mod.parse(["--backend", "gloo"]).backend == "gloo"
    with pytest.raises(SystemExit):
        mod.parse(["--backend", "mpi"])

"""One identity per module (docs/architecture.md): every service module is imported as
``stepwatch.<folder>.…`` from ``<folder>/src/stepwatch/<folder>/``, and nothing serves it
under a second name (no symbolic link into the package, no bare ``agents``/``streams``
import, no checkout root on ``sys.path``)."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit
ROOT = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").is_file())
SERVICES = ("agents", "streams", "exporters", "alerts")
BARE_IMPORT = re.compile(rf"^\s*(from|import)\s+({'|'.join(SERVICES)})(\.|\s|$)", re.M)


def python_files(*folders: str) -> list[Path]:
    return [p for f in folders for p in (ROOT / f).rglob("*.py") if "__pycache__" not in p.parts]


def test_the_service_portions_are_the_design_cards_folders() -> None:
    found = sorted(p.parent.name for p in ROOT.glob("*/src/stepwatch/*/__init__.py"))
    assert found == sorted(SERVICES)
    for name in SERVICES:
        assert not (ROOT / name / "__init__.py").exists(), f"{name}/ must not be a package"


def test_no_symbolic_link_serves_a_folder_under_a_second_name() -> None:
    for top in ("stepwatch", *SERVICES):
        links = [p for p in (ROOT / top).rglob("*") if p.is_symlink()]
        assert not links, f"symbolic links: {links}"


def test_the_repository_root_does_not_serve_bare_service_names() -> None:
    probe = (
        "import importlib, json\n"
        "out = {}\n"
        "for name in ('agents.spool', 'streams.core', 'exporters.clickhouse', 'alerts.config'):\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "        out[name] = 'imported'\n"
        "    except ModuleNotFoundError:\n"
        "        out[name] = 'missing'\n"
        "print(json.dumps(out))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert set(json.loads(done.stdout).values()) == {"missing"}, done.stdout


@pytest.mark.parametrize("service", SERVICES)
def test_each_service_is_found_under_stepwatch_in_its_own_folder(service: str) -> None:
    spec = importlib.util.find_spec(f"stepwatch.{service}")
    assert spec is not None and spec.origin is not None
    assert Path(spec.origin).parts[-3:] == ("stepwatch", service, "__init__.py")
    if ROOT in Path(spec.origin).parents:  # the editable install of this checkout
        assert Path(spec.origin) == ROOT / service / "src" / "stepwatch" / service / "__init__.py"


def test_a_service_module_has_one_name() -> None:
    from stepwatch.streams.core import ring

    assert ring.__name__ == "stepwatch.streams.core.ring"
    assert not {"agents", "streams", "exporters", "alerts"} & set(sys.modules)


def test_nothing_imports_a_service_by_its_bare_folder_name() -> None:
    offenders = [
        str(p.relative_to(ROOT))
        for p in python_files(
            "stepwatch",
            "tests",
            "bench",
            "dashboards",
            "scripts",
            "examples",
            *(f"{s}/src" for s in SERVICES),
        )
        if BARE_IMPORT.search(p.read_text())
    ]
    assert not offenders


def test_bench_and_dashboards_import_the_installed_package() -> None:
    offenders = [
        str(p.relative_to(ROOT))
        for p in python_files("bench", "dashboards")
        if re.search(r"sys\.path\.(insert|append)", p.read_text())
    ]
    assert not offenders


def test_mypy_and_import_linter_see_every_portion() -> None:
    mypy = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    assert sorted(mypy["mypy_path"]) == sorted(f"{s}/src" for s in SERVICES)
    assert sorted(mypy["packages"]) == sorted(["stepwatch", *(f"stepwatch.{s}" for s in SERVICES)])
    spec = importlib.util.spec_from_file_location(
        "lint_imports", ROOT / "scripts" / "lint_imports.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.portions(ROOT) == sorted(str(ROOT / s / "src" / "stepwatch") for s in SERVICES)

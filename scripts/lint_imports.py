"""`lint-imports` over the whole ``stepwatch`` package, services included.

Run it as ``python scripts/lint_imports.py [lint-imports options]`` (scripts/test.sh,
``make typecheck``). The contracts are in pyproject.toml.

Why a wrapper (docs/architecture.md, "One identity per module"): ``stepwatch`` is
one package whose service subpackages live outside its folder, in
``<folder>/src/stepwatch/<folder>/`` (setup.py maps them). grimp, which builds
import-linter's graph, reads only the folders of
``importlib.util.find_spec("stepwatch").submodule_search_locations``: ``stepwatch/``
for a regular package. Python answers that call from ``sys.modules`` once the
package is imported, so this imports the core (its ``__init__`` is light) and adds
each service's ``<folder>/src/stepwatch`` to that list before handing over to
import-linter; grimp then names ``agents/src/stepwatch/agents/spool.py``
``stepwatch.agents.spool``. Plain ``lint-imports`` fails loudly instead
("Missing layer 'stepwatch.agents'"), never passes without the services.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def portions(root: Path = ROOT) -> list[str]:
    """The folders holding the service parts of ``stepwatch``: ``<folder>/src/stepwatch``."""
    return sorted(str(p.parent.parent) for p in root.glob("*/src/stepwatch/*/__init__.py"))


def main() -> None:
    os.chdir(ROOT)
    # What lint-imports itself does: the checkout's stepwatch, not an installed copy.
    sys.path.insert(0, str(ROOT))
    from importlinter.cli import lint_imports_command

    import stepwatch

    spec = stepwatch.__spec__
    assert spec is not None and spec.submodule_search_locations is not None
    if Path(spec.submodule_search_locations[0]).resolve() != ROOT / "stepwatch":
        sys.exit(f"lint_imports: imported stepwatch from {spec.origin}, not {ROOT}")
    for folder in portions():
        if folder not in spec.submodule_search_locations:
            spec.submodule_search_locations.append(folder)
    lint_imports_command(prog_name="lint-imports")


if __name__ == "__main__":
    main()

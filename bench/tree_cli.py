"""``stepwatch`` run from another tree's sources: the worker of another revision.

``python bench/tree_cli.py TREE [stepwatch args]`` imports ``stepwatch`` from
``TREE`` (a checkout of any revision: :func:`bench_instr.use_tree` builds the
package from its portions, older layouts included) and runs its CLI with the
arguments. ``bench/bench_stream.py --against REV`` starts the worker of REV this
way, next to this tree's, on the same broker and the same messages. A benchmark
aid only: nothing here is installed or used by the product.
"""

from __future__ import annotations

import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    if not argv:
        raise SystemExit("usage: tree_cli.py TREE [stepwatch args]")
    from bench_instr import use_tree  # bench/, this script's folder

    tree = Path(argv[0]).resolve()
    use_tree(tree)
    import stepwatch.cli

    if not Path(stepwatch.cli.__file__ or "").is_relative_to(tree):
        raise SystemExit(f"tree_cli: stepwatch.cli came from {stepwatch.cli.__file__}")
    return int(stepwatch.cli.main(argv[1:]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

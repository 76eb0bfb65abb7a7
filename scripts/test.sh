#!/usr/bin/env bash
# The test command (README, CI): lint, type-check, import-layer contracts, then the whole pytest suite.
# pytest exit code 5 ("no tests collected") is treated as a failure: a suite that
# collects nothing has tested nothing.
set -uo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
rc=0
"$VENV/bin/ruff" check . || rc=1
"$VENV/bin/ruff" format --check . || rc=1
"$VENV/bin/mypy" || rc=1  # strict: the package and its services ([tool.mypy] packages)
"$VENV/bin/mypy" bench dashboards tests || rc=1  # strict: benchmarks, dashboards, test helpers
"$VENV/bin/python" scripts/lint_imports.py --no-cache || rc=1
"$VENV/bin/python" -m pytest -q "$@"
prc=$?
if [ $prc -eq 5 ]; then
  echo "test: pytest collected no tests" >&2
fi
[ $prc -ne 0 ] && rc=$prc
exit $rc

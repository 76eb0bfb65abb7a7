#!/usr/bin/env bash
# The test command (README, CI): lint, type-check, import-layer contracts, then the whole pytest suite.
# The suite runs in two phases: everything but the `serial` tests on several pytest-xdist
# workers (most tests wait on real daemons, so 3 workers suit 2 cores;
# STEPWATCH_TEST_WORKERS overrides, 0 runs them in this process), then the `serial` ones
# (real torch jobs, the demo, chaos: their figures need the machine) alone. Arguments
# (a -k, a path, -m) run one phase with them instead.
# pytest exit code 5 ("no tests collected") is treated as a failure: a suite that
# collects nothing has tested nothing.
set -uo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
WORKERS=${STEPWATCH_TEST_WORKERS:-3}
rc=0
"$VENV/bin/ruff" check . || rc=1
"$VENV/bin/ruff" format --check . || rc=1
"$VENV/bin/mypy" || rc=1  # strict: the package and its services ([tool.mypy] packages)
"$VENV/bin/mypy" bench dashboards tests || rc=1  # strict: benchmarks, dashboards, test helpers
"$VENV/bin/python" scripts/lint_imports.py --no-cache || rc=1

pytest_phase() {  # args: pytest arguments; sets rc on failure (5: nothing collected)
  "$VENV/bin/python" -m pytest -q "$@"
  local prc=$?
  if [ $prc -eq 5 ]; then
    echo "test: pytest collected no tests ($*)" >&2
  fi
  [ $prc -ne 0 ] && rc=$prc
  return 0
}

if [ $# -gt 0 ]; then
  pytest_phase "$@"
else
  pytest_phase -n "$WORKERS" --dist loadfile -m "not serial"
  pytest_phase -p no:xdist -m serial
fi
exit $rc

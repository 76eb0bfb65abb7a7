#!/usr/bin/env bash
# Regenerate requirements/lock.txt: every package of stepwatch's extras, pinned with hashes.
# Run after changing dependencies in pyproject.toml (make lock), commit the result.
# torch is left out: it is pinned exactly (torch==2.13.0) and installed from the CPU wheel
# the machines carry; its default PyPI wheel would pull gigabytes of CUDA libraries.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
[ -x "$VENV/bin/uv" ] || "$VENV/bin/python" -m pip install -q uv
extras=$("$VENV/bin/python" - <<'PY'
import tomllib
data = tomllib.load(open("pyproject.toml", "rb"))
print(" ".join(f"--extra {e}" for e in data["project"]["optional-dependencies"]
               if e not in ("all", "torch")))
PY
)
# shellcheck disable=SC2086
"$VENV/bin/uv" pip compile pyproject.toml $extras --generate-hashes --python-version 3.11 \
  --python-platform x86_64-manylinux_2_28 --no-header --quiet -o requirements/lock.txt
echo "lock: requirements/lock.txt ($(grep -c '^[a-z]' requirements/lock.txt) packages)"

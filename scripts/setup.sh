#!/usr/bin/env bash
# One command sets up everything on a fresh Debian (bookworm) machine with Python 3.11:
#   Debian packages (make, Prometheus, Alertmanager, Slurm + munge for the alerting and
#   remediation parts) and a virtual environment .venv with every locked dependency
#   (requirements/lock.txt, hashes checked: the versions CI tested), torch for the real
#   training jobs, and stepwatch itself (editable). Safe to run again. No Docker needed.
#   STEPWATCH_SKIP_APT=1 skips the Debian packages; PYTHON=python3.11 picks the interpreter.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
APT_PACKAGES=(make prometheus prometheus-alertmanager slurm-wlm munge)

apt_install() {
  local sudo=""
  if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null || { echo "setup: need root or sudo for apt-get" >&2; return 1; }
    sudo="sudo"
  fi
  local missing=()
  for p in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -eq 0 ]; then
    echo "setup: Debian packages present"
    return 0
  fi
  echo "setup: installing Debian packages: ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

if [ "${STEPWATCH_SKIP_APT:-0}" != 1 ] && command -v apt-get >/dev/null; then
  apt_install
fi

if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv with $($PYTHON --version)"
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
echo "setup: installing the locked dependencies (requirements/lock.txt)"
.venv/bin/python -m pip install -q --require-hashes -r requirements/lock.txt
echo "setup: installing torch 2.13.0 (CPU) for the real training jobs"
.venv/bin/python -m pip install -q torch==2.13.0
.venv/bin/python -m pip install -q --no-deps -e .
echo "setup: done. Next: make demo   (or .venv/bin/stepwatch demo);   make test"
echo "setup: for the stepwatch command in this shell: source .venv/bin/activate"

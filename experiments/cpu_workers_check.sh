#!/bin/bash
# The 16-core CPU measurement, one command: `textserve serve --workers 1,2,4,8` (a server each,
# in turn, CPU provider) under perf_analyzer (NVIDIA's C++ load generator, over the Open
# Inference Protocol) at 64, 128 and 256 callers; target: 8 workers >= 5x one.
#   experiments/cpu_workers_check.sh [REPOSITORY] [MODEL]
# Defaults: the fp32 model bench/gpu_check.sh exported. perf_analyzer itself is set up by
# `python -m textserve.bench.perf_analyzer --setup-only` (it downloads the tritonclient wheel:
# run that where a package index is reachable and bring .tools/ along).
set -euo pipefail
PYTHON=${PYTHON:-python3}
REPOSITORY=${1:-bench/results/gpu_check/models}
MODEL=${2:-base_fp32}
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$(pwd)
exec "$PYTHON" -m textserve.bench.perf_analyzer --repository "$REPOSITORY" --model "$MODEL" \
  --server-args "--device cpu" --workers 1,2,4,8 --concurrency 64,128,256 \
  --output bench/results/cpu_workers

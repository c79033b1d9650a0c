#!/bin/bash
# The prepared GPU check (bench/gpu_check.py, issue 37): run from the repository root on the H200
# machine; one JSON and one Markdown table (gpu_check.json, gpu_check.md in --output, default
# bench/results/gpu_check), every step within a 7-minute budget: < 8 minutes of device time.
#
# Prepared here, once, where a package index is reachable (all three git-ignored):
#   ../shared/gpu/stage-onnxruntime-gpu.sh   # .gpu/a (~50 MiB, the CUDA provider), .gpu/b (~25 MiB)
#   .venv/bin/python -m textserve.bench.perf_analyzer --setup-only   # .tools/perf_analyzer, 20 MiB
#   cp -L "$(ldconfig -p | awk '/libb64.so.0d/{print $NF; exit}')" .tools/perf_analyzer/
# (libb64 beside perf_analyzer: its setup there then calls no apt.)
# Then the two device calls, one right after the other (the machine stays warm 30 s; the tree,
# ~9 MiB, and the carry stay under 64 MiB; only files under $OUT come back, 8 at most):
#   1. carry [".gpu/a"], timeout_s 120:
#        mkdir -p /tmp/stage && cp -r .gpu/a/. /tmp/stage/
#   2. carry [".gpu/b", ".tools/perf_analyzer"], timeout_s 540:
#        bench/gpu_check.sh --output /tmp/gc; s=$?; cp /tmp/gc/gpu_check.{json,md} "$OUT"/;
#        tar -czf "$OUT"/logs.tgz -C /tmp/gc --exclude=./models --exclude=./run .; exit $s
# The base run is trained there (--device auto: that torch has CUDA); `--models DIR` takes a
# repository holding base_fp16 (and base_fp32) instead, carried too (base_fp16 alone fits).
#   bench/gpu_check.sh --dry-run   every step but the CUDA and NVML ones, on CPU, small (~1 minute)
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
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$(pwd) PYTHONUNBUFFERED=1
exec "$PYTHON" -m textserve.bench.gpu_check "$@"

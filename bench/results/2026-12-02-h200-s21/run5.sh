#!/usr/bin/env bash
# Session 21 call 5 (~3 min): the extend GPU tests after the file split (the warp-specialized
# Gluon kernel moved to _extend_gluon_ws.py; extend.py's _dot as one tl.dot call), and the GPU
# tests of every declared dispatch combination.
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
cd "$(dirname "$0")/../../.."
PACK_DIR=$O
. scripts/device_env.sh
timeout -s KILL 300 python3 -m pytest -v -p no:cacheprovider -rf --tb=short -n 8 -m gpu \
  tests/test_triton_extend_gpu.py tests/test_triton_extend.py tests/test_dispatch_runs.py 2>&1 \
  | grep -v "PytestBenchmarkWarning\|warner(" > $O/gpu-tests-extend.log
grep -c PASSED $O/gpu-tests-extend.log; grep -E "^FAILED|^E  |passed|failed" \
  $O/gpu-tests-extend.log | head -30

#!/usr/bin/env bash
# Session 18 call 4 (~6 min): the GPU decode suite at this session's head (kernels as at
# ddddcbd, after the two reverted levers).
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
cd "$(dirname "$0")/../../.."
PACK_DIR=$O
. scripts/device_env.sh
timeout -s KILL 400 python3 -m pytest -v -p no:cacheprovider -rf --tb=short -n 8 -m gpu \
  tests/test_triton_decode.py tests/test_triton_decode_cs.py tests/test_launch_replay.py \
  tests/test_plan.py 2>&1 | grep -v "PytestBenchmarkWarning\|warner(" > $O/gpu-tests.log
grep -c PASSED $O/gpu-tests.log; grep -E "^FAILED|^E  |passed|failed" $O/gpu-tests.log | head -20

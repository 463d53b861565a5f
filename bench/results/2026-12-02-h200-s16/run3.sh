#!/usr/bin/env bash
# Session 16, call 3 (~3 min): the GPU tests call 2 did not reach before its time limit (launch
# replay, plan, column split; the decode ones passed there: 170 of 170 run).
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
cd "$(dirname "$0")/../../.."
PACK_DIR=$O
. scripts/device_env.sh
timeout -s KILL 300 python3 -m pytest -v -p no:cacheprovider -rf --tb=short -n 8 -m gpu \
  tests/test_launch_replay.py tests/test_plan.py tests/test_triton_decode_cs.py 2>&1 \
  | grep -v "PytestBenchmarkWarning\|warner(" > $O/gpu-tests3.log
grep -c PASSED $O/gpu-tests3.log; grep -E "^FAILED|^E  |passed|failed|items" $O/gpu-tests3.log | head -20

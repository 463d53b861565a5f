#!/usr/bin/env bash
# Session 19 call 0 (~9 min): the balanced split launch (Triton decode). (1) The GPU decode suite
# with the new tests. (2) Ragged mixes: the rule (balanced) against the count rule, each launch
# shape forced and split at one partition per program; Triton (Gluon where it serves), the
# Triton kernel forced, HIP.
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
cd "$(dirname "$0")/../../.."
PACK_DIR=$O
. scripts/device_env.sh
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv > $O/device.txt
timeout -s KILL 330 python3 -m pytest -v -p no:cacheprovider -rf --tb=short -n 8 -m gpu \
  tests/test_triton_decode_balance.py tests/test_triton_decode.py tests/test_triton_decode_cs.py \
  tests/test_launch_replay.py tests/test_plan.py 2>&1 \
  | grep -v "PytestBenchmarkWarning\|warner(" > $O/gpu-tests.log
grep -c PASSED $O/gpu-tests.log; grep -E "^FAILED|^E  |passed|failed" $O/gpu-tests.log | head -30
export PAGEDATTN_VALIDATE=0
timeout 110 python3 scripts/ragged_decode.py --mix one_long --long 32768 2>&1 \
  | grep -v "Warn\|warn" | tee $O/ragged_one_long.md
timeout 110 python3 scripts/ragged_decode.py --mix uniform --long 16384 2>&1 \
  | grep -v "Warn\|warn" | tee $O/ragged_uniform.md

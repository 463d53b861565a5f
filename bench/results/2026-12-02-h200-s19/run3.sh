#!/usr/bin/env bash
# Session 19 call 3 (~4 min; the last device time): the balanced launch's overheads on even
# batches cut (call 2: 1.8-4.3 % behind the count rule on four uniform 32/8 block-16 rows): the
# batch's lengths load beside the program's own (one round trip, not two), and combine programs
# with nothing to merge exit before the grid wait (program 0 still waits). (1) The GPU tests of
# the balanced launch, the launch replay and the plan. (2) The A/B against the count rule. (3)
# The one-long ragged mix.
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
cd "$(dirname "$0")/../../.."
PACK_DIR=$O
. scripts/device_env.sh
timeout -s KILL 150 python3 -m pytest -v -p no:cacheprovider -rf --tb=short -n 8 -m gpu \
  tests/test_triton_decode_balance.py tests/test_launch_replay.py tests/test_plan.py \
  "tests/test_triton_decode.py::test_gpu_split_equals_one_pass_bitwise" 2>&1 \
  | grep -v "PytestBenchmarkWarning\|warner(" > $O/gpu-tests.log
grep -c PASSED $O/gpu-tests.log; grep -E "^FAILED|^E  |passed|failed" $O/gpu-tests.log | head -30
export PAGEDATTN_VALIDATE=0
timeout 70 python3 scripts/hip_decode_ab.py --label ${PAGEDATTN_COMMIT:-} --heads 32/8 \
  --blocks 16 --csv $O/ab_count.csv triton triton_count=PAGEDATTN_DECODE_MODE=count \
  2>&1 | tee $O/ab_count.md
timeout 40 python3 scripts/ragged_decode.py --mix one_long --long 32768 --heads 32/8,32/32 \
  --backends triton_tl 2>&1 | grep -v "Warn\|warn" | tee $O/ragged_one_long.md

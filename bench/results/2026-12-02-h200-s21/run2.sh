#!/usr/bin/env bash
# Session 21 call 2 (~5 min): BAL_ONE, a one-partition share of the balanced Triton kernel runs
# the plain split loop (parked after it), as the count rule's split does, not the parking loop.
# (1) The GPU tests of the balanced launch and the replay. (2) A/B on the 32/8 rows: default
# (BAL_ONE on), BAL_ONE off (the parking loop, as in call 1), the count rule.
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
cd "$(dirname "$0")/../../.."
PACK_DIR=$O
. scripts/device_env.sh
timeout -s KILL 150 python3 -m pytest -v -p no:cacheprovider -rf --tb=short -n 8 -m gpu \
  tests/test_triton_decode_balance.py tests/test_launch_replay.py \
  "tests/test_triton_decode.py::test_gpu_split_equals_one_pass_bitwise" 2>&1 \
  | grep -v "PytestBenchmarkWarning\|warner(" > $O/gpu-tests-bal.log
grep -c PASSED $O/gpu-tests-bal.log; grep -E "^FAILED|^E  |passed|failed" $O/gpu-tests-bal.log \
  | head -30
export PAGEDATTN_VALIDATE=0
timeout 200 python3 scripts/hip_decode_ab.py --label ${PAGEDATTN_COMMIT:-} --heads 32/8 \
  --blocks 16,64 --csv $O/ab_bal_one.csv triton triton_park=PAGEDATTN_DECODE_BAL_ONE=0 \
  triton_count=PAGEDATTN_DECODE_MODE=count 2>&1 | grep -v "Warn\|warn" | tee $O/ab_bal_one.md

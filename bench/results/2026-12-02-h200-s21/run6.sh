#!/usr/bin/env bash
# Session 21 call 6 (~6 min), after the review mends (Gluon _ring_plan returns the share's tiles;
# the Triton kernel's extra programs load nothing before the plan): (1) the GPU decode suite.
# (2) A/B against the count rule on the 32/8 split rows (call 1: 1.039 / 1.006 at block 16).
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
cd "$(dirname "$0")/../../.."
PACK_DIR=$O
. scripts/device_env.sh
timeout -s KILL 250 python3 -m pytest -v -p no:cacheprovider -rf --tb=short -n 8 -m gpu \
  tests/test_triton_decode.py tests/test_triton_decode_balance.py tests/test_triton_decode_cs.py \
  tests/test_plan.py tests/test_launch_replay.py tests/test_dispatch_runs.py 2>&1 \
  | grep -v "PytestBenchmarkWarning\|warner(" > $O/gpu-tests.log
grep -c PASSED $O/gpu-tests.log; grep -E "^FAILED|^E  |passed|failed" $O/gpu-tests.log | head -30
export PAGEDATTN_VALIDATE=0
timeout 70 python3 scripts/hip_decode_ab.py --label ${PAGEDATTN_COMMIT:-} --heads 32/8 \
  --blocks 16,64 --shapes "1,32768;8,8192" --csv $O/ab_count.csv triton \
  triton_count=PAGEDATTN_DECODE_MODE=count 2>&1 | grep -v "Warn\|warn" | tee $O/ab_count.md

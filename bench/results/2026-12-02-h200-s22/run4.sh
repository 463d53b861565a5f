#!/usr/bin/env bash
# Session 22 call 4 (~7 min): the plan's thin-wave rule (a uniform batch past one wave takes the
# ragged grain when one pass's makespan is >= 5/4 of the grain's). (1) The GPU decode suite.
# (2) Past one wave: default against one pass and split at 1-2 partitions per program (call 2's
# shapes). (3) The 20 issue rows: balanced against the count rule (none should move: the rule
# does not fire there).
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
cd "$(dirname "$0")/../../.."
PACK_DIR=$O
. scripts/device_env.sh
timeout -s KILL 280 python3 -m pytest -v -p no:cacheprovider -rf --tb=short -n 8 -m gpu \
  tests/test_triton_decode.py tests/test_triton_decode_gluon.py tests/test_triton_decode_balance.py \
  tests/test_triton_decode_cs.py tests/test_plan.py tests/test_launch_replay.py \
  tests/test_dispatch_runs.py 2>&1 | grep -v "PytestBenchmarkWarning\|warner(" > $O/gpu-tests.log
grep -c PASSED $O/gpu-tests.log; grep -E "^FAILED|^E  |passed|failed" $O/gpu-tests.log | head -30
export PAGEDATTN_VALIDATE=0
timeout 100 python3 scripts/hip_decode_ab.py --label ${PAGEDATTN_COMMIT:-} --heads 32/8 \
  --blocks 16,64 --shapes "72,4096;80,4096;96,4096;128,4096" --csv $O/ab_past_wave.csv triton \
  triton_1p=PAGEDATTN_DECODE_MODE=one_pass \
  triton_sp1=PAGEDATTN_DECODE_MODE=split,PAGEDATTN_DECODE_PPP=1 \
  triton_sp2=PAGEDATTN_DECODE_MODE=split,PAGEDATTN_DECODE_PPP=2 2>&1 | grep -v "Warn\|warn" \
  | tee $O/ab_past_wave.md
timeout 120 python3 scripts/hip_decode_ab.py --label ${PAGEDATTN_COMMIT:-} --heads 32/8,32/32 \
  --blocks 16,64 --csv $O/ab_count.csv triton triton_count=PAGEDATTN_DECODE_MODE=count 2>&1 \
  | grep -v "Warn\|warn" | tee $O/ab_count.md

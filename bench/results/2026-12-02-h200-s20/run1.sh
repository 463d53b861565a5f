#!/usr/bin/env bash
# Session 20 call 1 (~9 min): the flat balanced grid (Triton) and the balanced Gluon forms.
# (1) GPU tests of the balanced launch, the replay, split = one pass bitwise. (2) A/B: balanced
# (default) against the count rule on the issue's 20 rows. (3) Even batches on engine-width
# tables (131072 keys; session 20 call 0: the old grid cost 1.5-1.7x there). (4) One long among
# short (Gluon serves 32/32 by default: 802 us under the count rule, session 19). (5) The rest of
# the GPU decode suite, as far as time allows.
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
cd "$(dirname "$0")/../../.."
PACK_DIR=$O
. scripts/device_env.sh
timeout -s KILL 100 python3 -m pytest -v -p no:cacheprovider -rf --tb=short -n 8 -m gpu \
  tests/test_triton_decode_balance.py tests/test_launch_replay.py \
  "tests/test_triton_decode.py::test_gpu_split_equals_one_pass_bitwise" 2>&1 \
  | grep -v "PytestBenchmarkWarning\|warner(" > $O/gpu-tests-bal.log
grep -c PASSED $O/gpu-tests-bal.log; grep -E "^FAILED|^E  |passed|failed" $O/gpu-tests-bal.log \
  | head -30
export PAGEDATTN_VALIDATE=0
timeout 160 python3 scripts/hip_decode_ab.py --label ${PAGEDATTN_COMMIT:-} --heads 32/8,32/32 \
  --blocks 16,64 --csv $O/ab_count.csv triton triton_count=PAGEDATTN_DECODE_MODE=count 2>&1 \
  | grep -v "Warn\|warn" | tee $O/ab_count.md
for bl in "8 8192" "64 4096" "256 2048"; do
  set -- $bl
  timeout 35 python3 scripts/ragged_decode.py --mix even --batch $1 --long $2 --width 131072 \
    --heads 32/8,32/32 --backends triton,triton_tl 2>&1 | grep -v "Warn\|warn" \
    | tee $O/even_${1}_${2}_w131072.md
done
timeout 35 python3 scripts/ragged_decode.py --mix one_long --long 32768 \
  --backends triton,triton_tl 2>&1 | grep -v "Warn\|warn" | tee $O/ragged_one_long.md
export PAGEDATTN_VALIDATE=1
timeout -s KILL 150 python3 -m pytest -v -p no:cacheprovider -rf --tb=short -n 8 -m gpu \
  tests/test_triton_decode.py tests/test_triton_decode_cs.py tests/test_plan.py 2>&1 \
  | grep -v "PytestBenchmarkWarning\|warner(" > $O/gpu-tests-suite.log
grep -c PASSED $O/gpu-tests-suite.log; grep -E "^FAILED|^E  |passed|failed" \
  $O/gpu-tests-suite.log | head -30

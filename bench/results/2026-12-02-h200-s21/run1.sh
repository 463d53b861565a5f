#!/usr/bin/env bash
# Session 21 call 1 (~8 min): the plan's closed form for uniform batches and its fused reductions
# (GPU-only). (1) The GPU decode suite (210 tests; also the first GPU run of session 20's review
# mend 37cb340 and of SWAP_GRAIN 4). (2) A/B: balanced (default) against the count rule on the
# 20 issue rows (session 20: 0.993-1.053x). (3) Even batches on an engine-width table and one
# long among short (the scan path with fused reductions).
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
cd "$(dirname "$0")/../../.."
PACK_DIR=$O
. scripts/device_env.sh
timeout -s KILL 240 python3 -m pytest -v -p no:cacheprovider -rf --tb=short -n 8 -m gpu \
  tests/test_triton_decode.py tests/test_triton_decode_balance.py tests/test_triton_decode_cs.py \
  tests/test_plan.py tests/test_launch_replay.py tests/test_dispatch_runs.py 2>&1 \
  | grep -v "PytestBenchmarkWarning\|warner(" > $O/gpu-tests.log
grep -c PASSED $O/gpu-tests.log; grep -E "^FAILED|^E  |passed|failed" $O/gpu-tests.log | head -30
export PAGEDATTN_VALIDATE=0
timeout 170 python3 scripts/hip_decode_ab.py --label ${PAGEDATTN_COMMIT:-} --heads 32/8,32/32 \
  --blocks 16,64 --csv $O/ab_count.csv triton triton_count=PAGEDATTN_DECODE_MODE=count 2>&1 \
  | grep -v "Warn\|warn" | tee $O/ab_count.md
timeout 35 python3 scripts/ragged_decode.py --mix even --batch 8 --long 8192 --width 131072 \
  --heads 32/8,32/32 --backends triton,triton_tl 2>&1 | grep -v "Warn\|warn" \
  | tee $O/even_8_8192_w131072.md
timeout 35 python3 scripts/ragged_decode.py --mix one_long --long 32768 \
  --backends triton,triton_tl 2>&1 | grep -v "Warn\|warn" | tee $O/ragged_one_long.md

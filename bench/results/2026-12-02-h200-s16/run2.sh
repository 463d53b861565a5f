#!/usr/bin/env bash
# Session 16, call 2 (~9 min): the row sums kept per key lane until a partition ends
# (PAGEDATTN_DECODE_ROWSUM=lazy, now the default for tiles of <= 512 logits: the 32/8 block-16
# Triton config) against per-tile sums (the old arithmetic); offline (sm_90, split loop) 281
# instructions and 6 BAR.SYNC per 32-key tile against 301 and 9. Then the results table and the
# decode, column-split, replay and plan GPU tests at this commit.
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
cd "$(dirname "$0")/../../.."
PACK_DIR=$O
. scripts/device_env.sh
export PAGEDATTN_VALIDATE=0
R=PAGEDATTN_DECODE_ROWSUM
timeout 150 python3 scripts/hip_decode_ab.py --label ${PAGEDATTN_COMMIT:-} --heads 32/8 \
  --blocks 16 --csv $O/ab_rowsum.csv triton triton_tile=$R=tile hip 2>&1 | tee $O/ab_rowsum.md
timeout 150 python3 -m bench.bench_decode --out $O 2>&1 | tee $O/bench_decode.log | tail -2
export PAGEDATTN_VALIDATE=1
timeout -s KILL 270 python3 -m pytest -v -p no:cacheprovider -rf --tb=short -n 8 -m gpu \
  tests/test_triton_decode.py tests/test_triton_decode_cs.py tests/test_launch_replay.py \
  tests/test_plan.py 2>&1 | grep -v "PytestBenchmarkWarning\|warner(" > $O/gpu-tests.log
grep -c PASSED $O/gpu-tests.log; grep -E "^FAILED|^E  |passed|failed" $O/gpu-tests.log | head -20

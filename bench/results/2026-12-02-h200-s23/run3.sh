#!/usr/bin/env bash
# Session 23 call 3 (~9 min): the final kernels (the grain search past one wave, the masked
# length load of empty extra programs). (1) The GPU decode suite. (2) The results table
# (bench_decode; FlashInfer from the carried wheels and prebuilt kernels). (3) The 32/8 issue
# rows, balanced against the count rule (what the plan costs where the count rule is right).
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
cd "$(dirname "$0")/../../.."
PACK_DIR=$O
. scripts/device_env.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv > $O/smi.txt
timeout -s KILL 230 python3 -m pytest -v -p no:cacheprovider -rf --tb=short -n 8 -m gpu \
  tests/test_triton_decode.py tests/test_triton_decode_gluon.py tests/test_triton_decode_balance.py \
  tests/test_triton_decode_cs.py tests/test_plan.py tests/test_launch_replay.py \
  tests/test_dispatch_runs.py 2>&1 | grep -v "PytestBenchmarkWarning\|warner(" > $O/gpu-tests.log
grep -c PASSED $O/gpu-tests.log; grep -E "^FAILED|^E  |passed|failed" $O/gpu-tests.log | head -30
export PAGEDATTN_VALIDATE=0
timeout 250 python3 -m bench.bench_decode --out $O 2>&1 | tee $O/bench_decode.log | tail -2
timeout 90 python3 scripts/hip_decode_ab.py --label ${PAGEDATTN_COMMIT:-} --heads 32/8 \
  --blocks 16,64 --csv $O/ab_count.csv triton triton_count=PAGEDATTN_DECODE_MODE=count 2>&1 \
  | grep -v "Warn\|warn" | tee $O/ab_count.md

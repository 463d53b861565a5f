#!/usr/bin/env bash
# Session 23 call 4 (~7 min): the final kernels (call 3's, with the grain search guarded by the
# area bound). (1) The results table. (2) (256, 2048) 32/8, balanced against the count rule
# (call 3: 1.024x and 1.062x with every program searching). (3) The GPU decode suite (call 3's
# was cut by its timeout one test short).
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
cd "$(dirname "$0")/../../.."
PACK_DIR=$O
. scripts/device_env.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv > $O/smi.txt
export PAGEDATTN_VALIDATE=0
timeout 180 python3 -m bench.bench_decode --out $O 2>&1 | tee $O/bench_decode.log | tail -2
timeout 40 python3 scripts/hip_decode_ab.py --label ${PAGEDATTN_COMMIT:-} --heads 32/8 \
  --blocks 16,64 --shapes "256,2048" --csv $O/ab_count.csv triton \
  triton_count=PAGEDATTN_DECODE_MODE=count 2>&1 | grep -v "Warn\|warn" | tee $O/ab_count.md
export PAGEDATTN_VALIDATE=1
timeout -s KILL 240 python3 -m pytest -v -p no:cacheprovider -rf --tb=short -n 8 -m gpu \
  tests/test_triton_decode.py tests/test_triton_decode_gluon.py tests/test_triton_decode_balance.py \
  tests/test_triton_decode_cs.py tests/test_plan.py tests/test_launch_replay.py \
  tests/test_dispatch_runs.py 2>&1 | grep -v "PytestBenchmarkWarning\|warner(" > $O/gpu-tests.log
grep -c PASSED $O/gpu-tests.log; grep -E "^FAILED|^E  |passed|failed" $O/gpu-tests.log | head -30

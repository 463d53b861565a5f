#!/usr/bin/env bash
# Session 23 call 5 (~4 min; two machine starts failed and ate the device budget): the final
# kernels (336a072: call 3's, with the grain search guarded by the area bound). (1) The results
# table. (2) The balanced-launch GPU tests (the code that changed) and the one test call 3's cap
# cut (test_dispatch_runs); call 3 ran the rest of the suite on the unguarded search.
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
cd "$(dirname "$0")/../../.."
PACK_DIR=$O
. scripts/device_env.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv > $O/smi.txt
export PAGEDATTN_VALIDATE=0
timeout 170 python3 -m bench.bench_decode --out $O 2>&1 | tee $O/bench_decode.log | tail -2
export PAGEDATTN_VALIDATE=1
timeout -s KILL 110 python3 -m pytest -v -p no:cacheprovider -rf --tb=short -n 8 -m gpu \
  tests/test_triton_decode_balance.py tests/test_dispatch_runs.py 2>&1 \
  | grep -v "PytestBenchmarkWarning\|warner(" > $O/gpu-tests.log
grep -c PASSED $O/gpu-tests.log; grep -E "^FAILED|^E  |passed|failed" $O/gpu-tests.log | head -30

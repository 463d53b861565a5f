#!/usr/bin/env bash
# Session 23 call 5 (~2.5 min; three machine starts failed and ate the device budget): the final
# kernels (336a072: call 3's, with the grain search guarded by the area bound). (1) The
# balanced-launch GPU tests (the code that changed) and the one test call 3's cap cut
# (test_dispatch_runs); call 3 ran the rest of the suite on the unguarded search. (2) The
# (256, 2048) rows, balanced against the count rule (call 3: 1.024x / 1.062x at 32/8).
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
cd "$(dirname "$0")/../../.."
PACK_DIR=$O
. scripts/device_env.sh
timeout -s KILL 100 python3 -m pytest -v -p no:cacheprovider -rf --tb=short -n 8 -m gpu \
  tests/test_triton_decode_balance.py tests/test_dispatch_runs.py 2>&1 \
  | grep -v "PytestBenchmarkWarning\|warner(" > $O/gpu-tests.log
grep -c PASSED $O/gpu-tests.log; grep -E "^FAILED|^E  |passed|failed" $O/gpu-tests.log | head -30
export PAGEDATTN_VALIDATE=0
timeout 40 python3 scripts/hip_decode_ab.py --label ${PAGEDATTN_COMMIT:-} --heads 32/8,32/32 \
  --blocks 16,64 --shapes "256,2048" --csv $O/ab_count.csv triton \
  triton_count=PAGEDATTN_DECODE_MODE=count 2>&1 | grep -v "Warn\|warn" | tee $O/ab_count.md

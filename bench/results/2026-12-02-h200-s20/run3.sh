#!/usr/bin/env bash
# Session 20 call 3 (~6 min): the balanced even-fill GPU tests never finished in calls 1-2.
# (1) Which condition stalls (diag_fill.py, one process per case, 40 s each). (2) The test
# itself under pytest-timeout, for the stack.
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
cd "$(dirname "$0")/../../.."
PACK_DIR=$O
. scripts/device_env.sh
export PYTHONPATH=$PWD/tests:$PYTHONPATH
for c in "fill 1 triton" "long 1 triton" "fill 1 triton PAGEDATTN_DECODE_MODE=count" \
         "fill 1 triton PAGEDATTN_DECODE_PDL=0" "fill 1 auto32"; do
  set -- $c
  env ${4:-PAGEDATTN_X=0} timeout 55 python3 \
    bench/results/2026-12-02-h200-s20/diag_fill.py $1 $2 $3 2>&1 | tail -3 \
    | sed "s/^/[$c] /" | tee -a $O/diag_fill.log
  echo "[$c] rc=${PIPESTATUS[0]}" | tee -a $O/diag_fill.log
done
timeout -s KILL 95 python3 -m pytest -v -p no:cacheprovider -rf --tb=long -m gpu \
  --timeout 80 "tests/test_triton_decode_balance.py::test_gpu_balanced_launch[(32, 8)-16-triton-even-fill]" \
  2>&1 | grep -v "PytestBenchmarkWarning\|warner(" > $O/gpu-test-fill.log
grep -E "passed|failed|Timeout|File .*pagedattn|^E  " $O/gpu-test-fill.log | head -40

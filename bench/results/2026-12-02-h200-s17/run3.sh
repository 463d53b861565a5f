#!/usr/bin/env bash
# Session 17 call 3 (~8 min): the GPU decode suite at the session's head (the decode kernel took
# two constexprs, FOLD_R and FOLD_UNROLL; the fold's merge changed), then the results table
# again (a second sample on this session's machine).
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
cd "$(dirname "$0")/../../.."
PACK_DIR=$O
. scripts/device_env.sh
timeout -s KILL 330 python3 -m pytest -v -p no:cacheprovider -rf --tb=short -n 8 -m gpu \
  tests/test_triton_decode.py tests/test_triton_decode_cs.py tests/test_launch_replay.py \
  tests/test_plan.py 2>&1 | grep -v "PytestBenchmarkWarning\|warner(" > $O/gpu-tests.log
grep -c PASSED $O/gpu-tests.log; grep -E "^FAILED|^E  |passed|failed" $O/gpu-tests.log | head -20
export PAGEDATTN_VALIDATE=0
timeout 200 python3 -m bench.bench_decode --out $O 2>&1 | tee $O/bench_decode.log | tail -2

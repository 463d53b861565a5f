#!/usr/bin/env bash
# Session 20 call 2 (~9.5 min). (1) The GPU decode tests call 1 did not reach
# (remaining_tests.txt: 114 of 210; its time limits cut both steps, none failed). (2) The results
# table with the balanced launch as the default of the Triton kernel and the Gluon forms.
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
cd "$(dirname "$0")/../../.."
PACK_DIR=$O
. scripts/device_env.sh
mapfile -t T < bench/results/2026-12-02-h200-s20/remaining_tests.txt
timeout -s KILL 320 python3 -m pytest -v -p no:cacheprovider -rf --tb=short -n 12 -m gpu \
  "${T[@]}" 2>&1 | grep -v "PytestBenchmarkWarning\|warner(" > $O/gpu-tests-rest.log
grep -c PASSED $O/gpu-tests-rest.log; grep -E "^FAILED|^E  |passed|failed" $O/gpu-tests-rest.log \
  | head -30
export PAGEDATTN_VALIDATE=0
timeout 240 python3 -m bench.bench_decode --out $O 2>&1 | tee $O/bench_decode.log | tail -2

#!/usr/bin/env bash
# Session 20 call 3 (~4 min): the 96 GPU decode tests that passed in call 1 at b30cedf
# (rerun_tests.txt), again at the commit under test (the kernels' refactors since: one helper
# for a balanced program's share, first_tile in _common).
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
cd "$(dirname "$0")/../../.."
PACK_DIR=$O
. scripts/device_env.sh
mapfile -t T < bench/results/2026-12-02-h200-s20/rerun_tests.txt
timeout -s KILL 215 python3 -m pytest -v -p no:cacheprovider -rf --tb=short -n 12 -m gpu \
  "${T[@]}" 2>&1 | grep -v "PytestBenchmarkWarning\|warner(" > $O/gpu-tests-rerun.log
grep -c PASSED $O/gpu-tests-rerun.log; grep -E "^FAILED|^E  |passed|failed" \
  $O/gpu-tests-rerun.log | head -30

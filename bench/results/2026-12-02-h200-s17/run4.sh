#!/usr/bin/env bash
# Session 17 call 4 (~5 min): where HIP's lead on the 32/8 split rows lies (lever 1 of
# bench/NOTES.md after session 17): per-block timelines of the HIP column split (new stamps,
# PAGEDATTN_HIP_TIMELINE=1 build) beside the Gluon kernel's (the auto kernel at block 64; at
# block 16 forced), first tile / loop / end spread. Before that, the HIP decode GPU tests (the
# op took an optional timeline tensor).
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
cd "$(dirname "$0")/../../.."
PACK_DIR=$O
. scripts/device_env.sh
timeout -s KILL 170 python3 -m pytest -v -p no:cacheprovider -rf --tb=short -n 8 -m gpu \
  tests/test_hip_backend.py -k "decode" 2>&1 | grep -v "PytestBenchmarkWarning\|warner(" \
  > $O/gpu-tests-hip.log
grep -c PASSED $O/gpu-tests-hip.log; grep -E "^FAILED|^E  |passed|failed" $O/gpu-tests-hip.log \
  | head -10
export PAGEDATTN_VALIDATE=0
for be in hip gluon; do
  for c in "1 32768 64" "1 32768 16" "8 8192 64"; do
    set -- $c
    timeout 90 python3 scripts/decode_timeline.py --backend $be --batch $1 --ctx $2 --block $3 \
      --calls 3 2>&1 | grep -v "Warn\|warn_once"
  done
done | tee $O/timeline.txt

#!/usr/bin/env bash
# For session 14's first GPU call (~3 min): the TIMELINE stamps now also record each program's
# SM (%smid; compiled in only when a buffer is set, offline compile tier passed): the Gluon
# decode GPU tests and the replay tests, then the (1, 32768) timeline with per-SM loop times and
# their persistence across calls (lever 1 of bench/NOTES.md after session 13: persistent,
# position-bound program rates would argue for a dynamic partition queue).
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
cd "$(dirname "$0")/../../.."
PACK_DIR=$O
. scripts/device_env.sh
timeout -s INT 150 python3 -m pytest -q -p no:cacheprovider -rf --tb=short -n 8 -m gpu \
  tests/test_launch_replay.py tests/test_triton_decode.py tests/test_plan.py -k "gluon or replay or graph" 2>&1 \
  | grep -v "PytestBenchmarkWarning\|warner(" | tee $O/gpu-tests.log | tail -8
for shape in "--batch 1 --ctx 32768 --block 16" "--batch 64 --ctx 4096 --block 16 --heads 32/32"; do
  timeout 90 python3 scripts/decode_timeline.py $shape --calls 4 2>&1 | tee -a $O/timeline.txt
done

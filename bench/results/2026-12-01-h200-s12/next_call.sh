#!/usr/bin/env bash
# For session 13's first GPU call (~4 min): the decode GPU tests (after session 12's last GPU
# call the Gluon kernel gained a TIMELINE argument and loads Q through _extend_gluon._load_q,
# and the launcher reads its tile once per call; the SASS opcode sequence is unchanged offline),
# then the
# timeline of (1, 32768) 32/8 (split) and (64, 4096) 32/8 (one pass) through the Gluon kernel:
# lever 1 of bench/NOTES.md (session 12).
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
cd "$(dirname "$0")/../../.."
PACK_DIR=$O
. scripts/device_env.sh
timeout 200 python3 -m pytest -q -p no:cacheprovider -rf --tb=short -n 8 -m gpu \
  tests/test_triton_decode.py 2>&1 | grep -v "PytestBenchmarkWarning\|warner(" \
  | tee $O/decode-gpu-tests.log | tail -8
for shape in "--batch 1 --ctx 32768 --block 16" "--batch 1 --ctx 32768 --block 64" \
             "--batch 64 --ctx 4096 --block 16" "--batch 8 --ctx 8192 --block 16"; do
  timeout 60 python3 scripts/decode_timeline.py $shape --calls 3 2>&1 | tee -a $O/timeline.txt
done

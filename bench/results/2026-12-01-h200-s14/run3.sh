#!/usr/bin/env bash
# Session 14, call 4 (~5 min). Calls 2-3: a lone Gluon program runs ~1.1 us per 64-token tile
# at block 16 (0.9 at block 64), though the copies of 3-5 tiles are in flight. Hypothesis: the
# block ids, loaded one iteration before the copies they address, miss L2 once per 128-byte
# line and queue behind the KV stream (~3 us), holding up the refill. PAGEDATTN_DECODE_GLUON_IDS
# loads them 2-3 iterations ahead. The Gluon GPU tests (with the new knob), then the A/B on all
# 20 issue rows and the (1, 32768) timeline at IDS 3.
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
PACK_DIR=$O
. scripts/device_env.sh
timeout -s INT 170 python3 -m pytest -q -p no:cacheprovider -rf --tb=short -n 8 -m gpu \
  tests/test_triton_decode.py -k "gluon" 2>&1 | grep -v "PytestBenchmarkWarning\|warner(" \
  | tee $O/gpu-tests.log | tail -8
export PAGEDATTN_VALIDATE=0
G=PAGEDATTN_DECODE_VARIANT=gluon
T=PAGEDATTN_DECODE_GLUON_TILE
I=PAGEDATTN_DECODE_GLUON_IDS
timeout 300 python3 scripts/hip_decode_ab.py --label $PAGEDATTN_COMMIT --csv $O/ab_ids.csv \
  triton triton_g=$G triton_gi2=$G,$I=2 triton_gi3=$G,$I=3 triton_g644i3=$G,$T=64,4,$I=3 \
  triton_g322i3=$G,$T=32,2,$I=3 2>&1 | tee $O/ab_ids.md
echo "## PAGEDATTN_DECODE_GLUON_IDS=3" | tee -a $O/timeline.txt
PAGEDATTN_DECODE_GLUON_IDS=3 timeout 60 python3 scripts/decode_timeline.py --calls 3 2>&1 \
  | tee -a $O/timeline.txt

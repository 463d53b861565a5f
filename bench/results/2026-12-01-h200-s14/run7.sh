#!/usr/bin/env bash
# Session 14, call 8 (~5 min). Call 7: a lone decode program issues its copies 32 % of the
# loop and computes 63 %, one after the other. _decode_gluon_ws (GLUON_FORM=ws): a producer
# warpgroup issues the copies while the consumer runs the swap arithmetic (two 8-warp programs
# per SM at 128 registers). GPU tests of the Gluon forms, then the A/B on the 20 issue rows and
# the (1, 32768) timeline under ws.
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
PACK_DIR=$O
. scripts/device_env.sh
timeout -s INT 150 python3 -m pytest -q -p no:cacheprovider -rf --tb=short -n 8 -m gpu \
  tests/test_triton_decode.py -k "gluon and (ws or swap or default)" 2>&1 \
  | grep -v "PytestBenchmarkWarning\|warner(" | tee $O/gpu-tests.log | tail -12
export PAGEDATTN_VALIDATE=0
G=PAGEDATTN_DECODE_VARIANT=gluon,PAGEDATTN_DECODE_GLUON_FORM
T=PAGEDATTN_DECODE_GLUON_TILE
timeout 280 python3 scripts/hip_decode_ab.py --label $PAGEDATTN_COMMIT --csv $O/ab_ws.csv \
  triton triton_g=$G=rows triton_ws3=$G=ws,$T=64,3 triton_ws2=$G=ws triton_ws4=$G=ws,$T=64,4 \
  triton_ws1282=$G=ws,$T=128,2 2>&1 | tee $O/ab_ws.md
for t in 64,3 64,4; do
  echo "## ws, PAGEDATTN_DECODE_GLUON_TILE=$t" | tee -a $O/timeline.txt
  PAGEDATTN_DECODE_GLUON_FORM=ws PAGEDATTN_DECODE_GLUON_TILE=$t timeout 60 \
    python3 scripts/decode_timeline.py --calls 2 2>&1 | tee -a $O/timeline.txt
done

#!/usr/bin/env bash
# Session 14, call 5 (~6 min). Calls 2-4: a lone Gluon program needs ~1.1 us per 64-token
# tile, not for its block ids (call 4) but for the 64-row wgmmas and the 64 x 64 softmax that
# serve 4 useful rows. _decode_gluon_swap puts the keys on the wgmma's M side (m64n8k16: 8x
# less tensor work and softmax). The Gluon GPU tests (swap cases added), then the A/B on the 20
# issue rows and the (1, 32768) timeline under the swap.
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
PACK_DIR=$O
. scripts/device_env.sh
timeout -s INT 180 python3 -m pytest -q -p no:cacheprovider -rf --tb=short -n 8 -m gpu \
  tests/test_triton_decode.py -k "gluon" 2>&1 | grep -v "PytestBenchmarkWarning\|warner(" \
  | tee $O/gpu-tests.log | tail -12
export PAGEDATTN_VALIDATE=0
G=PAGEDATTN_DECODE_VARIANT=gluon,PAGEDATTN_DECODE_GLUON_SWAP
T=PAGEDATTN_DECODE_GLUON_TILE
timeout 300 python3 scripts/hip_decode_ab.py --label $PAGEDATTN_COMMIT --csv $O/ab_swap.csv \
  triton triton_g=$G=0 triton_gs=$G=1 triton_gsp1=$G=1,PAGEDATTN_DECODE_PPP=1 \
  triton_gs643=$G=1,$T=64,3 triton_gs324=$G=1,$T=32,4 triton_gs644=$G=1,$T=64,4 \
  2>&1 | tee $O/ab_swap.md
for t in 64,2 64,4; do
  echo "## swap, PAGEDATTN_DECODE_GLUON_TILE=$t" | tee -a $O/timeline.txt
  PAGEDATTN_DECODE_GLUON_SWAP=1 PAGEDATTN_DECODE_GLUON_TILE=$t timeout 60 \
    python3 scripts/decode_timeline.py --calls 3 2>&1 | tee -a $O/timeline.txt
done

#!/usr/bin/env bash
# Session 14, call 2 (~6 min): does a deeper Gluon ring compress the (1, 32768) tail? The
# timeline of call 1 (timeline_f686c25.txt) shows ~16.9 MB in flight (264 programs x 2 x 32 KB)
# during the steady state and programs ending up to 6 us apart; a deeper ring at one program
# per SM keeps more bytes in flight per program while the last ones run. Gluon tiles and rings
# on all 20 issue rows (CUDA graphs, one process), then the (1, 32768) timeline at 64,4 and 64,6.
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
PACK_DIR=$O
. scripts/device_env.sh
export PAGEDATTN_VALIDATE=0
G=PAGEDATTN_DECODE_VARIANT=gluon
T=PAGEDATTN_DECODE_GLUON_TILE
timeout 330 python3 scripts/hip_decode_ab.py --label $PAGEDATTN_COMMIT --csv $O/ab_ring.csv \
  triton triton_g=$G triton_g643=$G,$T=64,3 triton_g644=$G,$T=64,4 triton_g646=$G,$T=64,6 triton_g1283=$G,$T=128,3 \
  triton_g324=$G,$T=32,4 triton_g326=$G,$T=32,6 2>&1 | tee $O/ab_ring.md
for t in 64,4 64,6; do
  echo "## PAGEDATTN_DECODE_GLUON_TILE=$t" | tee -a $O/timeline.txt
  PAGEDATTN_DECODE_GLUON_TILE=$t timeout 60 python3 scripts/decode_timeline.py --calls 3 2>&1 \
    | tee -a $O/timeline.txt
done

#!/usr/bin/env bash
# Session 14, call 3 (~4 min). Call 2 (ab_ring_3fb1b08.md): one program per SM with a deeper
# ring is slower everywhere (0.65-0.95x): one warpgroup's per-tile chain (~1.1 us per 64-token
# tile) caps a lone program, so the tail cannot speed up. Here: more, shorter programs instead.
# * 32-token tiles, 2 slots (48 KB, 114 registers split: 4 programs per SM, so (1, 32768) runs
#   its 512 partitions as one wave of single-partition programs);
# * Gluon partitions per program 1 (hardware queue);
# * the one-pass rows as split programs of 2 or 4 partitions (shorter programs, smaller
#   last-wave imbalance, at the price of a combine).
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
PACK_DIR=$O
. scripts/device_env.sh
export PAGEDATTN_VALIDATE=0
G=PAGEDATTN_DECODE_VARIANT=gluon
T=PAGEDATTN_DECODE_GLUON_TILE
S=PAGEDATTN_DECODE_MODE=split
P=PAGEDATTN_DECODE_PPP
timeout 330 python3 scripts/hip_decode_ab.py --label $PAGEDATTN_COMMIT --csv $O/ab_short.csv \
  triton triton_g=$G triton_g322=$G,$T=32,2 triton_gp1=$G,$P=1 triton_gs2=$G,$S,$P=2 \
  triton_gs4=$G,$S,$P=4 triton_g322s2=$G,$T=32,2,$S,$P=2 triton_s2=$S,$P=2 \
  2>&1 | tee $O/ab_short.md
echo "## PAGEDATTN_DECODE_GLUON_TILE=32,2" | tee -a $O/timeline.txt
PAGEDATTN_DECODE_GLUON_TILE=32,2 timeout 60 python3 scripts/decode_timeline.py --calls 3 2>&1 \
  | tee -a $O/timeline.txt
for extra in "" "--mode split"; do
  echo "## 32/8 p16 (64, 4096) $extra PPP 2" | tee -a $O/timeline.txt
  PAGEDATTN_DECODE_PPP=2 timeout 90 python3 scripts/decode_timeline.py --batch 64 --ctx 4096 \
    --calls 2 $extra 2>&1 | tee -a $O/timeline.txt
done

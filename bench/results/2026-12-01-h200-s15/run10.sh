#!/usr/bin/env bash
# Session 15, call 10 (~2 min): the MHA split rows ((1, 32768), (8, 8192)) still trail
# FlashInfer by 0.1-1 % (bench_decode_c852329.md). The swap form's ring depth (same bits) and
# partitions per program; medians of 3 rotated rounds.
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
cd "$(dirname "$0")/../../.."
PACK_DIR=$O
. scripts/device_env.sh
export PAGEDATTN_VALIDATE=0
T=PAGEDATTN_DECODE_GLUON_TILE
timeout 200 python3 scripts/hip_decode_ab.py --label ${PAGEDATTN_COMMIT:-} --heads 32/32 \
  --csv $O/ab_mha_ring.csv triton triton_643=$T=64,3 triton_644=$T=64,4 \
  triton_p2=PAGEDATTN_DECODE_PPP=2 2>&1 | tee $O/ab_mha_ring.md

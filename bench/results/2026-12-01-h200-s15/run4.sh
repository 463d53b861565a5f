#!/usr/bin/env bash
# Session 15, call 4 (~3 min): partitions per split program on 32/8. The planner gives the Triton
# kernel (4 programs per SM by registers) one partition per program at (1, 32768) (512
# programs), the Gluon kernel (2 per SM) two (256). Same bits for any value.
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
cd "$(dirname "$0")/../../.."
PACK_DIR=$O
. scripts/device_env.sh
P=PAGEDATTN_DECODE_PPP
timeout 300 python3 scripts/hip_decode_ab.py --label ${PAGEDATTN_COMMIT:-} --heads 32/8 \
  --csv $O/ab_ppp.csv triton triton_ppp2=$P=2 triton_ppp4=$P=4 \
  triton_g=PAGEDATTN_DECODE_VARIANT=gluon triton_g_ppp1=PAGEDATTN_DECODE_VARIANT=gluon,$P=1 \
  triton_g_ppp4=PAGEDATTN_DECODE_VARIANT=gluon,$P=4 2>&1 | tee $O/ab_ppp.md

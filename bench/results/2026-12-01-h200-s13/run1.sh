#!/usr/bin/env bash
# Session 13, call 2 (~3 min): where an eager decode call's host time goes
# (scripts/launch_profile.py), then the (1, 32768) tail: partition size and partitions per
# program (32/8, block 16, CUDA graphs, one process).
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
PACK_DIR=$O
. scripts/device_env.sh
export PAGEDATTN_VALIDATE=0
timeout 150 python3 scripts/launch_profile.py --profile 2>&1 | tee $O/launch_profile.log \
  | grep -v "^ \{20\}\|^$" | head -60
timeout 200 python3 scripts/hip_decode_ab.py --heads 32/8 --blocks 16 --label $PAGEDATTN_COMMIT \
  --csv $O/ab_tail.csv triton triton_ppp1=PAGEDATTN_DECODE_PPP=1 \
  triton_p1024=PAGEDATTN_PARTITION_SIZE=1024 triton_p256=PAGEDATTN_PARTITION_SIZE=256 \
  triton_p256x1=PAGEDATTN_PARTITION_SIZE=256,PAGEDATTN_DECODE_PPP=1 \
  triton_g=PAGEDATTN_DECODE_VARIANT=gluon triton_g1024=PAGEDATTN_DECODE_VARIANT=gluon,PAGEDATTN_PARTITION_SIZE=1024 \
  2>&1 | tee $O/ab_tail.md

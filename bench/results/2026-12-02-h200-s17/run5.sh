#!/usr/bin/env bash
# Session 17 call 5 (~3 min): the Triton tile loop's timeline (new stamps; no first-tile stamp)
# at the 32/8 block-16 split rows, beside HIP's at (8, 8192) block 16 (call 4 took HIP at
# (1, 32768) block 16 and the block-64 rows).
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
cd "$(dirname "$0")/../../.."
PACK_DIR=$O
. scripts/device_env.sh
export PAGEDATTN_VALIDATE=0
for c in "triton 1 32768" "triton 8 8192" "hip 8 8192"; do
  set -- $c
  timeout 90 python3 scripts/decode_timeline.py --backend $1 --batch $2 --ctx $3 --block 16 \
    --calls 3 2>&1 | grep -v "Warn\|warn_once"
done | tee $O/timeline.txt

#!/usr/bin/env bash
# For session 20's first GPU call (~6 min): bench/NOTES.md lever 4 after session 19. Even batches
# with an engine-width block table (131072 keys: a 128K-token model), balanced launch against the
# count rule, whose split shares are sized by the table's width. Then the same rows at exact
# width, for the cost of the width alone. Triton (Gluon where it serves), the Triton kernel
# forced, HIP.
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
cd "$(dirname "$0")/../../.."
PACK_DIR=$O
. scripts/device_env.sh
export PAGEDATTN_VALIDATE=0
for bl in "1 32768" "8 8192" "64 4096" "256 2048"; do
  set -- $bl
  for w in 131072 $2; do
    timeout 60 python3 scripts/ragged_decode.py --mix even --batch $1 --long $2 --width $w \
      --heads 32/8,32/32 --backends triton,triton_tl,hip 2>&1 | grep -v "Warn\|warn" \
      | tee $O/even_${1}_${2}_w$w.md
  done
done

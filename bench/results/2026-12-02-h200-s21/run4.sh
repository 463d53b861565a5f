#!/usr/bin/env bash
# Session 21 call 4 (~2 min): the swap form's balanced grain on the 32/32 split rows, where
# FlashInfer's best led by 0.1-1.6 points in call 3. Shares of cdiv(T, FINE x SWAP_GRAIN x one
# wave) partitions: FINE 4 (default, 16 x one wave) against 2, 8 and 16. Same bits for any value.
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
cd "$(dirname "$0")/../../.."
PACK_DIR=$O
. scripts/device_env.sh
export PAGEDATTN_VALIDATE=0
timeout 200 python3 scripts/hip_decode_ab.py --label ${PAGEDATTN_COMMIT:-} --heads 32/32 \
  --blocks 16,64 --shapes "1,32768;8,8192" --csv $O/ab_swap_grain.csv triton \
  triton_fine2=PAGEDATTN_DECODE_FINE=2 triton_fine8=PAGEDATTN_DECODE_FINE=8 \
  triton_fine16=PAGEDATTN_DECODE_FINE=16 \
  2>&1 | grep -v "Warn\|warn" | tee $O/ab_swap_grain.md

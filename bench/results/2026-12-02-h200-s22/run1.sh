#!/usr/bin/env bash
# Session 22 call 1 (~5 min): wave quantization of the one-pass launch on even batches. The
# balanced plan runs one pass (fill) when B x Hkv >= 3 x SMs; session 18 saw one pass win below
# that near whole waves (1.94 and 2.91 programs per SM, MHA) and lose between (2.42). Now that
# the plan's `even` test keeps ragged batches off one pass, a rule on program counts is safe.
# Here: default against one pass and split forced, programs 128-448 (0.97-3.39 per SM).
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
cd "$(dirname "$0")/../../.."
PACK_DIR=$O
. scripts/device_env.sh
export PAGEDATTN_VALIDATE=0
timeout 250 python3 scripts/hip_decode_ab.py --label ${PAGEDATTN_COMMIT:-} --heads 32/8 \
  --blocks 16,64 --shapes "16,4096;24,4096;32,4096;40,4096;48,4096;52,4096;56,4096" \
  --csv $O/ab_wave_3208.csv triton triton_1p=PAGEDATTN_DECODE_MODE=one_pass \
  triton_sp=PAGEDATTN_DECODE_MODE=split 2>&1 | grep -v "Warn\|warn" | tee $O/ab_wave_3208.md
timeout 250 python3 scripts/hip_decode_ab.py --label ${PAGEDATTN_COMMIT:-} --heads 32/32 \
  --blocks 16,64 --shapes "4,8192;6,8192;8,8192;10,8192;12,8192;13,8192;14,8192" \
  --csv $O/ab_wave_3232.csv triton triton_1p=PAGEDATTN_DECODE_MODE=one_pass \
  triton_sp=PAGEDATTN_DECODE_MODE=split 2>&1 | grep -v "Warn\|warn" | tee $O/ab_wave_3232.md

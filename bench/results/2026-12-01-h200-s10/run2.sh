#!/usr/bin/env bash
# Session 10, call 2 (~7 min): the extend A/B of the `early` variant (first tile's block ids before
# any load, no early-exit branch) and of narrower masked diagonal tiles (PAGEDATTN_EXTEND_MASKED_N),
# with the GPU variant tests; then session 9's next_call2.sh (Triton bf16 decode tiles on 32/8).
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
cd "$(dirname "$0")/../../.."
VARIANT_ROWS=pipe_fma,pipe_fma/m64,pipe_fma/m32,early,early/m64,early/m32,early@128x64x8x3,early@128x64x8x3/m32,pipe_fma#2 \
  SKIP_SWEEP=1 VARIANTS_TIMEOUT=330 bash scripts/gpu_run.sh "$TOP" tune
bash bench/results/2026-12-01-h200-s9/next_call2.sh "$TOP"

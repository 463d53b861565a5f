#!/usr/bin/env bash
# Session 18 call 5 (~3 min): what torch SDPA over contiguous K/V launches where it beats the
# paged kernels (lever 3 of bench/NOTES.md after session 18): kernels, grids and device times
# per call beside the Triton and HIP backends (torch.profiler), block 16.
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
cd "$(dirname "$0")/../../.."
PACK_DIR=$O
. scripts/device_env.sh
export PAGEDATTN_VALIDATE=0
timeout 240 python3 scripts/kernel_grids.py \
  --cases "1,32768,32,8;8,8192,32,8;1,32768,32,32;8,8192,32,32;64,4096,32,8" 2>&1 \
  | grep -v "Warn\|warn" | tee $O/kernel_grids.md

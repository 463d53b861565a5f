#!/usr/bin/env bash
# Session-8 call 4 (run inline): HIP (this tree's combine) and Triton in one process, then
# Triton's combine at UNROLL 64 in a second (an environment value with commas cannot go through
# hip_decode_ab.py's NAME=ENV,ENV syntax).
. scripts/device_env.sh; O=$OUT/r; mkdir -p $O; export PAGEDATTN_COMMIT=389ba99
timeout 200 python3 scripts/hip_decode_ab.py --label 389ba99 --csv $O/ab_new.csv hip= triton= 2>&1 | tee $O/ab_new.md | tail -22
PAGEDATTN_DECODE_COMBINE=64,1,4,1 timeout 120 python3 scripts/hip_decode_ab.py --label c64 --csv $O/ab_c64.csv triton_c64= 2>&1 | tee $O/ab_c64.md | tail -21

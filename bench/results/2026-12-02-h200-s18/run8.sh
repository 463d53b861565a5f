#!/usr/bin/env bash
# Session 18 calls 8-9 (~3 min each): the one-pass rule reads (sequence, KV head) counts only. A ragged
# batch (63 sequences of 512 keys and one of 32768, 512+ programs: the rule picks one pass)
# timed under the rule and under each launch shape forced, Triton and HIP.
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
cd "$(dirname "$0")/../../.."
PACK_DIR=$O
. scripts/device_env.sh
export PAGEDATTN_VALIDATE=0
timeout 220 python3 scripts/ragged_decode.py 2>&1 | grep -v "Warn\|warn" | tee $O/ragged.md

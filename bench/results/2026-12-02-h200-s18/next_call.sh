#!/usr/bin/env bash
# For session 19's first GPU call (~8 min): lever 0 of bench/NOTES.md (after session 18), ragged
# batches. (1) Three mixes under the launch rule, each launch shape forced, and split at one
# partition per program, Triton and HIP. (2) What that safe shape costs on the uniform issue
# rows: the default against split at one partition per program, 32/8 and 32/32, blocks 16, 64.
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
cd "$(dirname "$0")/../../.."
PACK_DIR=$O
. scripts/device_env.sh
export PAGEDATTN_VALIDATE=0
for mix in one_long uniform bimodal; do
  timeout 150 python3 scripts/ragged_decode.py --mix $mix --long 16384 2>&1 \
    | grep -v "Warn\|warn" | tee $O/ragged_$mix.md
done
S=PAGEDATTN_DECODE_MODE=split,PAGEDATTN_DECODE_PPP=1
timeout 240 python3 scripts/hip_decode_ab.py --label ${PAGEDATTN_COMMIT:-} --heads 32/8,32/32 \
  --blocks 16,64 --csv $O/ab_split1.csv triton triton_split1=$S 2>&1 | tee $O/ab_split1.md

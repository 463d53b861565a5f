#!/usr/bin/env bash
# Session 15, call 9 (~4 min): the new MHA default against the rows form (medians of 3 rotated
# rounds), then the decode results table at this commit.
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
cd "$(dirname "$0")/../../.."
PACK_DIR=$O
. scripts/device_env.sh
export PAGEDATTN_VALIDATE=0
timeout 120 python3 scripts/hip_decode_ab.py --label ${PAGEDATTN_COMMIT:-} --heads 32/32 \
  --csv $O/ab_mha_default.csv triton triton_rows=PAGEDATTN_DECODE_GLUON_FORM=rows 2>&1 \
  | tee $O/ab_mha_default.md
timeout 300 python3 -m bench.bench_decode --out $O 2>&1 | tee $O/bench_decode.log | tail -2

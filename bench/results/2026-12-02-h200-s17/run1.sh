#!/usr/bin/env bash
# Session 17 call 1 (~2 min): where the split rows' time goes, Triton against HIP (HIP is
# 2-5.5 % faster on 32/8 block 16, most at (8, 8192)): CUPTI spans of graph replays for both
# backends, then Triton with PAGEDATTN_DECODE_FOLD=last (the memset node and the serial merge).
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
cd "$(dirname "$0")/../../.."
PACK_DIR=$O
. scripts/device_env.sh
export PAGEDATTN_VALIDATE=0
S="1,32768;8,8192;64,4096"
timeout 200 python3 scripts/decode_graph_trace.py --shapes "$S" --heads 32/8 --blocks 16,64 \
  --backends triton,hip 2>&1 | grep -v Warn | tee $O/graph_trace.md
PAGEDATTN_DECODE_FOLD=last timeout 100 python3 scripts/decode_graph_trace.py \
  --shapes "1,32768;8,8192" --heads 32/8 --blocks 16 2>&1 | grep -v Warn \
  | tee $O/graph_trace_fold.md

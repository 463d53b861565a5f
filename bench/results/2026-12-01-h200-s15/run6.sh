#!/usr/bin/env bash
# Session 15, call 6 (~5 min): the decode results table again at this commit (defaults unchanged
# since session 13; a second same-run-ceiling measurement of the two rows under target), and the
# graph trace of (1, 32768) 32/8 with the combine launched without PDL (its share of the tail).
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
cd "$(dirname "$0")/../../.."
PACK_DIR=$O
. scripts/device_env.sh
export PAGEDATTN_VALIDATE=0
PAGEDATTN_DECODE_PDL=0 timeout 60 python3 scripts/decode_graph_trace.py --shapes "1,32768" \
  --blocks 16,64 2>&1 | grep "^|" | tee $O/graph_trace_pdl0.md
timeout 300 python3 -m bench.bench_decode --out $O 2>&1 | tee $O/bench_decode.log | tail -2

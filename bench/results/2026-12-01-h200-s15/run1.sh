#!/usr/bin/env bash
# Session 15, call 1: where a graph-replayed split call spends its time (decode span, combine,
# gaps: scripts/decode_graph_trace.py), then session 14's next_call.sh (ncu warp states of the
# Gluon decode loop; ws A/B under the register-aware planner) with ncu's clocks left alone.
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
cd "$(dirname "$0")/../../.."
PACK_DIR=$O
. scripts/device_env.sh
export PAGEDATTN_VALIDATE=0
timeout 150 python3 scripts/decode_graph_trace.py --shapes "1,32768;8,8192" --blocks 16,64 \
  2>&1 | tee $O/graph_trace_32x8.md
timeout 60 python3 scripts/decode_graph_trace.py --shapes "1,32768" --heads 32/32 --blocks 16 \
  2>&1 | tee $O/graph_trace_32x32.md
timeout 330 bash bench/results/2026-12-01-h200-s14/next_call.sh $TOP 2>&1 | tail -60

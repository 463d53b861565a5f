#!/usr/bin/env bash
# Session 14, call 6 (~3 min). (1) The swap kernel's GPU tests after its gate took the tile
# (call 5: 32-token tiles are below the wgmma's 64 M rows). (2) Call 5 also showed a lone
# program capped at ~30 GB/s with the swap's 8x smaller tensor work: is that a per-SM cap of
# 16-byte cp.async copies (then bulk TMA copies are the lever for the (1, 32768) tail)?
# scripts/sm_read_probe.py: k programs streaming through a shared ring, cp.async vs TMA.
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
PACK_DIR=$O
. scripts/device_env.sh
timeout -s INT 100 python3 -m pytest -q -p no:cacheprovider -rf --tb=short -n 8 -m gpu \
  tests/test_triton_decode.py -k "gluon and swap" 2>&1 | grep -v "PytestBenchmarkWarning\|warner(" \
  | tee $O/gpu-tests.log | tail -6
timeout 240 python3 scripts/sm_read_probe.py 2>&1 | tee $O/sm_read_probe.md

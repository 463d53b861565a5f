#!/usr/bin/env bash
# Session 12, call 4 (~9 min): the decode GPU tests under the new default (Gluon kernel for MHA)
# and the Gluon forms, an A/B of Gluon forms on the 20 issue rows (one process), bench_decode.
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
PACK_DIR=$O
. scripts/device_env.sh
T="python3 -m pytest -q -p no:cacheprovider -rf --tb=short"
timeout 200 $T -n 8 -m gpu tests/test_triton_decode.py 2>&1 \
  | grep -v "PytestBenchmarkWarning\|warner(" | tee $O/decode-gpu-tests.log | tail -12
timeout 170 python3 scripts/hip_decode_ab.py --label "$PAGEDATTN_COMMIT" --csv $O/ab_gluon2.csv \
  triton_tl=PAGEDATTN_DECODE_VARIANT=triton triton_gl=PAGEDATTN_DECODE_VARIANT=gluon \
  triton_gl_early=PAGEDATTN_DECODE_VARIANT=gluon,PAGEDATTN_DECODE_GLUON_EARLY=1 \
  triton_gl_ppp1=PAGEDATTN_DECODE_VARIANT=gluon,PAGEDATTN_DECODE_PPP=1 \
  triton_gl_e32x3=PAGEDATTN_DECODE_VARIANT=gluon,PAGEDATTN_DECODE_GLUON_EARLY=1,PAGEDATTN_DECODE_GLUON_TILE=32,3 \
  hip= 2>&1 | tee $O/ab_gluon2.md | tail -24
timeout 180 python3 -m bench.bench_decode --out $O 2>&1 | tee $O/bench_decode.log | tail -2

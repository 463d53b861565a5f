#!/usr/bin/env bash
# Session-8 call 9: Triton decode over fp8 caches with fp16 dots and 64-token tiles (the new
# default) -- the Triton decode GPU tests, then an A/B against the old bf16 dots / 32-token
# tiles and the two single changes (e5m2 32/8 all shapes; e4m3 32/8 block 16).
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
cd "$(dirname "$0")/../../.."
PACK_DIR=$O
. scripts/device_env.sh
timeout 100 python3 -m pytest -q -p no:cacheprovider -rf --tb=short -n 8 tests/test_triton_decode.py 2>&1 | tee $O/triton_decode_tests.log | tail -3
V="triton= triton_old=PAGEDATTN_DECODE_FP8_DOT=bf16,PAGEDATTN_DECODE_CONFIG=32,4,3 triton_f16_t32=PAGEDATTN_DECODE_CONFIG=32,4,3 triton_bf16_t64=PAGEDATTN_DECODE_FP8_DOT=bf16"
timeout 50 python3 scripts/hip_decode_ab.py --kv e5m2 --heads 32/8 --label "$PAGEDATTN_COMMIT" --csv $O/ab_fp8_e5m2.csv $V 2>&1 | tee $O/ab_fp8_e5m2.md | tail -11
timeout 30 python3 scripts/hip_decode_ab.py --kv e4m3 --quick --label "$PAGEDATTN_COMMIT" --csv $O/ab_fp8_e4m3.csv $V 2>&1 | tee $O/ab_fp8_e4m3.md | tail -6

#!/usr/bin/env bash
# Session-9 call 2: the Triton decode and extend GPU tests after the finalize FMA fix (sinks) and
# the fp8 defaults (fp16 dots, 128-token tiles); the fp8 defaults against the old ones on more
# block sizes and 32/32; HIP vs Triton on 32/32 interleaved (the row that changed sign between
# machines in session 8) with HIP's 3-stage column split and split launches.
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
cd "$(dirname "$0")/../../.."
PACK_DIR=$O
. scripts/device_env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $O/device.txt
(python3 -c "from pagedattn.hip_kernels import build; build.load()" > $O/build.log 2>&1;
 PAGEDATTN_HIP_DECODE_CS_STAGES=3 python3 -c "from pagedattn.hip_kernels import build; build.load()" > $O/build_s3.log 2>&1) &
timeout 200 python3 -m pytest -q -p no:cacheprovider -rf --tb=short -n 8 tests/test_triton_decode.py \
  2>&1 | tee $O/triton_decode_tests.log | tail -3
timeout 150 python3 -m pytest -q -p no:cacheprovider -rf --tb=short -n 8 tests/test_triton_extend.py \
  -k "options or variant or q_len_one or grid" 2>&1 | tee $O/triton_extend_tests.log | tail -3
OLD="triton_old=PAGEDATTN_DECODE_FP8_DOT=bf16,PAGEDATTN_DECODE_CONFIG=32,4,3"
T64="triton_t64=PAGEDATTN_DECODE_CONFIG=64,4,3"
timeout 150 python3 scripts/hip_decode_ab.py --kv e5m2 --blocks 16,32,64,128 --label "$PAGEDATTN_COMMIT" \
  --csv $O/ab_fp8_e5m2_blocks.csv triton= $OLD $T64 2>&1 | tee $O/ab_fp8_e5m2_blocks.md | tail -41
timeout 60 python3 scripts/hip_decode_ab.py --kv e4m3 --label "$PAGEDATTN_COMMIT" \
  --csv $O/ab_fp8_e4m3.csv triton= $OLD 2>&1 | tee $O/ab_fp8_e4m3.md | tail -21
wait; tail -qn1 $O/build*.log
timeout 120 python3 scripts/hip_decode_ab.py --heads 32/32 --label "$PAGEDATTN_COMMIT" --csv $O/ab_hip_3232.csv \
  hip_a= triton_a= hip_s3=PAGEDATTN_HIP_DECODE_CS_STAGES=3 hip_split=PAGEDATTN_HIP_DECODE_MODE=split \
  hip_b= triton_b= 2>&1 | tee $O/ab_hip_3232.md | tail -11

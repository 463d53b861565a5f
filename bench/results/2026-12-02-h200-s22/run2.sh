#!/usr/bin/env bash
# Session 22 call 2 (~7 min): the wave rule (decode._balance -> _decode_configs.fill_n) and the
# plan's one-wave shares for uniform batches. (1) The GPU decode suite (the Gluon tests now in
# test_triton_decode_gluon.py). (2) The call-1 sweep again: the default should now track the
# better of one pass and split. (3) Past one wave (32/8, 576-768 programs): split at 1 and 2
# partitions per program against the default, for the next lever.
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
cd "$(dirname "$0")/../../.."
PACK_DIR=$O
. scripts/device_env.sh
timeout -s KILL 280 python3 -m pytest -v -p no:cacheprovider -rf --tb=short -n 8 -m gpu \
  tests/test_triton_decode.py tests/test_triton_decode_gluon.py tests/test_triton_decode_balance.py \
  tests/test_triton_decode_cs.py tests/test_plan.py tests/test_launch_replay.py \
  tests/test_dispatch_runs.py 2>&1 | grep -v "PytestBenchmarkWarning\|warner(" > $O/gpu-tests.log
grep -c PASSED $O/gpu-tests.log; grep -E "^FAILED|^E  |passed|failed" $O/gpu-tests.log | head -30
export PAGEDATTN_VALIDATE=0
timeout 100 python3 scripts/hip_decode_ab.py --label ${PAGEDATTN_COMMIT:-} --heads 32/8 \
  --blocks 16,64 --shapes "16,4096;24,4096;32,4096;40,4096;48,4096;52,4096;56,4096" \
  --csv $O/ab_wave_3208.csv triton triton_1p=PAGEDATTN_DECODE_MODE=one_pass \
  triton_sp=PAGEDATTN_DECODE_MODE=split 2>&1 | grep -v "Warn\|warn" | tee $O/ab_wave_3208.md
timeout 100 python3 scripts/hip_decode_ab.py --label ${PAGEDATTN_COMMIT:-} --heads 32/32 \
  --blocks 16,64 --shapes "4,8192;6,8192;8,8192;10,8192;12,8192;13,8192;14,8192" \
  --csv $O/ab_wave_3232.csv triton triton_1p=PAGEDATTN_DECODE_MODE=one_pass \
  triton_sp=PAGEDATTN_DECODE_MODE=split 2>&1 | grep -v "Warn\|warn" | tee $O/ab_wave_3232.md
timeout 100 python3 scripts/hip_decode_ab.py --label ${PAGEDATTN_COMMIT:-} --heads 32/8 \
  --blocks 16,64 --shapes "72,4096;80,4096;96,4096" --csv $O/ab_past_wave.csv triton \
  triton_sp1=PAGEDATTN_DECODE_MODE=split,PAGEDATTN_DECODE_PPP=1 \
  triton_sp2=PAGEDATTN_DECODE_MODE=split,PAGEDATTN_DECODE_PPP=2 2>&1 | grep -v "Warn\|warn" \
  | tee $O/ab_past_wave.md

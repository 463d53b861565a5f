#!/usr/bin/env bash
# Session 23 call 2 (~8 min): the plan's grain search past one wave (17e3f5c). (1) The GPU decode
# suite. (2) Uniform batches past one wave: the default against one pass and split at 1, 2 and 4
# partitions a program (session 22's call 4 shapes). (3) Even batches whose partition counts
# differ (lengths in [3/4, 1] x 4096; one pass before this commit). (4) Ragged mixes against
# FlashInfer's batch decode planned from the lengths (none measured before).
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
cd "$(dirname "$0")/../../.."
PACK_DIR=$O
. scripts/device_env.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv > $O/smi.txt
timeout -s KILL 290 python3 -m pytest -v -p no:cacheprovider -rf --tb=short -n 8 -m gpu \
  tests/test_triton_decode.py tests/test_triton_decode_gluon.py tests/test_triton_decode_balance.py \
  tests/test_triton_decode_cs.py tests/test_plan.py tests/test_launch_replay.py \
  tests/test_dispatch_runs.py 2>&1 | grep -v "PytestBenchmarkWarning\|warner(" > $O/gpu-tests.log
grep -c PASSED $O/gpu-tests.log; grep -E "^FAILED|^E  |passed|failed" $O/gpu-tests.log | head -30
export PAGEDATTN_VALIDATE=0
timeout 110 python3 scripts/hip_decode_ab.py --label ${PAGEDATTN_COMMIT:-} --heads 32/8 \
  --blocks 16,64 --shapes "72,4096;80,4096;96,4096;128,4096" --csv $O/ab_past_wave.csv triton \
  triton_1p=PAGEDATTN_DECODE_MODE=one_pass \
  triton_sp1=PAGEDATTN_DECODE_MODE=split,PAGEDATTN_DECODE_PPP=1 \
  triton_sp2=PAGEDATTN_DECODE_MODE=split,PAGEDATTN_DECODE_PPP=2 \
  triton_sp4=PAGEDATTN_DECODE_MODE=split,PAGEDATTN_DECODE_PPP=4 2>&1 | grep -v "Warn\|warn" \
  | tee $O/ab_past_wave.md
for b in 72 96; do for blk in 16 64; do
  timeout 60 python3 scripts/ragged_decode.py --heads 32/8 --batch $b --long 4096 --mix spread \
    --block $blk --backends triton,flashinfer 2>&1 | grep -v "Warn\|warn" \
    | tee $O/spread_b${b}_blk${blk}.md
done; done
for mix in one_long uniform bimodal; do
  timeout 100 python3 scripts/ragged_decode.py --heads 32/8,32/32 --mix $mix \
    --backends triton,flashinfer,flashinfer_fa2,flashinfer_cuda 2>&1 | grep -v "Warn\|warn" \
    | tee $O/ragged_${mix}.md
done

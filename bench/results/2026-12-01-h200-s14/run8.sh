#!/usr/bin/env bash
# Session 14, call 9 (~3 min). Calls 7-8: a lone program computes ~63 % of its loop and the
# producer split (ws) still leaves it at ~31 GB/s: the tile's two wgmma chains and the softmax
# run in series. PAGEDATTN_DECODE_GLUON_PIPE=1 leaves tile t's P V wgmma in flight under tile
# t + 1's Q K wgmma and softmax (3 ring slots, one kept for that V). GPU tests of the pipe
# cases, the A/B on the 20 issue rows, and the (1, 32768) timeline under it (2 and 1 per SM).
set -u
TOP=${1:?out}; O=$TOP/r; mkdir -p $O
PACK_DIR=$O
. scripts/device_env.sh
timeout -s INT 100 python3 -m pytest -q -p no:cacheprovider -rf --tb=short -n 8 -m gpu \
  tests/test_triton_decode.py -k "gluon and (pipe or default)" 2>&1 \
  | grep -v "PytestBenchmarkWarning\|warner(" | tee $O/gpu-tests.log | tail -8
export PAGEDATTN_VALIDATE=0
G=PAGEDATTN_DECODE_VARIANT=gluon
T=PAGEDATTN_DECODE_GLUON_TILE
P=PAGEDATTN_DECODE_GLUON_PIPE=1
timeout 200 python3 scripts/hip_decode_ab.py --label $PAGEDATTN_COMMIT --csv $O/ab_pipe.csv \
  triton triton_g=$G triton_g643=$G,$T=64,3 triton_gp643=$G,$T=64,3,$P 2>&1 | tee $O/ab_pipe.md
for t in 64,3 64,4; do
  echo "## pipe, PAGEDATTN_DECODE_GLUON_TILE=$t" | tee -a $O/timeline.txt
  PAGEDATTN_DECODE_GLUON_PIPE=1 PAGEDATTN_DECODE_GLUON_TILE=$t timeout 60 \
    python3 scripts/decode_timeline.py --calls 2 2>&1 | tee -a $O/timeline.txt
done

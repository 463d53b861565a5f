#!/usr/bin/env bash
# Wheels a GPU machine without network lacks: FlashInfer, the decode/prefill peer to beat.
# Run here (PyPI reachable), then pass `carry: [".whl"]` to the device call; scripts/gpu_run.sh
# installs them to /tmp/site. .whl/ is git-ignored through .git/info/exclude.
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any \
  -d .whl flashinfer-python==0.6.1 apache-tvm-ffi==0.1.9
ls -la .whl

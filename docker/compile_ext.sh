#!/usr/bin/env bash
# The compile-only check inside a ROCm or DTK image on a machine without a GPU: the HIP
# extension built as users get it (torch.utils.cpp_extension: bindings.cpp and every kernel
# translation unit, linked) for the archs given, then its library loaded. In the DTK image this
# is where the Hygon MMAC builtins compile for real (elsewhere a shim stands in for them).
# usage (in the image, from the repository root): docker/compile_ext.sh "gfx90a;gfx942"
set -euo pipefail
export PYTORCH_ROCM_ARCH=${1:?usage: docker/compile_ext.sh "ARCH;ARCH..."}
export PAGEDATTN_CACHE_DIR=${PAGEDATTN_CACHE_DIR:-/tmp/pagedattn-cache}
python3 - <<'PY'
import os
from unittest import mock

from pagedattn.hip_kernels import build

archs = os.environ["PYTORCH_ROCM_ARCH"]
# No GPU to ask for its arch: the build's flags come from PYTORCH_ROCM_ARCH; the first target
# only names the build.
with mock.patch.object(build, "device_arch", lambda index=None: archs.split(";")[0]):
    ops = build.load(verbose=True)
print(f"built and loaded for {archs}: {ops}")
PY

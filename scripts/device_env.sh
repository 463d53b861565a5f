# Sourced (from the repository root) by the device-call scripts: carried wheels (FlashInfer),
# import paths, the commit label, and the packing of PACK_DIR into TOP/results.tgz at exit (the
# device tool returns at most 8 files). Needs TOP and PACK_DIR set.
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
# FlashInfer kernels prebuilt for sm_90a on the CPU machine (.ficache/README.txt): no JIT here
[ -d .ficache/flashinfer_jit_cache ] && export PYTHONPATH=${PYTHONPATH:-}:$PWD/.ficache
export PYTHONPATH=$PWD:${PYTHONPATH:-}
export PYTHONUNBUFFERED=1 PAGEDATTN_VALIDATE=1
# the device copy has no .git: pass PAGEDATTN_COMMIT=$(git rev-parse --short HEAD) from here
export PAGEDATTN_COMMIT=${PAGEDATTN_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
pack() { tar czf "$TOP/results.tgz" -C "$PACK_DIR" . 2>/dev/null; }
trap pack EXIT
# pytest -n N on the device: N torch processes each spinning 16 OpenMP threads starved the CPU
# oracles (session 20: tests that pass in 3 s alone never finished in 320 s)
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}

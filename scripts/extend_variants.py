"""A/B of the extend kernel's loop variants (PAGEDATTN_EXTEND_VARIANT) on the four issue shapes.

One GPU call: every row (variant, tile config) x shape -> median ms, TFLOP/s, % of the bf16
matmul rate measured in the same run, and max |out - first row out| (the verified two-stage loop is
the oracle here; the CPU/GPU tests check each variant against the float64 reference).

  python scripts/extend_variants.py --out $OUT            # all rows, ~3-4 min with compiles
  python scripts/extend_variants.py --rows twostage,onepass --shapes 0,1

Phase 1 compiles every row in parallel subprocesses (one small launch per shape each, filling
Triton's on-disk cache); phase 2 times the rows one after another in this process, so the timed
launches hit the cache. Rows: see ROWS (config None = the launcher's default for the variant).
Shapes, FLOPs and inputs are bench/bench_extend.py's (32/8 heads, D 128, bf16, page 16, bhsd).
"""
import argparse
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

# (row name, PAGEDATTN_EXTEND_VARIANT, PAGEDATTN_EXTEND_CONFIG "BM,BN,WARPS,STAGES" or None
#  [, PAGEDATTN_EXTEND_MASKED_N[, PAGEDATTN_EXTEND_MAXNREG[, PAGEDATTN_EXTEND_GLUON_FENCE
#  [, PAGEDATTN_EXTEND_GLUON_WS]]]])
ROWS = [
    ("twostage", "twostage", None),  # the two-stage loop, sm_90 tiles (128, 128, 8, 2)
    ("twostage@128x64x8x3", "twostage", "128,64,8,3"),  # the first default (31 %)
    ("onepass", "onepass", None),  # the default of session 2 (35-42 %)
    ("onepass@128x128x8x3", "onepass", "128,128,8,3"),
    ("onepass@128x64x8x3", "onepass", "128,64,8,3"),
    ("onepass@128x64x4x3", "onepass", "128,64,4,3"),
    ("onepass@64x128x4x2", "onepass", "64,128,4,2"),
    ("onepass@256x64x8x2", "onepass", "256,64,8,2"),
    ("pages", "pages", None),
    ("pipe", "pipe", None),  # stages raised to 3 by _extend_variants.tile_config
    ("pipe_fma", "pipe_fma", None),  # the default since session 3 (41-54 %)
    ("pipe_fma@128x64x8x3", "pipe_fma", "128,64,8,3"),  # 237 regs, no spill offline
    ("pipe_fma@64x64x4x3", "pipe_fma", "64,64,4,3"),  # one warpgroup, 16 tokens x 4 heads
    ("pipe_fma@64x128x4x3", "pipe_fma", "64,128,4,3"),  # one warpgroup, 2 CTAs per SM
    ("pipe_fma/m64", "pipe_fma", None, "64"),  # 64-key masked (diagonal) tiles
    ("pipe_fma/m32", "pipe_fma", None, "32"),
    ("early", "early", None),  # first ids before any load, no early-exit branch
    ("early/m64", "early", None, "64"),
    ("early/m32", "early", None, "32"),
    ("early@128x64x8x3", "early", "128,64,8,3"),
    ("early@128x64x8x3/m32", "early", "128,64,8,3", "32"),
    # 128 registers: two 8-warp programs per SM (80-96 KB of shared memory each), one's
    # softmax under the other's dots; 32-key tiles (64 need 131 KB)
    ("early@128x32x8x3+r128", "early", "128,32,8,3", None, "128"),
    ("early@128x32x8x4+r128", "early", "128,32,8,4", None, "128"),
    # the Gluon sm_90 kernel (_extend_gluon.py): softmax of tile t under tile t-1's P V wgmma
    ("gluon", "gluon", None),  # warp-specialized: a producer warpgroup gathers the pages
    ("gluon+fence", "gluon", None, None, None, "1"),  # fence.proxy.async after every wait
    ("gluon-1role", "gluon", None, None, None, None, "0"),  # one role: every warp loads
    ("gluon-split", "gluon", None, None, None, None, "2"),  # two 4-warp consumers, 64 rows each
    ("pipe_fma#2", "pipe_fma", None),  # the default again, last: drift within the process
    ("early#2", "early", None),
]


_KNOBS = ("PAGEDATTN_EXTEND_CONFIG", "PAGEDATTN_EXTEND_MASKED_N", "PAGEDATTN_EXTEND_MAXNREG",
          "PAGEDATTN_EXTEND_GLUON_FENCE", "PAGEDATTN_EXTEND_GLUON_WS")


def _env(variant, config, masked_n=None, maxnreg=None, gluon_fence=None, gluon_ws=None):
    env = dict(os.environ, PAGEDATTN_EXTEND_VARIANT=variant, PAGEDATTN_VALIDATE="0")
    for k in _KNOBS:
        env.pop(k, None)
    for k, v in zip(_KNOBS, (config, masked_n, maxnreg, gluon_fence, gluon_ws)):
        if v:
            env[k] = v
    return env


def _set_env(variant, config, masked_n=None, maxnreg=None, gluon_fence=None, gluon_ws=None):
    env = _env(variant, config, masked_n, maxnreg, gluon_fence, gluon_ws)
    for k in _KNOBS:
        if k not in env:
            os.environ.pop(k, None)
    os.environ.update(env)


def warm(shape_ids):
    """Phase-1 worker: one launch per shape (the timed shapes: same specialisation) to compile."""
    import torch

    from bench import bench_extend as BE
    for i in shape_ids:
        batch, prefix, extend = BE.SHAPES[i]
        x = BE.make_inputs(batch, prefix, extend, "cuda", torch.bfloat16)
        BE.run_triton(x, extend, os.environ.get("EXTEND_VARIANTS_NEW_FROM", "cache"))()
    torch.cuda.synchronize()


def compile_all(rows, shape_ids, jobs):
    """Run warm() for every row in parallel subprocesses; returns {row: error text or None}."""
    arg = ",".join(map(str, shape_ids))
    code = f"import sys; sys.path.insert(0, {ROOT!r}); import scripts.extend_variants as m; " \
           f"m.warm([{arg}])"

    def one(row):
        name, *knobs = row
        r = subprocess.run([sys.executable, "-c", code], env=_env(*knobs), cwd=ROOT,
                           capture_output=True, text=True, timeout=420)
        return name, (None if r.returncode == 0 else r.stderr[-1500:])
    with ThreadPoolExecutor(max_workers=jobs) as ex:
        return dict(ex.map(one, rows))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", default="", help="comma-separated row names (default: all)")
    p.add_argument("--shapes", default="0,1,2,3", help="indices into bench_extend.SHAPES")
    p.add_argument("--jobs", type=int, default=8, help="parallel compile processes")
    p.add_argument("--out", default=None, help="write extend_variants.{md,csv} here")
    p.add_argument("--new-from", default="cache", choices=["cache", "k_new"],
                   help="new tokens' K/V from the cache or from k_new/v_new (SGLang style: a "
                        "named variant runs its loop over the cached prefix)")
    a = p.parse_args(argv)
    os.environ["EXTEND_VARIANTS_NEW_FROM"] = a.new_from  # the compile subprocesses inherit it
    import pandas as pd
    import torch
    import triton

    from bench import bench_extend as BE
    from bench import common as C
    if not torch.cuda.is_available():
        print("extend_variants: needs a CUDA GPU (the variants are timed, not interpreted)")
        return 2
    want = [r for r in a.rows.split(",") if r]
    rows = [r for r in ROWS if not want or r[0] in want]
    shape_ids = [int(s) for s in a.shapes.split(",")]
    t0 = time.time()
    errors = compile_all(rows, shape_ids, a.jobs)
    print(f"phase 1 (parallel compile): {time.time() - t0:.0f} s", flush=True)
    mm = C.measure_ceilings("cuda")["matmul_TFLOPs"]
    print(f"bf16 matmul ceiling: {mm:.0f} TFLOP/s", flush=True)
    recs = []
    for si in shape_ids:
        batch, prefix, extend = BE.SHAPES[si]
        torch.manual_seed(0)
        x = BE.make_inputs(batch, prefix, extend, "cuda", torch.bfloat16)
        fl = BE.flops(batch, prefix, extend)
        ref = None
        for name, *knobs in rows:
            rec = dict(shape=f"({batch}, {prefix}, {extend})", row=name)
            if errors.get(name):
                rec["note"] = "compile failed: " + errors[name].strip().splitlines()[-1][:80]
                recs.append(rec)
                continue
            _set_env(*knobs)
            try:
                fn = BE.run_triton(x, extend, a.new_from)
                out = fn().clone()
                if ref is None and name == rows[0][0]:
                    ref = out
                ms = triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
                tf = fl / (ms * 1e-3) / 1e12
                rec.update(ms=round(ms, 3), TFLOPs=round(tf, 1), pct_mm=round(100 * tf / mm, 1))
                if ref is not None:
                    rec["max_abs_vs_first_row"] = float((out.float() - ref.float()).abs().max())
                rec["nan"] = bool(torch.isnan(out).any())
            except Exception as e:  # noqa: BLE001 -- one failing row must not end the table
                rec["note"] = f"{type(e).__name__}: {str(e)[:80]}"
            recs.append(rec)
            print(rec, flush=True)
        del x
        torch.cuda.empty_cache()
    _set_env("default", None)  # back to the launcher's default
    df = pd.DataFrame(recs)
    pivot = df.pivot(index="row", columns="shape", values="pct_mm").reindex([r[0] for r in rows])
    print(f"\ntotal {time.time() - t0:.0f} s; matmul ceiling {mm:.0f} TFLOP/s\n")
    print(C.markdown(df))
    print("\n% of matmul (row x shape):\n")
    print(C.markdown(pivot.reset_index()))
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        df.to_csv(os.path.join(a.out, "extend_variants.csv"), index=False)
        with open(os.path.join(a.out, "extend_variants.md"), "w") as f:
            f.write(f"matmul ceiling {mm:.0f} TFLOP/s\n\n{C.markdown(df)}\n\n"
                    f"{C.markdown(pivot.reset_index())}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

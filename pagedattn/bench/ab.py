"""A/B tables: every available backend of paged_decode and extend_attention side by side.

Shapes are data (``DecodeShape``/``ExtendShape`` records with their byte and FLOP formulas next to
them). For each shape every backend (torch, triton, hip, and FlashInfer when importable on a GPU)
runs on the same inputs; each row gives its median time, achieved GB/s (decode, memory bound) or
TFLOP/s (extend, compute bound), that as a fraction of the ceiling measured in the same run, the
speed-up over ``--baseline`` and the max error against the float32 reference. A backend that
cannot serve a shape gets a row saying why (dispatch's reasons) instead of a number.
"""
import argparse
import math
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional

import torch

from pagedattn.bench import common as C

BACKENDS = ("torch", "triton", "hip", "flashinfer")
SHORT = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}


@dataclass(frozen=True)
class DecodeShape:
    batch: int
    q_heads: int
    kv_heads: int
    head_dim: int
    block_size: int
    seq_len: int
    dtype: str = "bfloat16"
    layout: str = "bhsd"

    def label(self) -> str:
        return (f"B{self.batch} H{self.q_heads}/{self.kv_heads} D{self.head_dim} "
                f"L{self.seq_len} p{self.block_size} {SHORT[self.dtype]}")

    def bytes(self) -> int:
        """K+V read once per KV head + q read + out written + block table (int32)."""
        e = torch.empty((), dtype=getattr(torch, self.dtype)).element_size()
        kv = 2 * self.batch * self.seq_len * self.kv_heads * self.head_dim * e
        qo = 2 * self.batch * self.q_heads * self.head_dim * e
        return kv + qo + 4 * self.batch * math.ceil(self.seq_len / self.block_size)

    def flops(self) -> int:
        return 4 * self.batch * self.q_heads * self.seq_len * self.head_dim  # QK^T and PV


@dataclass(frozen=True)
class ExtendShape:
    batch: int
    q_heads: int
    kv_heads: int
    head_dim: int
    block_size: int
    prefix_len: int
    q_len: int
    dtype: str = "bfloat16"
    layout: str = "bhsd"

    def label(self) -> str:
        return (f"B{self.batch} H{self.q_heads}/{self.kv_heads} D{self.head_dim} "
                f"pre{self.prefix_len}+{self.q_len} p{self.block_size} {SHORT[self.dtype]}")

    def flops(self) -> int:
        """Causal: query i sees prefix + i + 1 keys; 4 FLOPs per (query, key, head, dim)."""
        keys = self.q_len * self.prefix_len + self.q_len * (self.q_len + 1) // 2
        return 4 * self.batch * self.q_heads * self.head_dim * keys

    def bytes(self) -> int:
        e = torch.empty((), dtype=getattr(torch, self.dtype)).element_size()
        kv = 2 * self.batch * (self.prefix_len + self.q_len) * self.kv_heads * self.head_dim * e
        return kv + 2 * self.batch * self.q_len * self.q_heads * self.head_dim * e


GPU_DECODE = [DecodeShape(b, hq, 8, 128, 16, L) for hq in (32, 64) for b, L in
              ((1, 4096), (8, 4096), (32, 2048), (64, 8192), (128, 1024), (16, 32768))]
GPU_EXTEND = [ExtendShape(b, 32, 8, 128, 16, pre, q) for b, pre, q in
              ((1, 0, 4096), (4, 0, 2048), (4, 2048, 512), (8, 4096, 256), (16, 1024, 128),
               (2, 16384, 1024))]
# CPU: Triton runs under the interpreter, which multiplies bf16 bits wrongly: fp32 tiny shapes
CPU_DECODE = [DecodeShape(2, 4, 2, 32, 16, 40, "float32"),
              DecodeShape(3, 8, 1, 64, 8, 24, "float32")]
CPU_EXTEND = [ExtendShape(2, 4, 2, 32, 16, 24, 8, "float32")]


# ----------------------------------------------------------------------------- inputs


def _paged(shape, lens: List[int], device: str, gen: torch.Generator):
    """Random caches with a shuffled block table covering ``lens`` tokens per sequence."""
    import pagedattn as pa

    dt = getattr(torch, shape.dtype)
    per = [math.ceil(n / shape.block_size) for n in lens]
    nblk = sum(per) + 1
    k, v = pa.make_kv_cache(nblk, shape.block_size, shape.kv_heads, shape.head_dim,
                            layout=shape.layout, dtype=dt, device=device)
    k.copy_(torch.randn(k.shape, generator=gen).to(dt))
    v.copy_(torch.randn(v.shape, generator=gen).to(dt))
    perm = (torch.randperm(nblk - 1, generator=gen) + 1).to(torch.int32)
    table = torch.zeros((len(lens), max(per)), dtype=torch.int32)
    start = 0
    for i, p in enumerate(per):
        table[i, :p] = perm[start:start + p]
        start += p
    return k, v, table.to(device), torch.tensor(lens, dtype=torch.int32, device=device)


def decode_inputs(s: DecodeShape, device: str, seed: int = 0) -> Dict:
    g = torch.Generator().manual_seed(seed)
    k, v, table, lens = _paged(s, [s.seq_len] * s.batch, device, g)
    q = torch.randn(s.batch, s.q_heads, s.head_dim, generator=g).to(device, getattr(torch, s.dtype))
    return dict(q=q, k=k, v=v, table=table, lens=lens)


def extend_inputs(s: ExtendShape, device: str, seed: int = 0) -> Dict:
    g = torch.Generator().manual_seed(seed)
    total = s.prefix_len + s.q_len
    k, v, table, lens = _paged(s, [total] * s.batch, device, g)
    q = torch.randn(s.batch * s.q_len, s.q_heads, s.head_dim, generator=g)
    cu = torch.arange(s.batch + 1, dtype=torch.int32) * s.q_len
    return dict(q=q.to(device, getattr(torch, s.dtype)), k=k, v=v, table=table, lens=lens,
                cu=cu.to(device))


# ----------------------------------------------------------------------------- backends


def _ours(op: str, name: str, x: Dict, layout: str) -> Callable:
    import pagedattn as pa

    if op == "paged_decode":
        C.decision(op, x["q"], x["k"], x["v"], x["table"], x["lens"], layout=layout, backend=name)
        return lambda: pa.paged_decode(x["q"], x["k"], x["v"], x["table"], x["lens"],
                                       layout=layout, backend=name, validate=False)
    C.decision(op, x["q"], x["k"], x["v"], x["table"], x["cu"], x["lens"], layout=layout,
               backend=name)
    return lambda: pa.extend_attention(x["q"], x["k"], x["v"], x["table"], x["cu"], x["lens"],
                                       layout=layout, backend=name, validate=False)


def _flashinfer(op: str, x: Dict, shape) -> Callable:
    """FlashInfer's paged wrappers on the same cache (our ``bhsd`` is FlashInfer's ``HND``)."""
    import flashinfer

    if shape.layout != "bhsd" or x["q"].device.type != "cuda":
        raise ValueError("FlashInfer runs on CUDA with the HND (= bhsd) layout only")
    dev, bs = x["q"].device, shape.block_size
    lens = x["lens"].to(torch.int64)
    pages = (lens + bs - 1) // bs
    indptr = torch.zeros(len(pages) + 1, dtype=torch.int32, device=dev)
    indptr[1:] = torch.cumsum(pages, 0)
    indices = torch.cat([x["table"][i, :int(p)] for i, p in enumerate(pages)]).to(torch.int32)
    last = ((lens - 1) % bs + 1).to(torch.int32)
    ws = torch.empty(256 * 2 ** 20, dtype=torch.uint8, device=dev)
    dt = x["q"].dtype
    if op == "paged_decode":
        # FA2 tensor-core path: FlashInfer's fastest decode on the H200 (bench_decode, 2026-11-30;
        # its "auto" picks FA3 on sm_90, 4-5x slower for GQA decode)
        w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "HND", use_tensor_cores=True,
                                                          backend="fa2")
        w.plan(indptr, indices, last, shape.q_heads, shape.kv_heads, shape.head_dim, bs,
               q_data_type=dt, kv_data_type=dt)
    else:
        w = flashinfer.BatchPrefillWithPagedKVCacheWrapper(ws, "HND")
        w.plan(x["cu"], indptr, indices, last, shape.q_heads, shape.kv_heads, shape.head_dim, bs,
               causal=True, q_data_type=dt, kv_data_type=dt)
    return lambda: w.run(x["q"], (x["k"], x["v"]))


def _reference(op: str, x: Dict, layout: str) -> torch.Tensor:
    from pagedattn import reference as R

    if op == "paged_decode":
        return R.paged_decode(x["q"], x["k"], x["v"], x["table"], x["lens"], layout=layout)
    return R.extend_attention(x["q"], x["k"], x["v"], x["table"], x["cu"], x["lens"],
                              layout=layout)


# ----------------------------------------------------------------------------- the table


def run_ab(op: str, shapes, *, device: str, ceilings: Dict, baseline: Optional[str] = None,
           backends=BACKENDS, cuda_graph: bool = False, progress=None):
    """One row per (shape, backend) -> pandas DataFrame."""
    import pandas as pd

    decode = op == "paged_decode"
    cpu_reps = dict(warmup=1, rep=3)  # the interpreter is slow; the numbers are not meaningful
    rows = []
    for s in shapes:
        x = (decode_inputs if decode else extend_inputs)(s, device)
        ref = _reference(op, x, s.layout)
        found = {}
        for name in backends:
            row = {"shape": s.label(), "backend": name}
            try:
                fn = _flashinfer(op, x, s) if name == "flashinfer" else _ours(op, name, x, s.layout)
                err = C.max_err(fn(), ref)
                kw = (cpu_reps if device == "cpu"
                      else dict(cuda_graph=cuda_graph and name != "torch"))
                t = C.time_fn(fn, device=device, **kw)
            except ImportError:  # flashinfer not installed: no row
                if progress:
                    progress.step(f"{name} not installed")
                continue
            except Exception as e:  # noqa: BLE001 - a backend's failure is a table entry
                row["note"] = C.fmt_reasons([C.failure_note(e)])
                rows.append(row)
                if progress:
                    progress.step(f"{name} {s.label()}")
                continue
            found[name] = t
            row["median µs"] = t * 1e6
            if decode:
                row["GB/s"] = s.bytes() / t / 1e9
                row["% read BW"] = 100 * row["GB/s"] / ceilings["read_GBps"]
            else:
                row["TFLOP/s"] = s.flops() / t / 1e12
                row["% matmul"] = 100 * row["TFLOP/s"] / ceilings["matmul_TFLOPs"]
            row["max err"] = err
            rows.append(row)
            if progress:
                progress.step(f"{name} {s.label()}")
        prefer = ("triton", "torch") if device == "cuda" else ("torch", "triton")
        base = baseline or next((b for b in prefer if b in found), None)
        for row in rows:
            if row["shape"] == s.label() and base in found and "median µs" in row:
                row["speed-up"] = found[base] / (row["median µs"] / 1e6)
                row["baseline"] = base
    df = pd.DataFrame(rows)
    cols = [c for c in df.columns if c != "note"] + (["note"] if "note" in df.columns else [])
    df = df[cols] if len(df) else df
    return df.astype(object).where(df.notna(), None)


def report(*, device: str, ceilings: Dict, out: str, quick: bool = False,
           baseline: Optional[str] = None, ops=("paged_decode", "extend_attention"),
           cuda_graph: bool = False) -> List[str]:
    """Run the suites of ``device``; print and write ab_decode / ab_extend tables."""
    texts = []
    for op in ops:
        if device == "cuda":
            shapes = GPU_DECODE if op == "paged_decode" else GPU_EXTEND
            shapes = shapes[::3] if quick else shapes
        else:
            shapes = CPU_DECODE if op == "paged_decode" else CPU_EXTEND
            shapes = shapes[:1] if quick else shapes
        prog = C.Progress(len(shapes) * len(BACKENDS), f"A/B {op}")
        df = run_ab(op, shapes, device=device, ceilings=ceilings, baseline=baseline,
                    cuda_graph=cuda_graph, progress=prog)
        ran = list(dict.fromkeys(df["backend"][df["median µs"].notna()])) \
            if "median µs" in df.columns else []
        header = C.results_header(device=device, ceilings=ceilings, ran=ran)
        title = f"A/B {op} on {C.device_name(device)}"
        if device == "cpu":
            title += f" ({C.cpu_note(ran)})"
        unit = ("GB/s = bytes moved (K+V once per KV head, q, out, table) / median time; "
                f"% of the read bandwidth ({ceilings['read_ceiling']})" if op == "paged_decode"
                else "TFLOP/s = causal attention FLOPs (4·H·D per visible query-key pair) / "
                f"median time; % of {ceilings['matmul_ceiling']}")
        notes = [unit, "max err = max |out - float32 reference|; speed-up = baseline time / "
                 "row time", "timing: median of CUDA-event times, L2 flushed before each call"
                 + (" (CUDA graphs for non-torch backends)" if cuda_graph else "")
                 if device == "cuda" else "timing: median wall time of 3 calls after 1 warm-up"]
        name = "ab_decode" if op == "paged_decode" else "ab_extend"
        texts.append(C.write_table(df, out, name, title=title, header=header, notes=notes,
                                   plot=dict(x="shape", y="median µs", hue="backend")
                                   if "median µs" in df.columns else None))
        print(texts[-1], flush=True)
    return texts


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="pagedattn-bench ab",
                               description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="results")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--baseline", default=None, choices=list(BACKENDS))
    ap.add_argument("--op", action="append", choices=["paged_decode", "extend_attention"])
    ap.add_argument("--cuda-graph", action="store_true", help="graph-amortised timing (GPU)")
    a = ap.parse_args(argv)
    device = C.setup_device()
    ceilings = C.measure_ceilings(device, quick=a.quick)
    report(device=device, ceilings=ceilings, out=a.out, quick=a.quick, baseline=a.baseline,
           ops=tuple(a.op or ("paged_decode", "extend_attention")), cuda_graph=a.cuda_graph)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Extend (prefix-prefill) benchmark: the Triton backend vs torch SDPA vs FlashInfer.

Shapes: Hq/Hkv 32/8, D 128, bf16, block 16, layout bhsd (= FlashInfer HND);
(batch, prefix, extend) in (1, 0, 8192), (4, 4096, 1024), (16, 1024, 512), (32, 2048, 128).

* FLOPs = 4 * D * Hq * sum_b(extend * prefix + extend * (extend + 1) / 2): QK^T and PV over the
  visible (shifted-causal) keys only.
* time: median of ``triton.testing.do_bench`` (eager: includes any host launch gap), and
  ``graph_*``: per call when 3 calls replay from one CUDA graph (no host in the loop; the
  fair kernel-to-kernel figure on a machine with slow launches); ceiling: ``torch.matmul``
  8192^3 bf16 on random data measured in the same run (pagedattn.bench.common.measure_ceilings);
  ``%mm`` = TFLOP/s / that.
* triton: ``pagedattn.extend_attention(backend="triton", max_q_len=...)`` (no host sync, no
  validation) with the new tokens' K/V read from the cache (``--new-from k_new`` reads them from
  contiguous k_new/v_new instead). ``triton noguard``: the same kernel compiled without its
  metadata guards (``PAGEDATTN_DEV_GUARDS=0``), the guards' cost in the same run.
* sdpa: torch SDPA per request on K/V gathered to contiguous tensors beforehand (the gather is
  not timed), GQA pre-expanded. Prefix 0 uses ``is_causal=True``; prefix > 0 needs the
  bottom-right (shifted) mask: ``torch.nn.attention.bias.causal_lower_right`` when available
  (keeps the fused kernels), else an explicit bool mask (slower math/efficient path). One call
  per request: the loop over the batch is inside the timed region.
* flashinfer: ``BatchPrefillWithPagedKVCacheWrapper`` (HND, causal) with backend "fa2" and
  "fa3" when ``import flashinfer`` works (plan outside the timing; JIT on first use). Every
  peer is wrapped in try/except: a failure becomes a note, never a crash.

Usage: ``python -m pagedattn.bench extend [--quick] [--out DIR] [--new-from cache|k_new]``.
Without a GPU it runs one tiny shape under the Triton interpreter and says so.
"""
import argparse
import sys

from pagedattn.bench import common as C

SHAPES = [(1, 0, 8192), (4, 4096, 1024), (16, 1024, 512), (32, 2048, 128)]
HQ, HKV, D, PAGE = 32, 8, 128, 16
CPU_SHAPE = (2, 8, 8)  # interpreter smoke shape


def flops(batch, prefix, extend, hq=HQ, d=D):
    return 4 * d * hq * batch * (extend * prefix + extend * (extend + 1) / 2)


def make_inputs(batch, prefix, extend, device, dtype, *, hq=HQ, hkv=HKV, d=D, page=PAGE):
    """Random bhsd cache on scattered pages, q, cu_seqlens, seq_lens, block table, k_new/v_new."""
    import torch

    n = prefix + extend
    pages = (n + page - 1) // page
    nblk = batch * pages + 1
    kc = torch.randn(nblk, hkv, page, d, device=device, dtype=dtype)
    vc = torch.randn_like(kc)
    table = (torch.randperm(nblk - 1, device=device)[: batch * pages] + 1).to(torch.int32)
    table = table.view(batch, pages)
    q = torch.randn(batch * extend, hq, d, device=device, dtype=dtype)
    kn = torch.randn(batch * extend, hkv, d, device=device, dtype=dtype)
    vn = torch.randn_like(kn)
    cu = torch.arange(0, batch * extend + 1, extend, device=device, dtype=torch.int32)
    lens = torch.full((batch,), n, device=device, dtype=torch.int32)
    return dict(q=q, kc=kc, vc=vc, table=table, cu=cu, lens=lens, kn=kn, vn=vn)


def run_triton(x, extend, new_from):
    import pagedattn as pa

    kw = dict(k_new=x["kn"], v_new=x["vn"]) if new_from == "k_new" else {}
    out = x["q"].new_empty(x["q"].shape)
    return lambda: pa.extend_attention(x["q"], x["kc"], x["vc"], x["table"], x["cu"], x["lens"],
                                       layout="bhsd", backend="triton", max_q_len=extend,
                                       validate=False, out=out, **kw)


def run_sdpa(x, batch, prefix, extend):
    import torch
    import torch.nn.functional as F

    from pagedattn.layouts import gather_kv

    n, g = prefix + extend, HQ // HKV
    ks, vs, qs = [], [], []
    for b in range(batch):
        k, v = gather_kv(x["kc"], x["vc"], x["table"][b], n, "bhsd")  # [n, Hkv, D]
        ks.append(k.repeat_interleave(g, 1).transpose(0, 1).unsqueeze(0).contiguous())
        vs.append(v.repeat_interleave(g, 1).transpose(0, 1).unsqueeze(0).contiguous())
        qs.append(x["q"][b * extend:(b + 1) * extend].transpose(0, 1).unsqueeze(0).contiguous())
    if prefix == 0:
        kw, how = dict(is_causal=True), "is_causal"
    else:
        try:
            from torch.nn.attention.bias import causal_lower_right
            kw, how = dict(attn_mask=causal_lower_right(extend, n)), "causal_lower_right"
        except ImportError:
            j = torch.arange(n, device=x["q"].device)
            m = j.view(1, -1) <= torch.arange(prefix, n, device=x["q"].device).view(-1, 1)
            kw, how = dict(attn_mask=m), "bool mask"

    def fn():
        for b in range(batch):
            F.scaled_dot_product_attention(qs[b], ks[b], vs[b], **kw)
    return fn, how


def run_flashinfer(x, batch, prefix, extend, backend):
    import torch
    import flashinfer  # noqa: F401  (ImportError -> note)
    from flashinfer import BatchPrefillWithPagedKVCacheWrapper

    dev = x["q"].device
    n = prefix + extend
    pages = x["table"].shape[1]
    ws = torch.empty(256 << 20, dtype=torch.uint8, device=dev)
    w = BatchPrefillWithPagedKVCacheWrapper(ws, kv_layout="HND", backend=backend)
    kv_indptr = torch.arange(0, batch * pages + 1, pages, dtype=torch.int32, device=dev)
    last = torch.full((batch,), n - (pages - 1) * PAGE, dtype=torch.int32, device=dev)
    w.plan(x["cu"], kv_indptr, x["table"].reshape(-1).contiguous(), last, HQ, HKV, D, PAGE,
           causal=True, q_data_type=x["q"].dtype)
    return lambda: w.run(x["q"], (x["kc"], x["vc"]))


def _time(fn, device):
    import time

    if device == "cuda":
        import triton

        return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median") / 1e3
    fn()
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="pagedattn-bench extend",
                                description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="two shapes, one FlashInfer backend")
    p.add_argument("--out", default=None, help="write extend.{md,csv,json} here")
    p.add_argument("--new-from", choices=["cache", "k_new"], default="cache")
    a = p.parse_args(argv)
    device = C.setup_device()
    import pandas as pd
    import torch

    ceil = C.measure_ceilings(device, quick=a.quick)
    mm = ceil["matmul_TFLOPs"]
    if device == "cuda":
        shapes, dtype = (SHAPES[:2] if a.quick else SHAPES), torch.bfloat16
        fi_backends = ["fa2"] if a.quick else ["fa2", "fa3"]
    else:  # the interpreter: fp16 (its bf16 tl.dot is wrong), one tiny shape, no peers' JIT
        shapes, dtype, fi_backends = [CPU_SHAPE], torch.float16, []
    rows, notes = [], []
    for batch, prefix, extend in shapes:
        torch.manual_seed(0)
        x = make_inputs(batch, prefix, extend, device, dtype)
        f = flops(batch, prefix, extend)
        peers = [("triton", lambda: (run_triton(x, extend, a.new_from), ""))]
        if device == "cuda":  # the guards' cost: the same kernel compiled without them
            peers.append(("triton noguard", lambda: (C.with_env(
                run_triton(x, extend, a.new_from), PAGEDATTN_DEV_GUARDS="0"), "")))
        peers.append(("torch sdpa", lambda: run_sdpa(x, batch, prefix, extend)))
        for be in fi_backends:
            peers.append((f"flashinfer {be}",
                          lambda be=be: (run_flashinfer(x, batch, prefix, extend, be), "")))
        for name, build in peers:
            row = dict(batch=batch, prefix=prefix, extend=extend, provider=name)
            try:
                fn, how = build()
                t = _time(fn, device)
                row.update(ms=round(t * 1e3, 4), TFLOPs=round(f / t / 1e12, 2),
                           pct_matmul=round(100 * f / t / 1e12 / mm, 1), note=how)
                if device == "cuda":
                    try:
                        g = C.time_fn(fn, device="cuda", cuda_graph=True, graph_calls=3, rep=100)
                        row.update(graph_ms=round(g * 1e3, 4), graph_TFLOPs=round(f / g / 1e12, 2),
                                   graph_pct_matmul=round(100 * f / g / 1e12 / mm, 1))
                    except Exception as e:  # noqa: BLE001 - e.g. a peer that syncs in run()
                        row["note"] = (how + f"; graph: {type(e).__name__}")[:100]
            except Exception as e:  # noqa: BLE001 - a peer's failure is a note, not a crash
                row.update(ms=None, TFLOPs=None, pct_matmul=None, note=C.failure_note(e)[:90])
            rows.append(row)
        del x
        if device == "cuda":
            torch.cuda.empty_cache()
    df = pd.DataFrame(rows)
    ran = list(dict.fromkeys(r["provider"] for r in rows if r.get("ms") is not None))
    if device == "cpu":
        notes.insert(0, C.cpu_note(ran) + f": one tiny shape {CPU_SHAPE} in fp16")
    header = C.results_header(device=device, ceilings={"matmul_TFLOPs": mm,
                                                       "matmul_ceiling": ceil["matmul_ceiling"]},
                              ran=ran)
    notes.append(f"Hq/Hkv {HQ}/{HKV}, D {D}, page {PAGE}, layout bhsd, new K/V from "
                 f"{a.new_from}; FLOPs count visible (shifted-causal) keys only")
    print(C.header_markdown(header))
    print(C.markdown(df))
    for n in notes:
        print("*", n)
    if a.out:
        C.write_table(df, a.out, "extend", title="Extend attention",
                      header=header, notes=notes)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Paged decode benchmark: the Triton and HIP backends vs torch SDPA vs FlashInfer.

Shapes: Hq/Hkv 32/8 and 32/32, D 128, bf16, block 16 and 64, (batch, ctx) in
(1, 32768), (8, 8192), (64, 4096), (256, 2048), (128, 512); layout bhsd (= FlashInfer HND).

* time: ``triton.testing.do_bench`` median. Every KV cache here is >= 134 MB, well past the
  H200's 60 MB L2, so the KV reads come from HBM (cold L2) without rotating inputs.
* bytes: K + V bytes read + q bytes read + out bytes written.
* ceiling: read bandwidth measured in the same run over a 4 GiB bf16 tensor, the best of
  ``x.sum()`` and a streaming-read kernel (``pagedattn.bench.read_probe``; bytes read / time).
  ``frac`` = achieved / that.
* peers: torch SDPA on contiguous [B, H, ctx, D] K/V (``enable_gqa``), and FlashInfer's
  ``BatchDecodeWithPagedKVCacheWrapper`` (HND = our bhsd) when ``import flashinfer`` works, in
  its three paths: ``flashinfer`` (tensor cores, backend "auto": FA3 on sm_90),
  ``flashinfer_fa2`` (tensor cores, FA2) and ``flashinfer_cuda`` (``use_tensor_cores=False``).
  Every peer is wrapped in try/except: a failure is a note in the table, never a crash.
* ``hip``: the hand-written HIP/CUDA backend, timed like ``triton`` (its build is a
  JIT compile on first use; a failure is a note).
* ``triton`` is the backend's default (``PAGEDATTN_DEV_DECODE_KERNEL=auto``: the Gluon sm_90 kernel
  for MHA, the Triton kernel for GQA); ``triton_tl`` forces the Triton kernel and
  ``triton_gluon`` the Gluon kernel (the Triton kernel where the Gluon gate refuses the call);
  ``triton_noguard`` is ``triton`` compiled without its metadata guards
  (``PAGEDATTN_DEV_GUARDS=0``): the guards' cost, timed in the same rounds.
* CUDA-graph times (``*_graph_*``): the median of ROUNDS rounds; each round times every peer
  once, in an order rotated by one peer per round.

Usage: ``python -m pagedattn.bench decode [--quick] [--out DIR] [--mode MODE]``.
On a CPU it runs one tiny shape under the Triton interpreter and says so (timings meaningless).
"""
import argparse
import os
import statistics
import sys

from pagedattn.bench import common as C
from pagedattn.bench.common import time_fn

SHAPES = [(1, 32768), (8, 8192), (64, 4096), (256, 2048), (128, 512)]
HEADS = [(32, 8), (32, 32)]
BLOCKS = [16, 64]
D = 128
# graph timings per peer: the median of ROUNDS rounds, the peers in a rotated order each round
# (one pass in a fixed order let drift within a row favour whichever peer ran first or last)
ROUNDS = 3


def _bench(fn, device):
    import time

    if device == "cuda":
        import triton

        return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e3
    fn()
    t = time.perf_counter()
    fn()
    return (time.perf_counter() - t) * 1e6


def _bench_graph(fn, rep=100):
    """µs per call when 10 calls replay from one CUDA graph (pagedattn.bench.common.time_fn).

    NOTE serving engines capture decode in CUDA graphs; eager timing of a ~30 us kernel mostly
    measures the Python launch path (validation, dispatch, argument packing), so both are shown.
    """
    return time_fn(fn, device="cuda", cuda_graph=True, graph_calls=10, rep=rep) * 1e6


def _case(batch, ctx, hq, hkv, bs, dtype, device, gen):
    import torch

    import pagedattn as pa

    pages = (ctx + bs - 1) // bs
    nblocks = batch * pages + 1
    k, v = pa.make_kv_cache(nblocks, bs, hkv, D, layout="bhsd", dtype=dtype, device=device)
    k.normal_(generator=gen)
    v.normal_(generator=gen)
    perm = torch.randperm(nblocks - 1, device=device, generator=gen) + 1  # scattered pages
    table = perm.view(batch, pages).to(torch.int32)
    lens = torch.full((batch,), ctx, dtype=torch.int32, device=device)
    q = torch.randn(batch, hq, D, dtype=dtype, device=device, generator=gen)
    return q, k, v, table, lens


def _ours(q, k, v, table, lens, out, backend, kv_scale=None):
    """One of this package's decode backends, validation off (the timed call); kv_scale: the
    k_scale = v_scale of an fp8 cache (float32 [Hkv])."""
    import pagedattn as pa

    kw = dict(k_scale=kv_scale, v_scale=kv_scale) if kv_scale is not None else {}
    return lambda: pa.paged_decode(q, k, v, table, lens, backend=backend, out=out,
                                   validate=False, **kw)


def _sdpa(q, k, v, table, lens, bs):
    """torch SDPA on contiguous K/V gathered once (not timed): [B, Hkv, ctx, D]."""
    import torch

    b, hq, d = q.shape
    ctx = int(lens[0])
    kd = k[table.long()].permute(0, 2, 1, 3, 4).reshape(b, k.shape[1], -1, d)[:, :, :ctx]
    vd = v[table.long()].permute(0, 2, 1, 3, 4).reshape(b, v.shape[1], -1, d)[:, :, :ctx]
    kd, vd = kd.contiguous(), vd.contiguous()
    q4 = q.unsqueeze(2)
    f = torch.nn.functional.scaled_dot_product_attention
    return lambda: f(q4, kd, vd, enable_gqa=kd.shape[1] != hq)


# FlashInfer's three decode paths (column name: _flashinfer keywords)
FLASHINFER_PATHS = {"flashinfer": {}, "flashinfer_fa2": {"backend": "fa2"},
                    "flashinfer_cuda": {"tensor_cores": False}}


def _flashinfer(q, k, v, table, lens, bs, tensor_cores=True, backend="auto"):
    """FlashInfer's batch decode: tensor-core path (its prefill kernels: FA3 on sm_90 under
    "auto", or FA2) or the CUDA-core decode kernel (``tensor_cores=False``). Each sequence's
    pages up to its length (lens >= 1); the plan runs here, untimed, as engines run it once per
    batch."""
    import flashinfer
    import torch

    b, hq, d = q.shape
    # each sequence's own pages (its length, not the table's width): ragged batches too
    pages = ((lens.long() + bs - 1) // bs).clamp(min=1)
    indptr = torch.zeros(b + 1, dtype=torch.int32, device=q.device)
    indptr[1:] = torch.cumsum(pages, 0).to(torch.int32)
    cols = torch.arange(table.shape[1], device=q.device)
    indices = table[cols[None, :] < pages[:, None]].contiguous()  # row-major: sequence order
    last = ((lens - 1) % bs + 1).to(torch.int32)
    ws = torch.empty(256 << 20, dtype=torch.uint8, device=q.device)
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "HND", use_tensor_cores=tensor_cores,
                                                      backend=backend)
    w.plan(indptr, indices, last, hq, k.shape[1], d, bs, q_data_type=q.dtype,
           kv_data_type=k.dtype)
    return lambda: w.run(q, (k, v))


def main(argv=None):
    ap = argparse.ArgumentParser(prog="pagedattn-bench decode",
                               description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="one head config, block 16, 3 shapes")
    ap.add_argument("--out", default=None, help="directory for decode.{md,csv,json}")
    ap.add_argument("--mode", default=None, choices=["one_pass", "split", "balance", "count"],
                    help="force the launch shape (default: the kernel's rule)")
    args = ap.parse_args(argv)

    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")
    import pandas as pd
    from tabulate import tabulate

    import importlib

    from pagedattn._triton import triton_available

    # without triton the Triton rows are notes (dispatch's reason) and the mode column is empty
    PD = importlib.import_module("pagedattn.triton_kernels.decode") if triton_available() \
        else None
    if PD is not None:
        PD.FORCE_MODE = args.mode
    gen = torch.Generator(device=device).manual_seed(0)
    if device == "cuda":
        dtype = torch.bfloat16
        shapes, heads, blocks = SHAPES, HEADS, BLOCKS
        if args.quick:
            shapes, heads, blocks = [(1, 32768), (64, 4096), (256, 2048)], HEADS[:1], BLOCKS[:1]
        dev_name = torch.cuda.get_device_name(0)
    else:  # interpreter smoke: fp16 (the interpreter's bf16 dot is wrong), one tiny shape
        dtype = torch.float16
        shapes, heads, blocks = [(2, 40)], [(8, 2)], [16]
        dev_name = "CPU (Triton interpreter: timings NOT meaningful, smoke run only)" \
            if PD is not None else "CPU (triton is not installed: the Triton row is a note)"
    from pagedattn.bench.read_probe import read_ceiling

    bw, bw_how, bw_all = read_ceiling(device, (4 << 30) if device == "cuda" else (16 << 20))
    try:
        import flashinfer  # noqa: F401
        fi_note = "available"
    except Exception as e:  # noqa: BLE001
        fi_note = f"unavailable ({type(e).__name__})"
    rows = []
    if device == "cuda":
        # NOTE the first timed row of a process reads 3-4 us slow at (1, 32768) in two runs
        # (47.3 / 42.3 us vs 44.1 / 38.4 in sweeps of the same code): time it once untimed first
        q, k, v, table, lens = _case(*shapes[0], *heads[0], blocks[0], dtype, device, gen)
        out = torch.empty_like(q)
        _bench_graph(_ours(q, k, v, table, lens, out, "triton"))
        del q, k, v, table, lens, out
    for hq, hkv in heads:
        for bs in blocks:
            for batch, ctx in shapes:
                try:
                    q, k, v, table, lens = _case(batch, ctx, hq, hkv, bs, dtype, device, gen)
                except Exception as e:  # noqa: BLE001 (e.g. out of memory)
                    rows.append(dict(Hq=hq, Hkv=hkv, block=bs, batch=batch, ctx=ctx,
                                     note=f"setup failed: {e}"[:80]))
                    continue
                nbytes = 2 * batch * ctx * hkv * D * k.element_size() + 2 * q.numel() * 2
                mode = args.mode
                if mode is None and PD is not None:
                    n_part = -(-table.shape[1] * bs // PD.default_partition_size(hq // hkv))
                    mode = PD._mode(batch, hkv, q.device, n_part)
                row = dict(Hq=hq, Hkv=hkv, block=bs, batch=batch, ctx=ctx, mode=mode,
                           MB=round(nbytes / 1e6, 1))
                out = torch.empty_like(q)
                peers = {"triton": lambda: _ours(q, k, v, table, lens, out, "triton")}
                if device == "cuda":  # each decode kernel of the Triton backend alone
                    peers["triton_tl"] = lambda: C.with_env(
                        _ours(q, k, v, table, lens, out, "triton"),
                        PAGEDATTN_DEV_DECODE_KERNEL="triton")
                    peers["triton_gluon"] = lambda: C.with_env(
                        _ours(q, k, v, table, lens, out, "triton"),
                        PAGEDATTN_DEV_DECODE_KERNEL="gluon")
                    # the guards' cost, in the same rounds: what auto runs, compiled without
                    peers["triton_noguard"] = lambda: C.with_env(
                        _ours(q, k, v, table, lens, out, "triton"), PAGEDATTN_DEV_GUARDS="0")
                if device == "cuda":
                    peers["hip"] = lambda: _ours(q, k, v, table, lens, out, "hip")
                    peers["sdpa"] = lambda: _sdpa(q, k, v, table, lens, bs)
                    if fi_note == "available":  # its three decode paths; the best is the peer
                        for name, kw in FLASHINFER_PATHS.items():
                            peers[name] = lambda kw=kw: _flashinfer(q, k, v, table, lens, bs,
                                                                    **kw)
                notes = []
                fns = {}
                for name, make in peers.items():
                    try:
                        fn = make()
                        us = _bench(fn, device)
                        row[f"{name}_us"] = round(us, 1)
                        row[f"{name}_frac"] = round(nbytes / (us * 1e-6) / bw, 3)
                        fns[name] = fn
                    except Exception as e:  # noqa: BLE001
                        notes.append(f"{name}: {C.failure_note(e)}"[:100])
                if device == "cuda":  # graph timings in rounds, each in a rotated peer order
                    times = {name: [] for name in fns}
                    for r in range(ROUNDS):
                        order = list(fns)[r % len(fns):] + list(fns)[:r % len(fns)]
                        for name in order:
                            try:
                                times[name].append(_bench_graph(fns[name], rep=60))
                            except Exception as e:  # noqa: BLE001
                                if not any(n.startswith(f"{name} graph") for n in notes):
                                    notes.append(f"{name} graph: {type(e).__name__}: {e}"[:100])
                    for name, ts in times.items():
                        if ts:
                            gus = statistics.median(ts)
                            row[f"{name}_graph_us"] = round(gus, 1)
                            row[f"{name}_graph_frac"] = round(nbytes / (gus * 1e-6) / bw, 3)
                fns = fn = None
                row["note"] = "; ".join(notes)
                rows.append(row)
                del q, k, v, table, lens, out
                if device == "cuda":
                    torch.cuda.empty_cache()
    df = pd.DataFrame(rows)
    ran = [c[:-3] for c in df.columns if c.endswith("_us") and not c.endswith("_graph_us")
           and df[c].notna().any()]
    header = C.results_header(device=device, ceilings={"read_GBps": bw / 1e9}, ran=ran)
    header.update(dtype=str(dtype), D=str(D), layout="bhsd")
    notes = [f"read bandwidth ({bw_how}; bytes read / time); GB/s of each: "
             + ", ".join(f"{k} {v:.0f}" for k, v in bw_all.items()),
             "frac = (K+V+q+out bytes / time) / that; *_graph_* = time per call replayed from a "
             f"CUDA graph of 10 calls (how engines run decode), median of {ROUNDS} rounds in "
             "rotated peer order", f"flashinfer {fi_note}", f"device: {dev_name}"]
    text = C.write_table(df, args.out, "decode", title="Paged decode", header=header,
                         notes=notes) if args.out else \
        C.header_markdown(header) + "\n\n" + tabulate(df, headers="keys", tablefmt="github",
                                                       showindex=False)
    print(text)
    return df


if __name__ == "__main__":
    sys.exit(0 if main() is not None else 1)

"""The read ceiling: the fastest of ``x.sum()`` and a Triton streaming-read kernel over the same
large tensor (reads only; one tiny write per program).

``x.sum()`` alone reads ~11 % below what attention kernels reach on the H200 (2026-11-30 tables:
4.28 TB/s against 4.69 TB/s seen in the same run), which put decode fractions above 1. The
streaming kernel keeps ``ITERS`` independent 16-byte loads per thread in flight and is timed over
a few tile shapes; the ceiling is the best of all candidates, so a kernel's fraction of it is an
honest "how close to what this device can read".
"""
from typing import Dict, Tuple

# (BLOCK elements per load, loads per program, warps): candidates, the best one wins
CONFIGS = ((4096, 8, 4), (8192, 8, 8), (8192, 16, 8), (16384, 4, 8))


def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def stream_read(x_ptr, part_ptr, n, BLOCK: tl.constexpr, ITERS: tl.constexpr):
        pid = tl.program_id(0)
        base = pid.to(tl.int64) * (BLOCK * ITERS)
        offs = tl.arange(0, BLOCK)
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for i in tl.static_range(ITERS):  # unrolled: every load issued before the first add
            idx = base + i * BLOCK + offs
            acc += tl.load(x_ptr + idx, mask=idx < n, other=0.0,
                           eviction_policy="evict_first").to(tl.float32)
        tl.store(part_ptr + pid, tl.sum(acc, 0))

    return stream_read


_K = {}


def stream_sum(x, block: int, iters: int, warps: int):
    """Partial sums of x (1-D) by the streaming kernel: ``[programs]`` float32."""
    import torch
    import triton

    if "k" not in _K:
        _K["k"] = _kernel()
    n = x.numel()
    grid = (triton.cdiv(n, block * iters),)
    part = torch.empty(grid[0], dtype=torch.float32, device=x.device)
    _K["k"][grid](x, part, n, BLOCK=block, ITERS=iters, num_warps=warps)
    return part


def read_ceiling(device: str, n_bytes: int, *,
                 graph_calls: int = 0) -> Tuple[float, str, Dict[str, float]]:
    """(bytes/s, how, every candidate's GB/s) over an ``n_bytes`` bf16 tensor (fp32 on the CPU).

    graph_calls > 0 (GPU): each candidate is timed as one replay of a CUDA graph of that many
    calls, as bench_decode times decode (scripts/read_size_sweep.py)."""
    import torch

    from pagedattn.bench.common import time_fn

    elem = torch.bfloat16 if device == "cuda" else torch.float32
    x = torch.ones(n_bytes // torch.empty((), dtype=elem).element_size(), dtype=elem,
                   device=device)
    timing = dict(device=device, warmup=2, rep=10, flush_l2=False)
    if graph_calls:
        timing.update(cuda_graph=True, graph_calls=graph_calls, rep=60)
    cands = {"x.sum": time_fn(lambda: x.sum(dtype=torch.float32), **timing)}
    if device == "cuda":  # the interpreter would take minutes over 64 MiB
        for blk, it, w in CONFIGS:
            cands[f"stream {blk}x{it}/{w}w"] = time_fn(
                lambda: stream_sum(x, blk, it, w), **timing)
    del x
    gbps = {k: n_bytes / t / 1e9 for k, t in cands.items()}
    best = max(gbps, key=gbps.get)
    return gbps[best] * 1e9, f"best of {len(gbps)} reads of {n_bytes / 2 ** 30:.2g} GiB: {best}", gbps

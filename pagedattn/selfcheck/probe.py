"""The matrix-instruction layout probe: known tiles through each backend's matrix unit.

Each backend computes ``C = A @ B^T`` (fp32 accumulate) for A ``[M, K]`` and B ``[N, K]`` holding
small integers, so the exact product is representable and any difference is a layout error, not
rounding. Triton runs a one-``tl.dot`` kernel (MFMA, MMAC, mma.sync or WGMMA, whatever the
compiler picks for the device); HIP runs ``pagedattn.hip_kernels.mma_probe`` (the kernels'
``mma_nt`` abstraction on one 16x16x16 tile). A wrong result is compared with the products a
mis-ordered operand or lane map would give, so the report says *which* layout is wrong; a probe
that passes while the attention cases fail points at the kernel instead.
"""
import functools
from typing import Callable, List, NamedTuple, Optional

import torch


class ProbeResult(NamedTuple):
    backend: str
    tile: str  # e.g. "fp16 16x16x16"
    status: str  # "pass" | "fail" | "skip"
    detail: str = ""


def known_tiles(m: int, n: int, k: int, dtype: torch.dtype, seed: int = 0):
    """A [m, k], B [n, k]: integers in [-3, 3], so every dot product is exact in fp32."""
    g = torch.Generator().manual_seed(seed)
    a = torch.randint(-3, 4, (m, k), generator=g).to(dtype)
    b = torch.randint(-3, 4, (n, k), generator=g).to(dtype)
    return a, b


def diagnose(c: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> str:
    """'' when ``c == a @ b^T`` exactly, else what ``c`` looks like."""
    af, bf = a.float(), b.float()
    want = af @ bf.T
    c = c.float().cpu()
    if c.shape == want.shape and torch.equal(c, want):
        return ""
    if c.shape != want.shape:
        return f"shape {tuple(c.shape)}, expected {tuple(want.shape)}"
    if torch.isnan(c).any():
        return f"{int(torch.isnan(c).sum())} NaN elements (unwritten or garbage lanes)"
    square = a.shape[0] == b.shape[0] == a.shape[1]
    # (A @ B^T)^T = B @ A^T: a swapped accumulator lane map and swapped operands look alike
    named = [("C transposed: the accumulator's row/column lane map, or the operands, swapped",
              want.T)] if want.shape[0] == want.shape[1] else []
    if square:
        named += [("A @ B: operand B taken untransposed (B's layout)", af @ bf),
                  ("A^T @ B^T: operand A taken transposed (A's layout)", af.T @ bf.T)]
    for what, alt in named:
        if torch.equal(c, alt):
            return f"matches {what}"
    bad = (c != want).nonzero()
    rows, cols = sorted({int(r) for r in bad[:, 0]}), sorted({int(x) for x in bad[:, 1]})
    r0, c0 = (int(x) for x in bad[0])
    return (f"{bad.shape[0]} of {c.numel()} elements wrong in rows {rows[:8]} and columns "
            f"{cols[:8]} (first 8); first at ({r0}, {c0}): {c[r0, c0].item():g} instead of "
            f"{want[r0, c0].item():g}")


@functools.lru_cache(maxsize=None)
def _triton_kernel():
    from pagedattn._triton import require_triton
    triton = require_triton()
    import triton.language as tl

    @triton.jit
    def mma_nt_probe(a_ptr,  # [M, K]
                     b_ptr,  # [N, K]
                     c_ptr,  # [M, N] float32
                     M: tl.constexpr, N: tl.constexpr, K: tl.constexpr):
        rm, rn, rk = tl.arange(0, M), tl.arange(0, N), tl.arange(0, K)
        a = tl.load(a_ptr + rm[:, None] * K + rk[None, :])  # (M, K)
        b = tl.load(b_ptr + rn[:, None] * K + rk[None, :])  # (N, K)
        c = tl.dot(a, tl.trans(b))  # (M, N) fp32 accumulate
        tl.store(c_ptr + rm[:, None] * N + rn[None, :], c)

    return mma_nt_probe


def triton_mma_nt(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b.T`` through one Triton ``tl.dot`` (a [M, K], b [N, K] on the same device)."""
    m, k = a.shape
    n = b.shape[0]
    c = torch.full((m, n), float("nan"), dtype=torch.float32, device=a.device)
    _triton_kernel()[(1,)](a_ptr=a.contiguous(), b_ptr=b.contiguous(), c_ptr=c, M=m, N=n, K=k)
    return c


def hip_mma_nt() -> Optional[Callable]:
    """``pagedattn.hip_kernels.mma_probe`` (fp16 16x16 A, B -> fp32 A @ B^T), None where the
    installed package has no probe entry."""
    from pagedattn import hip_kernels
    return getattr(hip_kernels, "mma_probe", None)


def probe(backend: str, device: torch.device, dtypes, why_not: Optional[str] = None
          ) -> List[ProbeResult]:
    """Run the probe for ``backend`` on ``device`` over ``dtypes``; ``why_not``: the reason the
    backend cannot run here (every tile is then skipped with it)."""
    shapes = [(16, 16, 16), (64, 32, 32)] if backend == "triton" else [(16, 16, 16)]
    out = []
    for dtype in dtypes:
        for m, n, k in shapes:
            tile = f"{str(dtype).replace('torch.', '')} {m}x{n}x{k}"
            if why_not:
                out.append(ProbeResult(backend, tile, "skip", why_not))
                continue
            if backend == "hip" and dtype != torch.float16:
                continue  # mma_probe's contract: fp16 tiles
            fn = triton_mma_nt if backend == "triton" else hip_mma_nt()
            if fn is None:
                out.append(ProbeResult(backend, tile, "skip",
                                       "not available: pagedattn.hip_kernels has no mma_probe"))
                continue
            a, b = known_tiles(m, n, k, dtype)
            try:
                c = fn(a.to(device), b.to(device))
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
            except Exception as e:  # a launch or build failure is this probe's result
                out.append(ProbeResult(backend, tile, "fail", f"{type(e).__name__}: {e}"[:300]))
                continue
            bad = diagnose(c, a, b)
            out.append(ProbeResult(backend, tile, "fail" if bad else "pass", bad))
    return out

"""The self-check's small cases: each op through one forced backend against the float32 reference.

Inputs are fresh N(0, 1) draws; paged caches start as NaN everywhere (fp8: the format's NaN) and
only the sequences' tokens are written, on scattered blocks, so a read of a slot outside a
sequence shows as NaN; outputs are NaN-filled before the launch, so an unwritten element fails.
``store_kv`` and ``copy_blocks`` run on a copy of one random cache each, and the whole cache is
compared with the reference's: a write to a wrong slot fails too. Tolerances follow the tests'
(fp16 2e-3, bf16 1.5e-2 / 1e-2, fp8 KV 1e-1, on top of a relative-L2 bound).
"""
from typing import NamedTuple, Tuple

import torch

from pagedattn import layouts as L
from pagedattn import reference as R

LAYOUTS = ("bhsd", "bshd", "vllm", "hcu")
OPS = ("paged_decode", "extend_attention", "store_kv", "copy_blocks")
F16, BF16, E4M3, E5M2 = torch.float16, torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2
# (q / k dtype, cache dtype): both 16-bit types, and each fp8 format under one of them
DTYPES = ((F16, F16), (BF16, BF16), (F16, E5M2), (BF16, E4M3))
NUM_BLOCKS = 12


class Geometry(NamedTuple):
    kv_heads: int
    group: int
    head_dim: int
    head_dim_v: int
    block_size: int
    mla: bool  # V is the K cache's first head_dim_v columns (v_cache=None)


# base: GQA 2 at D 64, 16-token pages; odd: K 80 / V 48 wide on 6-token pages (not powers of
# 2); mla: DeepSeek's absorbed form, one latent KV head of 576 columns, V its first 512
SHAPES = {"base": Geometry(2, 2, 64, 64, 16, False), "odd": Geometry(2, 2, 80, 48, 6, False),
          "mla": Geometry(1, 16, 576, 512, 16, True)}
K_SCALE, V_SCALE = 0.37, 3.1  # distinct, so a swapped scale fails
# (atol, rtol, rel-L2 bound, LSE atol) by the dtype that limits accuracy
TOL = {F16: (2e-3, 2e-3, 2e-3, 1e-3), BF16: (1.5e-2, 1e-2, 1e-2, 1e-2),
       "fp8": (1e-1, 1e-1, 5e-2, 1e-2)}


class Case(NamedTuple):
    op: str
    layout: str
    dtype: torch.dtype  # q's (store_kv: k's; copy_blocks: the cache's)
    kv_dtype: torch.dtype
    shape: str = "base"  # a key of SHAPES

    @property
    def geom(self) -> Geometry:
        return SHAPES[self.shape]

    @property
    def name(self) -> str:
        kv = "" if self.kv_dtype == self.dtype else "/" + _short(self.kv_dtype)
        shape = "" if self.shape == "base" else f" {self.shape}"
        return f"{self.op} {self.layout} {_short(self.dtype)}{kv}{shape}"


def _short(dtype) -> str:
    return {F16: "fp16", BF16: "bf16", E4M3: "e4m3", E5M2: "e5m2"}.get(dtype, str(dtype))


def all_cases():
    for op in OPS:
        for layout in LAYOUTS:
            for dtype, kv in DTYPES:
                if op == "copy_blocks" and dtype == BF16:
                    continue  # a bitwise copy: one 16-bit and one fp8 cache per layout suffice
                yield Case(op, layout, dtype, kv)
    # the new shapes, once per op in the layout engines use for them, each 16-bit type and e5m2
    for op in ("paged_decode", "extend_attention", "store_kv"):
        for shape in ("odd", "mla"):
            for dtype, kv in ((F16, F16), (BF16, BF16), (F16, E5M2)):
                yield Case(op, "bshd", dtype, kv, shape)


def _fp8(dtype) -> bool:
    return dtype in (E4M3, E5M2)


def _scales(case):
    return dict(k_scale=K_SCALE, v_scale=V_SCALE) if _fp8(case.kv_dtype) else {}


def _randn(shape, dtype, gen, device):
    return torch.randn(shape, generator=gen).to(dtype).to(device)


def _paged(case, lens, gen, device):
    """A NaN-poisoned cache holding N(0, 1) tokens for ``lens`` on scattered blocks (block 0, the
    padding of every table row, is never written), and the block table."""
    g = case.geom
    bs = g.block_size
    k, v = _nan_cache(case, device)
    perm = (torch.randperm(NUM_BLOCKS - 1, generator=gen) + 1).tolist()
    width = max(-(-n // bs) for n in lens)
    table = torch.zeros(len(lens), width, dtype=torch.int32)
    for i, n in enumerate(lens):
        ids = [perm.pop() for _ in range(-(-n // bs))]
        table[i, :len(ids)] = torch.tensor(ids, dtype=torch.int32)
        blocks, offs = L.slots_of(table[i], torch.arange(n), bs)
        slots = blocks * bs + offs
        R.store_kv(_randn((n, g.kv_heads, g.head_dim), torch.float32, gen, device),
                   None if g.mla else _randn((n, g.kv_heads, g.head_dim_v), torch.float32, gen,
                                             device), k, v, slots.to(device),
                   layout=case.layout, **_scales(case))
    return k, (None if g.mla else v), table.to(device)


def _nan_cache(case, device):
    """(k, v) full of NaN; for MLA v is the K cache's leading head_dim_v columns."""
    g = case.geom
    ks, vs = L.kv_cache_shapes(NUM_BLOCKS, g.block_size, g.kv_heads, g.head_dim, case.layout,
                               case.kv_dtype, g.head_dim_v)
    k = torch.full(ks, float("nan")).to(case.kv_dtype).to(device)
    v = k[..., :g.head_dim_v] if g.mla else \
        torch.full(vs, float("nan")).to(case.kv_dtype).to(device)
    return k, v


def _kw(case):
    g = case.geom
    return dict(layout=case.layout, **_scales(case), **({"head_dim_v": g.head_dim_v}
                                                          if g.mla else {}))


def _ref_v(k, v, case):
    return k[..., :case.geom.head_dim_v] if v is None else v


def _close(out, ref, lse, ref_lse, case) -> str:
    tol = TOL["fp8" if _fp8(case.kv_dtype) else case.dtype]
    atol, rtol, l2, lse_atol = tol
    o, r = out.float().cpu(), ref.float()
    if torch.isnan(o).any():
        return f"{int(torch.isnan(o).sum())} NaN outputs (unwritten, or poisoned slots read)"
    err = (o - r).abs()
    bad = err > atol + rtol * r.abs()
    rel = ((o - r).norm() / r.norm().clamp_min(1e-30)).item()
    if bad.any() or rel > l2:
        i = int(err.argmax())
        return (f"max |err| {err.max().item():.3g} at flat {i}, {int(bad.sum())} of {o.numel()} "
                f"out of tolerance, rel-L2 {rel:.3g} (bound {l2})")
    if lse is not None:
        a, b = lse.float().cpu(), ref_lse.float()
        fin = torch.isfinite(b)
        if not torch.equal(torch.isfinite(a), fin):
            return "lse: finite where the reference is -inf, or the reverse"
        d = (a[fin] - b[fin]).abs().max().item() if fin.any() else 0.0
        if d > lse_atol + 1e-5 * b[fin].abs().max().item():
            return f"lse: max |err| {d:.3g} (tolerance {lse_atol})"
    return ""


def _decode(case, gen, device):
    g = case.geom
    lens = [1, 17, 40]  # one token, one past a block, several blocks
    k, v, table = _paged(case, lens, gen, device)
    q = _randn((len(lens), g.kv_heads * g.group, g.head_dim), case.dtype, gen, device)
    seq = torch.tensor(lens, dtype=torch.int32, device=device)
    args, kw = (q, k, v, table, seq), _kw(case)
    ref = (q, k, _ref_v(k, v, case), table, seq)
    rkw = dict(layout=case.layout, **_scales(case))
    return args, kw, lambda: R.paged_decode(*(t.cpu() for t in ref), return_lse=True, **rkw)


def _extend(case, gen, device):
    g = case.geom
    q_lens, lens = [5, 3], [21, 3]  # a 16-token prefix with 5 new; a 3-token pure prefill
    k, v, table = _paged(case, lens, gen, device)
    q = _randn((sum(q_lens), g.kv_heads * g.group, g.head_dim), case.dtype, gen, device)
    cu = torch.tensor([0, q_lens[0], sum(q_lens)], dtype=torch.int32, device=device)
    seq = torch.tensor(lens, dtype=torch.int32, device=device)
    args, kw = (q, k, v, table, cu, seq), _kw(case)
    ref = (q, k, _ref_v(k, v, case), table, cu, seq)
    rkw = dict(layout=case.layout, **_scales(case))
    return args, kw, lambda: R.extend_attention(*(t.cpu() for t in ref), return_lse=True, **rkw)


def _random_cache(case, gen, device):
    g = case.geom
    ks, vs = L.kv_cache_shapes(NUM_BLOCKS, g.block_size, g.kv_heads, g.head_dim, case.layout,
                               case.kv_dtype, g.head_dim_v)
    return (_randn(ks, torch.float32, gen, "cpu").to(case.kv_dtype).to(device),
            _randn(vs, torch.float32, gen, "cpu").to(case.kv_dtype).to(device))


def _same_cache(got, want, dtype) -> str:
    got = got.cpu()
    if _fp8(dtype):  # the kernel and the reference may round a quantised value 1 ulp apart
        ulp = 2.0 ** -(3 if dtype == E4M3 else 2)
        g, w = got.float(), want.float()
        bad = (g - w).abs() > ulp * w.abs() + 2.0 ** -8
        return f"{int(bad.sum())} cache elements differ" if bad.any() else ""
    same = torch.equal(got.view(torch.uint8), want.contiguous().view(torch.uint8))
    return "" if same else f"{int((got != want).sum())} cache elements differ"


def run_case(case: Case, backend: str, device: torch.device, seed: int = 0
             ) -> Tuple[str, str]:
    """("pass" | "fail" | "skip", detail) of one case through the forced ``backend``."""
    import pagedattn as pa
    from pagedattn.dispatch import explain

    gen = torch.Generator().manual_seed(seed)
    if case.op in ("paged_decode", "extend_attention"):
        make = _decode if case.op == "paged_decode" else _extend
        args, kw, ref = make(case, gen, device)
        try:
            explain(case.op, *args, backend=backend, quiet=True, **kw)
        except (ValueError, TypeError) as e:
            return "skip", _why_skip(e)
        q = args[0]
        out = torch.full(q.shape[:-1] + (case.geom.head_dim_v,), float("nan"), dtype=q.dtype,
                         device=q.device)
        got, lse = getattr(pa, case.op)(*args, backend=backend, out=out, return_lse=True, **kw)
        want, want_lse = ref()
        bad = _close(got, want, lse, want_lse, case)
        return ("fail", bad) if bad else ("pass", "")
    kc, vc = _random_cache(case, gen, device)
    if case.op == "store_kv":
        g = case.geom
        k = _randn((5, g.kv_heads, g.head_dim), case.dtype, gen, device)
        v = None if g.mla else _randn((5, g.kv_heads, g.head_dim_v), case.dtype, gen, device)
        cap = NUM_BLOCKS * g.block_size
        slots = torch.tensor([3, 17, 18, -1, cap - 2], dtype=torch.int64, device=device)
        if g.mla:
            vc = None
        args = (k, v, kc, vc, slots)
        kw = dict(layout=case.layout, **_scales(case))
        if g.mla:  # no V: the V scale is not read
            kw.pop("v_scale", None)
    else:
        mapping = torch.tensor([[1, 5], [3, 0], [2, 7]], dtype=torch.int64, device=device)
        args, kw = (kc, vc, mapping), {}
    try:
        explain(case.op, *args, backend=backend, quiet=True, **kw)
    except (ValueError, TypeError) as e:
        return "skip", _why_skip(e)
    want_k = kc.cpu().clone()
    want_v = None if vc is None else vc.cpu().clone()
    if case.op == "store_kv":
        R.store_kv(k.cpu(), None if v is None else v.cpu(), want_k, want_v, slots.cpu(), **kw)
    else:
        R.copy_blocks([want_k, want_v], mapping.cpu())
    getattr(pa, case.op)(*args, backend=backend, **kw)
    bad = _same_cache(kc, want_k, case.kv_dtype) or (
        "" if vc is None else _same_cache(vc, want_v, case.kv_dtype))
    return ("fail", bad) if bad else ("pass", "")


def _why_skip(e: Exception) -> str:
    msg = str(e)
    return msg.split(": ", 1)[-1] if "cannot serve" in msg else msg

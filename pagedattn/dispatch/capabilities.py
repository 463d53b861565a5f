"""What each backend declares it supports, per op: pure data, testable without importing kernels.

The selector reads these tables to rank backends; the backend module's own ``supports()``
stays the final word at call time (dispatch.core asks it before returning a backend), and
tests/test_dispatch.py checks these tables against the modules whenever they import.
"""
from dataclasses import dataclass
from typing import FrozenSet, Optional, Sequence, Tuple

import torch

from pagedattn.dispatch.arch import ArchFacts, fp8_format

OPS = ("paged_decode", "extend_attention", "store_kv", "copy_blocks")
MATMUL_OPS = ("paged_decode", "extend_attention")  # the ops whose dtype the matrix units see

# Call features a backend may lack. Each is derived from the call's arguments:
#   sinks (sinks=), soft_cap (logit_cap=), window (sliding_window=), alibi (alibi_slopes=),
#   lse (return_lse=True), tree_mask (custom_mask=), k_new (k_new/v_new read directly),
#   non_causal (extend with causal=False), spec_decode (decode with q [B, q_len, Hq, D]),
#   head_dim_v (V's head dim differs from K's: MLA 576/512, MLA prefill 192/128).
FEATURES = frozenset({"sinks", "soft_cap", "window", "alibi", "lse", "tree_mask", "k_new",
                      "non_causal", "spec_decode", "head_dim_v"})

LAYOUTS = ("bhsd", "bshd", "vllm", "hcu")
FLOATS = (torch.float16, torch.bfloat16, torch.float32)
HALFS = (torch.float16, torch.bfloat16)
# The head dims the public ops accept (pagedattn.validation.MAX_HEAD_DIM), K's and V's alike;
# Triton pads a tile's head dim to a power of 2 >= 16 with masked lanes (decode splits widths
# past 256 into a power-of-2 tile and a tail tile: 576 = 512 + 64), so every one compiles.
TRITON_HEAD_DIMS = range(1, 577)
ATTN_FEATURES = frozenset({"sinks", "soft_cap", "window", "alibi", "lse", "head_dim_v"})

# Where a backend can run at all.
ANYWHERE = "anywhere"  # torch: any device torch runs on
GPU_OR_INTERPRETER = "gpu_or_interpreter"  # triton: a GPU, or the CPU with TRITON_INTERPRET=1
HIP_BUILD = "hip_build"  # hip: a GPU whose arch the HIP extension is built for


@dataclass(frozen=True)
class OpCaps:
    """One backend's declared support for one op. None means "any"."""

    dtypes: Optional[Tuple[torch.dtype, ...]]  # q dtype (store_kv: k's dtype)
    kv_fp8: Tuple[str, ...]  # fp8 cache formats on top of "cache dtype == q dtype"
    layouts: Optional[Tuple[str, ...]]
    head_dims: Optional[Sequence[int]]  # K's and V's head dims (a tuple or a range)
    block_sizes: Optional[Sequence[int]]
    max_group: Optional[int]  # largest num_q_heads / num_kv_heads
    features: FrozenSet[str]
    max_rows: Optional[int] = None  # decode: largest group * q_len (query rows per program)


@dataclass(frozen=True)
class BackendCaps:
    name: str
    module: str  # imported lazily by dispatch.core.load
    where: str  # ANYWHERE | GPU_OR_INTERPRETER | HIP_BUILD
    ops: dict  # op -> OpCaps


_ANY_COPY = OpCaps(None, ("e4m3", "e5m2"), None, None, None, None, frozenset())

# torch: the float32 reference; serves every call the public ops accept, on any device.
TORCH = BackendCaps("torch", "pagedattn.torch_backend", ANYWHERE, {
    "paged_decode": OpCaps(FLOATS, ("e4m3", "e5m2"), LAYOUTS, None, None, None,
                           ATTN_FEATURES | {"spec_decode"}),
    "extend_attention": OpCaps(FLOATS, ("e4m3", "e5m2"), LAYOUTS, None, None, None,
                               ATTN_FEATURES | {"tree_mask", "k_new", "non_causal"}),
    "store_kv": OpCaps(FLOATS, ("e4m3", "e5m2"), LAYOUTS, None, None, None,
                       frozenset({"head_dim_v"})),
    "copy_blocks": _ANY_COPY,
})

# triton: the portable default (docs/dispatch.md): every layout through the shared address function,
# any block size (1: SGLang's token pool; 528, 544: hybrid models' pages), head dims 1 to 576
# for K and V separately (MLA). Decode splits a group of more query rows than one program
# holds over several programs per KV head (triton_kernels.decode._head_split); extend takes
# groups <= 128.
TRITON = BackendCaps("triton", "pagedattn.triton_kernels", GPU_OR_INTERPRETER, {
    "paged_decode": OpCaps(FLOATS, ("e4m3", "e5m2"), LAYOUTS, TRITON_HEAD_DIMS, None, None,
                           ATTN_FEATURES | {"spec_decode"}),
    "extend_attention": OpCaps(FLOATS, ("e4m3", "e5m2"), LAYOUTS, TRITON_HEAD_DIMS, None, 128,
                               ATTN_FEATURES | {"tree_mask", "k_new", "non_causal"}),
    "store_kv": OpCaps(FLOATS, ("e4m3", "e5m2"), LAYOUTS, TRITON_HEAD_DIMS, None, None,
                       frozenset({"head_dim_v"})),
    "copy_blocks": _ANY_COPY,
})

# hip: the hand-written fast path (docs/hip.md; hip_kernels/csrc/attn_inst.cuh). Matrix units
# take fp16/bf16 only; the instantiated head dims are 64 and 128 (launch_decode/launch_extend);
# pages >= 16, a power of 2 (the kernel's precondition block: delta-base addressing needs
# page_size % BLOCK_N == 0). Any group: REUSE_KV_TIMES tops out at 64 and larger groups take
# several blocks per KV head (blocks_per_kv_head). Decode reads V plain or transposed
# (bhsd/bshd, hcu) and fp8 KV; extend is instantiated for KV == q dtype, V not transposed.
# Features: only LSE (AttnParams has no sinks, ALiBi, soft-cap, window, tree mask or k_new;
# K and V share one head dim).
HIP = BackendCaps("hip", "pagedattn.hip_kernels", HIP_BUILD, {
    "paged_decode": OpCaps(HALFS, ("e4m3", "e5m2"), ("bhsd", "bshd", "hcu"), (64, 128),
                           (16, 32, 64, 128, 256), None, frozenset({"lse"})),
    "extend_attention": OpCaps(HALFS, (), ("bhsd", "bshd"), (64, 128), (16, 32, 64, 128, 256),
                               None, frozenset({"lse"})),
})

CAPS = {c.name: c for c in (TORCH, TRITON, HIP)}


def _fmt(v) -> str:
    return str(v).replace("torch.", "")


def _span(values) -> str:
    """A supported set for a message: ``1..576`` for a range, else the list."""
    if isinstance(values, range):
        return f"{values.start}..{values.stop - 1}"
    return str(list(values))


def unsupported(backend: str, op: str, arch: ArchFacts, *, dtype=None, kv_dtype=None,
                head_dim: Optional[int] = None, block_size: Optional[int] = None,
                group: Optional[int] = None, layout: Optional[str] = None,
                features: FrozenSet[str] = frozenset(), interpret: bool = False,
                q_len: int = 1, head_dim_v: Optional[int] = None,
                has_triton: bool = True) -> list:
    """Reasons the declared table of ``backend`` rules the call out ([] = declared supported).

    A fact given as None (unknown, or not meaningful for the op) is not checked. has_triton:
    whether ``import triton`` works here (without it no GPU or interpreter setting helps).
    """
    caps = CAPS[backend]
    oc = caps.ops.get(op)
    if oc is None:
        return [f"{backend} does not implement {op}"]
    why = []
    gpu = arch.vendor != "cpu"
    if caps.where == GPU_OR_INTERPRETER and not has_triton:
        why.append("triton is not installed")
    elif caps.where == GPU_OR_INTERPRETER and not gpu and not interpret:
        why.append("tensors are on the CPU and TRITON_INTERPRET is not set")
    if caps.where == HIP_BUILD and not arch.hip_built:
        why.append(f"the HIP extension is not built for {arch.arch} "
                   "(targets: gfx90a, gfx942, gfx928/936/938, sm_80/86/89/90)")
    if dtype is not None and oc.dtypes is not None and dtype not in oc.dtypes:
        why.append(f"dtype {_fmt(dtype)} not in {[_fmt(d) for d in oc.dtypes]}")
    # NOTE in the interpreter Triton's decode over an fp8 cache runs its dots in fp16 whatever
    # q's dtype (triton_kernels/decode.py _f16_dot), so bf16 q is right there.
    f16_dots = backend == "triton" and op == "paged_decode" and kv_dtype is not None \
        and fp8_format(kv_dtype) is not None
    if dtype is not None and caps.where != ANYWHERE and op in MATMUL_OPS \
            and dtype not in arch.dtypes and not f16_dots:
        why.append(f"dtype {_fmt(dtype)} is not computed correctly on {arch.arch}"
                   + (" (the Triton interpreter's bf16 tl.dot multiplies raw bits)"
                      if not gpu else ""))
    fmt = fp8_format(kv_dtype) if kv_dtype is not None else None
    if fmt is not None:
        if fmt not in oc.kv_fp8:
            why.append(f"kv_dtype {_fmt(kv_dtype)}: fp8 {fmt} caches not supported")
        elif caps.where != ANYWHERE and fmt not in arch.fp8:
            why.append(f"kv_dtype {_fmt(kv_dtype)}: {arch.arch} reads fp8 as "
                       f"{list(arch.fp8) or 'none'}")
    if layout is not None and oc.layouts is not None and layout not in oc.layouts:
        why.append(f"layout {layout!r} not in {list(oc.layouts)}")
    for name, d in (("head_dim", head_dim), ("head_dim_v", head_dim_v)):
        if d is not None and oc.head_dims is not None and d not in oc.head_dims:
            why.append(f"{name} {d} not in {_span(oc.head_dims)}")
    if block_size is not None and oc.block_sizes is not None and block_size not in oc.block_sizes:
        why.append(f"block_size {block_size} not in {_span(oc.block_sizes)}")
    if group is not None and oc.max_group is not None and group > oc.max_group:
        why.append(f"group size {group} > {oc.max_group}")
    if group is not None and oc.max_rows is not None and group * q_len > oc.max_rows:
        why.append(f"group * q_len = {group * q_len} query rows > {oc.max_rows}")
    missing = sorted(set(features) - oc.features)
    if missing:
        why.append(f"features {missing} not supported")
    return why

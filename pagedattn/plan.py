"""Plan/run split for paged decode: validate the batch metadata once, run it per layer.

A decode step runs the same (block_table, seq_lens) through every layer. ``plan_decode`` does the
host work once — metadata checks (with one host sync, always: block ids in range, table
capacity), option normalisation and the backend choice — and returns a frozen :class:`DecodePlan`.
``run_decode`` then checks only what changes per layer (q and the caches against the plan) and
launches: no host sync, so it can be captured in a CUDA graph.
"""
from dataclasses import dataclass
from typing import Optional

import torch

from pagedattn import dispatch
from pagedattn import validation as V
from pagedattn.layouts import CacheGeometry, check_layout


@dataclass(frozen=True)
class DecodePlan:
    """What ``run_decode`` reuses across layers. Build it with :func:`plan_decode`."""

    block_table: torch.Tensor  # int32 [num_seqs, max_blocks]
    seq_lens: torch.Tensor  # int32 [num_seqs]
    layout: str
    geom: CacheGeometry
    q_shape: tuple  # [num_seqs, (q_len,) num_q_heads, head_dim]
    q_dtype: torch.dtype
    kv_dtype: torch.dtype
    opts: V.AttnOptions
    partition_size: Optional[int]
    backend: str


def plan_decode(block_table: torch.Tensor, seq_lens: torch.Tensor, *, num_q_heads: int,
                num_kv_heads: int, head_dim: int, block_size: int, num_blocks: int,
                q_dtype: torch.dtype, kv_dtype: Optional[torch.dtype] = None, q_len: int = 1,
                layout: str = "bhsd", scale: Optional[float] = None, k_scale=None,
                v_scale=None, sliding_window: Optional[int] = None,
                logit_cap: Optional[float] = None, alibi_slopes: Optional[torch.Tensor] = None,
                sinks: Optional[torch.Tensor] = None, partition_size: Optional[int] = None,
                backend: str = "auto", return_lse: bool = False,
                head_dim_v: Optional[int] = None) -> DecodePlan:
    """Validate one decode batch's metadata and pick its backend.

    Parameters are those of :func:`pagedattn.paged_decode`, with the shapes given as numbers:
    the plan is valid for any q of shape ``[num_seqs, (q_len,) num_q_heads, head_dim]`` and
    dtype ``q_dtype``, and any cache pair of that geometry, layout and ``kv_dtype``; V is
    ``head_dim_v`` wide (default head_dim; MLA: 512 of a 576-wide latent cache, which
    ``run_decode`` takes with ``v_cache=None``).

    Raises
    ------
    TypeError, ValueError
        as :func:`pagedattn.paged_decode` (device-data checks always run here).

    Examples
    --------
    >>> import torch, pagedattn as pa
    >>> k, v = pa.make_kv_cache(8, 16, 2, 64, dtype=torch.float32)
    >>> _ = k.normal_(), v.normal_()
    >>> table = torch.tensor([[3, 1], [5, 0]], dtype=torch.int32)
    >>> plan = pa.plan_decode(table, torch.tensor([20, 7], dtype=torch.int32), num_q_heads=4,
    ...                       num_kv_heads=2, head_dim=64, block_size=16, num_blocks=8,
    ...                       q_dtype=torch.float32)
    >>> for layer in range(2):
    ...     out = pa.run_decode(plan, torch.randn(2, 4, 64), k, v)
    """
    check_layout(layout)
    kv_dtype = kv_dtype or q_dtype
    dev = block_table.device
    # a meta cache stands in for the real ones: the same checks as the public op, no memory
    k_meta, v_meta = _meta_cache(num_blocks, block_size, num_kv_heads, head_dim, layout, kv_dtype,
                                 head_dim_v)
    g = V.check_cache(k_meta, v_meta, layout)
    q_shape = (seq_lens.shape[0],) + ((q_len,) if q_len > 1 else ()) + (num_q_heads, head_dim)
    q_meta = torch.empty(q_shape, dtype=q_dtype, device="meta")
    V.check_q_and_heads(q_meta, g, kv_dtype, q_meta.device, dims=(3, 4), layout=layout)
    V.check_table(block_table, seq_lens, q_shape[0], dev)
    opts = V.attn_options(q=torch.empty(0, num_q_heads, head_dim, device=dev), g=g,
                          kv_dtype=kv_dtype, scale=scale, k_scale=k_scale, v_scale=v_scale,
                          sliding_window=sliding_window, logit_cap=logit_cap,
                          alibi_slopes=alibi_slopes, sinks=sinks)
    partition_size = V.check_partition_size(partition_size)
    V.check_decode_data(opts, block_table, seq_lens, g, q_len)
    k_dev = torch.empty((0,), dtype=kv_dtype, device=dev)
    name, _ = dispatch.resolve("paged_decode", backend, q=_shaped(q_shape, q_dtype, dev),
                               k_cache=k_dev, layout=layout,
                               geom=g, opts=opts, return_lse=return_lse, block_table=block_table,
                               partition_size=partition_size)
    return DecodePlan(block_table, seq_lens, layout, g, q_shape, q_dtype, kv_dtype, opts,
                      partition_size, name)


def run_decode(plan: DecodePlan, q: torch.Tensor, k_cache: torch.Tensor,
               v_cache: Optional[torch.Tensor],
               *, out: Optional[torch.Tensor] = None, return_lse: bool = False,
               errors: Optional[torch.Tensor] = None):
    """Paged decode of one layer with a plan: checks q and the caches against it, then launches.

    ``out`` and ``return_lse`` are as in :func:`pagedattn.paged_decode`, and so is ``errors``
    (int32 ``[1]`` on q's device): the plan checked the metadata once, so the kernels' guards
    act only on metadata changed on the device since (a CUDA-graph replay's new table); the
    guarded rows are NaN and counted there, with no host sync.

    Raises ``ValueError``/``TypeError`` when q's shape or dtype, or the caches' geometry, layout
    or dtype differ from the plan's, or ``errors`` is not one int32 element on q's device.
    ``v_cache=None``: V is k_cache's first ``plan.geom.head_dim_v`` columns (an MLA latent
    cache).
    """
    if not isinstance(q, torch.Tensor) or tuple(q.shape) != plan.q_shape:
        raise ValueError(f"q: the plan expects shape {plan.q_shape}, got "
                         f"{tuple(q.shape) if isinstance(q, torch.Tensor) else type(q).__name__}")
    if q.dtype != plan.q_dtype:
        raise TypeError(f"q: the plan expects dtype {plan.q_dtype}, got {q.dtype}")
    dev = plan.block_table.device
    V.check_tensor("q", q, device=dev)
    if k_cache.dtype != plan.kv_dtype:
        raise TypeError(f"k_cache: the plan expects dtype {plan.kv_dtype}, got {k_cache.dtype}")
    v_cache = V.resolve_v_cache(k_cache, v_cache, plan.layout,
                                None if v_cache is not None else plan.geom.head_dim_v)
    g = V.check_cache(k_cache, v_cache, plan.layout)
    if g != plan.geom:
        raise ValueError(f"k_cache: geometry {g._asdict()} differs from the plan's "
                         f"{plan.geom._asdict()}")
    if k_cache.device != dev:
        raise ValueError(f"k_cache: expected device {dev}, got {k_cache.device}")
    out = V.check_out(out, q, g.head_dim_v)
    errors = V.check_errors(errors, dev)
    impl = dispatch.load(plan.backend)
    call = V.DecodeCall(q, k_cache, v_cache, plan.block_table, plan.seq_lens, plan.layout, g,
                        plan.opts, plan.partition_size, out, return_lse, False, errors)
    if q.shape[0] == 0:
        lse = torch.empty(q.shape[:-1], dtype=torch.float32, device=dev)
        return (out, lse) if return_lse else out
    lse = impl.paged_decode(call)
    return (out, lse) if return_lse else out


def _meta_cache(n, bs, h, d, layout, dtype, dv=None):
    from pagedattn.layouts import kv_cache_shapes
    ks, vs = kv_cache_shapes(n, bs, h, d, layout, dtype, dv)
    return torch.empty(ks, dtype=dtype, device="meta"), torch.empty(vs, dtype=dtype, device="meta")


def _shaped(shape, dtype, device):
    """A one-element tensor viewed with the given shape (dispatch reads metadata only)."""
    return torch.empty((1,), dtype=dtype, device=device).as_strided(shape, (0,) * len(shape))

"""FlashInfer-shaped paged attention wrappers over pagedattn's ops.

Mirrors ``flashinfer.BatchDecodeWithPagedKVCacheWrapper`` and
``flashinfer.BatchPrefillWithPagedKVCacheWrapper`` of **flashinfer-python 0.7.4** (constructor,
``plan`` and ``run`` arguments, names and defaults). ``plan`` does the host work once per batch
(checks, block tables, lengths, the backend choice); ``run`` launches pagedattn's kernels with
``backend="auto"`` unless the wrapper was built with one of pagedattn's backend names. Every
peer argument is honoured, accepted and unused, or refused with ``NotImplementedError`` naming
it: docs/compat.md holds the table.

Layouts: ``NHD`` caches are ``[num_pages, page_size, num_kv_heads, head_dim]`` (pagedattn's
``bshd``), ``HND`` are ``[num_pages, num_kv_heads, page_size, head_dim]`` (``bhsd``); a single
``[num_pages, 2, ...]`` tensor holds K at ``[:, 0]`` and V at ``[:, 1]``. LSEs are base 2, as
FlashInfer's (the prefill ``run`` also gives ``lse_base="ln"``).

Differences a caller sees: ``float_workspace_buffer`` only names the device (pagedattn allocates
its split workspace itself), and with ``use_cuda_graph=True`` the wrapper keeps a block table of
``batch_size x len(paged_kv_indices_buffer)`` entries unless ``plan`` gets ``block_tables``.
"""
import dataclasses

import torch

from pagedattn import validation as V
from pagedattn.compat._common import LOG2E, page_metadata, refuse
from pagedattn.compat._flashinfer_base import WrapperBase, refuse_run_extras
from pagedattn.compat._flashinfer_prefill import BatchPrefillWithPagedKVCacheWrapper
from pagedattn.plan import plan_decode, run_decode

PEER = "flashinfer-python"
PEER_VERSION = "0.7.4"

__all__ = ["BatchDecodeWithPagedKVCacheWrapper", "BatchPrefillWithPagedKVCacheWrapper",
           "PEER", "PEER_VERSION", "LOG2E"]


@dataclasses.dataclass(frozen=True)
class _DecodeState:
    plain: object  # DecodePlan without sinks
    with_sinks: object  # DecodePlan whose backend serves sinks (opts.sinks replaced per run)
    batch_size: int
    q_len: int
    num_qo_heads: int
    num_kv_heads: int
    head_dim: int
    page_size: int
    max_page: int
    alibi: bool


class BatchDecodeWithPagedKVCacheWrapper(WrapperBase):
    r"""Decode attention over a paged KV cache for a batch of requests (FlashInfer's wrapper).

    Parameters
    ----------
    float_workspace_buffer : torch.Tensor
        any tensor on the target device; its memory is not used.
    kv_layout : str
        ``"NHD"`` or ``"HND"``.
    use_cuda_graph : bool
        keep the plan's metadata in buffers whose address survives re-planning, so a ``run``
        captured in a CUDA graph replays with each new plan. The batch size is then fixed.
    use_tensor_cores : bool
        accepted, unused (dispatch picks the kernel).
    paged_kv_indptr_buffer, paged_kv_indices_buffer, paged_kv_last_page_len_buffer : torch.Tensor
        required with ``use_cuda_graph``: their sizes fix the batch size and the widest block
        table; their contents are not used.
    backend : str
        ``"auto"``, or pagedattn's ``"triton"``, ``"hip"``, ``"torch"``.

    Examples
    --------
    >>> import torch
    >>> from pagedattn.compat.flashinfer import BatchDecodeWithPagedKVCacheWrapper
    >>> kv = torch.randn(9, 2, 16, 2, 64)              # 9 pages, NHD, 2 KV heads
    >>> w = BatchDecodeWithPagedKVCacheWrapper(torch.empty(0), "NHD")
    >>> i32 = lambda x: torch.tensor(x, dtype=torch.int32)
    >>> w.plan(i32([0, 2, 3]), i32([4, 1, 7]), i32([5, 16]), 4, 2, 64, 16,
    ...        q_data_type=torch.float32)
    >>> w.run(torch.randn(2, 4, 64), kv).shape
    torch.Size([2, 4, 64])
    """

    def __init__(self, float_workspace_buffer: torch.Tensor, kv_layout: str = "NHD",
                 use_cuda_graph: bool = False, use_tensor_cores: bool = False,
                 paged_kv_indptr_buffer=None, paged_kv_indices_buffer=None,
                 paged_kv_last_page_len_buffer=None, backend: str = "auto", jit_args=None,
                 jit_kwargs=None) -> None:
        super().__init__(float_workspace_buffer, kv_layout, use_cuda_graph, backend, jit_args,
                         jit_kwargs, paged_kv_last_page_len_buffer,
                         [("paged_kv_indptr_buffer", paged_kv_indptr_buffer),
                          ("paged_kv_indices_buffer", paged_kv_indices_buffer),
                          ("paged_kv_last_page_len_buffer", paged_kv_last_page_len_buffer)])

    def plan(self, indptr: torch.Tensor, indices: torch.Tensor, last_page_len: torch.Tensor,
             num_qo_heads: int, num_kv_heads: int, head_dim: int, page_size: int, *,
             pos_encoding_mode: str = "NONE", window_left: int = -1, window_right: int = 0,
             logits_soft_cap=None, q_data_type="float16", kv_data_type=None, o_data_type=None,
             data_type=None, sm_scale=None, rope_scale=None, rope_theta=None,
             non_blocking: bool = True, block_tables=None, seq_lens=None,
             fixed_split_size=None, disable_split_kv: bool = False, q_len_per_req: int = 1,
             is_causal=None, use_token_head_sf: bool = False) -> None:
        """Check one decode batch's page lists and build what every ``run`` reuses.

        ``indptr`` int32 ``[batch_size + 1]``, ``indices`` int32 page ids, ``last_page_len``
        int32 ``[batch_size]`` in ``[1, page_size]`` (0 for a request without pages). Reads
        them on the host (not CUDA-graph capturable, as in FlashInfer). ``fixed_split_size``
        (pages) becomes pagedattn's ``partition_size`` (``fixed_split_size * page_size`` tokens,
        a power of 2). ``q_len_per_req > 1`` plans speculative decode: q holds
        ``batch_size * q_len_per_req`` rows, the last tokens of each request, causal.

        Raises
        ------
        ValueError, TypeError
            malformed metadata (``indptr`` not monotone, ``last_page_len`` out of range,
            negative page ids, heads that do not divide) or options.
        NotImplementedError
            an option pagedattn cannot honour, named (``pos_encoding_mode="ROPE_LLAMA"``,
            ``window_right != 0``, ``use_token_head_sf``, ...).
        """
        self._plan = None  # a plan that fails leaves none behind
        cap, window, alibi = self._plan_common(pos_encoding_mode, logits_soft_cap, window_left,
                                               num_qo_heads, use_token_head_sf)
        if window_right != 0:
            refuse("window_right", window_right, "decode queries are the last tokens: only the "
                   "left window applies (window_left)")
        if isinstance(q_len_per_req, bool) or not isinstance(q_len_per_req, int) \
                or q_len_per_req < 1:
            raise ValueError(f"q_len_per_req: expected an int >= 1, got {q_len_per_req!r}")
        if is_causal is not None and bool(is_causal) != (q_len_per_req > 1):
            refuse("is_causal", is_causal, "decode rows are causal exactly when "
                   "q_len_per_req > 1 (leave it None)")
        q_dt, kv_dt = self._plan_dtypes(q_data_type, kv_data_type, o_data_type, data_type)
        partition = None
        if fixed_split_size is not None and fixed_split_size > 0:
            partition = int(fixed_split_size) * page_size
            if partition & (partition - 1):
                refuse("fixed_split_size", fixed_split_size, "pagedattn splits KV into "
                       "partitions of a power-of-2 token count (fixed_split_size * page_size)")
        meta = page_metadata(indptr, indices, last_page_len, page_size, self.device,
                             block_tables=block_tables, seq_lens=seq_lens)
        b = meta.seq_lens.numel()
        table, lens = self._stage(meta, b, block_tables)
        kv_scale = 1.0 if kv_dt in V.FP8_DTYPES else None
        kw = dict(num_q_heads=num_qo_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
                  block_size=page_size, num_blocks=max(meta.max_page + 1, 1), q_dtype=q_dt,
                  kv_dtype=kv_dt, q_len=q_len_per_req, layout=self._layout, scale=sm_scale,
                  k_scale=kv_scale, v_scale=kv_scale, sliding_window=window, logit_cap=cap,
                  alibi_slopes=alibi, partition_size=partition, backend=self._backend,
                  return_lse=True)
        plain = plan_decode(table, lens, **kw)
        with_sinks = plan_decode(table, lens, sinks=torch.zeros(num_qo_heads, device=self.device),
                                 **kw)
        self._plan = _DecodeState(plain, with_sinks, b, q_len_per_req, num_qo_heads,
                                  num_kv_heads, head_dim, page_size, meta.max_page,
                                  alibi is not None)

    def run(self, q: torch.Tensor, paged_kv_cache, *args, q_scale=None, k_scale=None,
            v_scale=None, out=None, lse=None, return_lse: bool = False, enable_pdl=None,
            window_left=None, sinks=None, q_len_per_req=None,
            skip_softmax_threshold_scale_factor=None, kv_cache_sf=None):
        """Decode attention of ``q`` ``[batch_size * q_len_per_req, num_qo_heads, head_dim]`` over
        ``paged_kv_cache`` with the last plan.

        No host sync: capturable in a CUDA graph (with ``use_cuda_graph=True`` the graph
        replays every later plan's metadata). ``q_scale`` and ``k_scale`` multiply the softmax
        scale and ``v_scale`` the output, as in FlashInfer (for an fp8 cache k_scale/v_scale
        dequantise K and V, the same products). ``sinks``: float32 ``[num_qo_heads]`` logits
        joining the softmax denominator.

        Returns
        -------
        torch.Tensor or (torch.Tensor, torch.Tensor)
            out ``[batch_size * q_len_per_req, num_qo_heads, head_dim]`` in q's dtype
            [, base-2 lse ``[batch_size * q_len_per_req, num_qo_heads]`` float32].
        """
        refuse_run_extras(args, skip_softmax_threshold_scale_factor, kv_cache_sf)
        st = self._require_plan()
        if window_left is not None and window_left != self._window_left:
            raise ValueError(f"window_left: {window_left} differs from the plan's "
                             f"{self._window_left}")
        if q_len_per_req is not None and q_len_per_req != st.q_len:
            raise ValueError(f"q_len_per_req: {q_len_per_req} differs from the plan's {st.q_len}")
        if return_lse and st.alibi:
            refuse("return_lse", True, "with pos_encoding_mode='ALIBI' the outputs match "
                   "FlashInfer but its LSE measures ALiBi from the query's index in the request")
        if sinks is not None and st.alibi:
            refuse("sinks", "<tensor>", "FlashInfer's ALiBi bias differs from pagedattn's by a "
                   "per-row constant, which sinks expose; use one of the two")
        rows = st.batch_size * st.q_len
        V.check_tensor("q", q, dim=3, device=self.device)
        V.check_shape("q", q, (rows, st.num_qo_heads, st.head_dim))
        k, v, g = self._caches(paged_kv_cache, st.page_size, st.num_kv_heads, st.head_dim,
                               st.max_page)
        plan = st.plain if sinks is None else st.with_sinks
        mult, ks, vs, post = self._scales(q_scale, k_scale, v_scale, k.dtype, st.num_kv_heads,
                                          self.device)
        opts = dataclasses.replace(
            plan.opts, scale=plan.opts.scale * mult, k_scale=ks, v_scale=vs,
            sinks=None if sinks is None else V._norm_head_vec("sinks", sinks, st.num_qo_heads,
                                                              self.device))
        plan = dataclasses.replace(plan, geom=g, opts=opts)
        shape = (st.batch_size, st.q_len, st.num_qo_heads, st.head_dim) if st.q_len > 1 \
            else q.shape
        if out is not None:
            V.check_tensor("out", out, dtypes=(q.dtype,), device=self.device)
            V.check_shape("out", out, q.shape)
        res = run_decode(plan, q.view(shape), k, v,
                         out=None if out is None else out.view(shape), return_lse=return_lse)
        o, lse_nat = res if return_lse else (res, None)
        o = o.view(q.shape) if out is None else out
        if post is not None:
            o.mul_(post)
        if not return_lse:
            return o
        return o, self._lse_out(lse_nat, lse, rows, st.num_qo_heads, self.device)

    def run_return_lse(self, q, paged_kv_cache, *args, **kwargs):
        """``run(..., return_lse=True)``."""
        return self.run(q, paged_kv_cache, *args, return_lse=True, **kwargs)

    def __repr__(self) -> str:
        return (f"pagedattn.compat.flashinfer.BatchDecodeWithPagedKVCacheWrapper(kv_layout="
                f"{self._kv_layout!r}, backend={self._backend!r}, "
                f"use_cuda_graph={self._use_cuda_graph})")

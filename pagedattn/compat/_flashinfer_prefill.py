"""FlashInfer's ``BatchPrefillWithPagedKVCacheWrapper`` (flashinfer-python 0.7.4) over
:func:`pagedattn.extend_attention`; exported by :mod:`pagedattn.compat.flashinfer`."""
import dataclasses
from typing import Optional

import torch

from pagedattn import validation as V
from pagedattn.api import extend_attention
from pagedattn.compat._common import _host_int, page_metadata, refuse
from pagedattn.compat._flashinfer_base import WrapperBase, refuse_run_extras


@dataclasses.dataclass(frozen=True)
class _PrefillState:
    block_table: torch.Tensor
    seq_lens: torch.Tensor
    cu_seqlens_q: torch.Tensor
    custom_mask: Optional[torch.Tensor]  # bool, flat: request b's [Lq, Lk] at mask_indptr[b]
    mask_indptr: Optional[torch.Tensor]
    total_q: int
    max_q_len: int
    causal: bool
    num_qo_heads: int
    num_kv_heads: int
    head_dim: int
    page_size: int
    max_page: int
    scale: Optional[float]
    logit_cap: Optional[float]
    alibi: Optional[torch.Tensor]
    q_dtype: torch.dtype
    kv_dtype: torch.dtype
    head_dim_v: int  # V's (out's) head dim: FlashInfer's head_dim_vo


def unpack_segment_bits(packed: torch.Tensor, sizes: torch.Tensor) -> torch.Tensor:
    """FlashInfer's segment-packed mask -> flat bool: request b's ``sizes[b]`` bits start at byte
    ``sum(ceil(sizes[:b] / 8))``, little bit order (``flashinfer.segment_packbits``). Host."""
    nbytes = (sizes + 7) // 8
    need = int(nbytes.sum())
    if packed.numel() < need:
        raise ValueError(f"packed_custom_mask: expected at least {need} bytes, got "
                         f"{packed.numel()}")
    bits = ((packed[:need].cpu().to(torch.int64).view(-1, 1) >> torch.arange(8)) & 1).view(-1)
    seg = torch.repeat_interleave(torch.arange(sizes.numel()), sizes)
    start = torch.cumsum(sizes, 0) - sizes
    byte0 = torch.cumsum(nbytes, 0) - nbytes
    pos = torch.arange(int(sizes.sum())) - start[seg] + byte0[seg] * 8
    return bits[pos].to(torch.bool)


class BatchPrefillWithPagedKVCacheWrapper(WrapperBase):
    r"""Prefill / append attention of a ragged query batch over a paged KV cache whose pages
    already hold the new tokens (FlashInfer's wrapper).

    Request b's queries are rows ``qo_indptr[b]:qo_indptr[b+1]`` (Lq of them) and its KV is
    ``kv_len`` tokens, the last Lq of them the queries' own; with ``causal=True`` query i sees
    keys ``j <= i + kv_len - Lq``. Constructor arguments as
    :class:`~pagedattn.compat.flashinfer.BatchDecodeWithPagedKVCacheWrapper`; with
    ``use_cuda_graph=True``, ``qo_indptr_buf``, ``paged_kv_indptr_buf``,
    ``paged_kv_indices_buf`` and ``paged_kv_last_page_len_buf`` are required and
    ``custom_mask_buf`` (packed bytes) bounds a custom mask.

    Examples
    --------
    >>> import torch
    >>> from pagedattn.compat.flashinfer import BatchPrefillWithPagedKVCacheWrapper
    >>> k, v = torch.randn(9, 16, 2, 64), torch.randn(9, 16, 2, 64)   # NHD
    >>> w = BatchPrefillWithPagedKVCacheWrapper(torch.empty(0), "NHD")
    >>> i32 = lambda x: torch.tensor(x, dtype=torch.int32)
    >>> w.plan(i32([0, 3, 4]), i32([0, 2, 3]), i32([4, 1, 7]), i32([5, 16]), 4, 2, 64, 16,
    ...        causal=True, q_data_type=torch.float32)
    >>> w.run(torch.randn(4, 4, 64), (k, v)).shape
    torch.Size([4, 4, 64])
    """

    def __init__(self, float_workspace_buffer: torch.Tensor, kv_layout: str = "NHD",
                 use_cuda_graph: bool = False, qo_indptr_buf=None, paged_kv_indptr_buf=None,
                 paged_kv_indices_buf=None, paged_kv_last_page_len_buf=None,
                 custom_mask_buf=None, mask_indptr_buf=None, backend: str = "auto",
                 jit_args=None, jit_kwargs=None, variant_owns_mask: bool = False,
                 max_total_num_rows=None) -> None:
        if variant_owns_mask:
            refuse("variant_owns_mask", True, "custom JIT variants are FlashInfer kernels")
        super().__init__(float_workspace_buffer, kv_layout, use_cuda_graph, backend, jit_args,
                         jit_kwargs, paged_kv_last_page_len_buf,
                         [("paged_kv_indptr_buf", paged_kv_indptr_buf),
                          ("paged_kv_indices_buf", paged_kv_indices_buf),
                          ("paged_kv_last_page_len_buf", paged_kv_last_page_len_buf),
                          ("qo_indptr_buf", qo_indptr_buf)])
        self._mask_cap = 0 if custom_mask_buf is None else 8 * custom_mask_buf.numel()
        self._cu_buf = self._mask_buf = self._mi_buf = None

    def plan(self, qo_indptr: torch.Tensor, paged_kv_indptr: torch.Tensor,
             paged_kv_indices: torch.Tensor, paged_kv_last_page_len: torch.Tensor,
             num_qo_heads: int, num_kv_heads: int, head_dim_qk: int, page_size: int,
             head_dim_vo=None, custom_mask=None, packed_custom_mask=None, causal: bool = False,
             pos_encoding_mode: str = "NONE", use_fp16_qk_reduction: bool = False,
             sm_scale=None, window_left: int = -1, logits_soft_cap=None, rope_scale=None,
             rope_theta=None, q_data_type="float16", kv_data_type=None, o_data_type=None,
             non_blocking: bool = True, prefix_len_ptr=None, token_pos_in_items_ptr=None,
             token_pos_in_items_len: int = 0, max_item_len_ptr=None, seq_lens=None,
             seq_lens_q=None, block_tables=None, max_token_per_sequence=None,
             max_sequence_kv=None, fixed_split_size=None, disable_split_kv: bool = False,
             uniform_q_len=None, use_token_head_sf: bool = False) -> None:
        """Check one batch's query and page lists and build what every ``run`` reuses (host
        reads: not capturable, as in FlashInfer).

        ``custom_mask``: flat bool, request b's ``[Lq, kv_len]`` row-major block after those of
        requests < b; ``packed_custom_mask``: the same bits packed per request
        (``flashinfer.segment_packbits``, little bit order), used instead when given. A mask
        replaces the causal rule; ``window_left`` still applies.

        Raises
        ------
        ValueError, TypeError
            malformed lists (``qo_indptr`` not monotone, a request with more queries than KV
            tokens, ``last_page_len`` out of range) or options.
        NotImplementedError
            an option pagedattn cannot honour, named.
        """
        self._plan = None  # a plan that fails leaves none behind
        head_dim_vo = head_dim_qk if head_dim_vo is None else head_dim_vo
        for name, val in (("prefix_len_ptr", prefix_len_ptr),
                          ("token_pos_in_items_ptr", token_pos_in_items_ptr),
                          ("max_item_len_ptr", max_item_len_ptr)):
            if val is not None:
                refuse(name, "<tensor>", "multi-item scoring masks are not provided; build a "
                       "custom_mask instead")
        if token_pos_in_items_len:
            refuse("token_pos_in_items_len", token_pos_in_items_len, "see token_pos_in_items_ptr")
        if not isinstance(causal, bool):
            raise TypeError(f"causal: expected a bool, got {causal!r}")
        cap, window, alibi = self._plan_common(pos_encoding_mode, logits_soft_cap, window_left,
                                               num_qo_heads, use_token_head_sf)
        q_dt, kv_dt = self._plan_dtypes(q_data_type, kv_data_type, o_data_type)
        meta = page_metadata(paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len,
                             page_size, self.device, block_tables=block_tables, seq_lens=seq_lens)
        b = meta.seq_lens.numel()
        qo = _host_int("qo_indptr", qo_indptr)
        if qo.numel() != b + 1 or int(qo[0]) != 0 or bool((qo[1:] < qo[:-1]).any()):
            raise ValueError(f"qo_indptr: expected {b + 1} non-decreasing entries from 0, got "
                             f"{qo.tolist()[:8]}")
        lq = qo[1:] - qo[:-1]
        over = torch.nonzero(lq > meta.host_lens) if causal else torch.zeros(0)
        if over.numel():
            i = int(over[0])
            raise ValueError(f"qo_indptr: request {i} has {int(lq[i])} queries but kv_len "
                             f"{int(meta.host_lens[i])}: the pages must hold the new tokens too")
        mask = mask_indptr = None
        if custom_mask is not None or packed_custom_mask is not None:
            sizes = lq * meta.host_lens
            if packed_custom_mask is not None:
                mask = unpack_segment_bits(packed_custom_mask, sizes)
            else:
                V.check_tensor("custom_mask", custom_mask, dim=1)
                if custom_mask.numel() < int(sizes.sum()):
                    raise ValueError(f"custom_mask: expected sum(Lq * kv_len) = "
                                     f"{int(sizes.sum())} entries, got {custom_mask.numel()}")
                mask = custom_mask[: int(sizes.sum())].to(torch.bool)
            mi = torch.zeros(b + 1, dtype=torch.int64)
            mi[1:] = torch.cumsum(sizes, 0)
            mask, mask_indptr = mask.to(self.device), mi.to(device=self.device, dtype=torch.int32)
        table, lens = self._stage(meta, b, block_tables)
        cu = qo.to(device=self.device, dtype=torch.int32)
        if self._use_cuda_graph:
            cu, mask, mask_indptr = self._stage_prefill(cu, mask, mask_indptr)
        self._plan = _PrefillState(
            table, lens, cu, mask, mask_indptr, int(qo[-1]), int(lq.max()) if b else 0, causal,
            num_qo_heads, num_kv_heads, head_dim_qk, page_size, meta.max_page, sm_scale, cap,
            alibi, q_dt, kv_dt, head_dim_vo)
        self._window = window

    def _stage_prefill(self, cu, mask, mask_indptr):
        """Graph mode: the query offsets and the mask in buffers that keep their address."""
        if self._cu_buf is None:
            self._cu_buf = torch.zeros_like(cu)
        self._cu_buf.copy_(cu)
        if mask is None:
            return self._cu_buf, None, None
        if mask.numel() > self._mask_cap:
            raise ValueError(f"custom_mask: {mask.numel()} entries exceed the {self._mask_cap} "
                             "that custom_mask_buf (packed bytes) bounds in CUDA-graph mode")
        if self._mask_buf is None:
            self._mask_buf = torch.zeros(self._mask_cap, dtype=torch.bool, device=self.device)
            self._mi_buf = torch.zeros_like(mask_indptr)
        self._mask_buf[: mask.numel()].copy_(mask)
        self._mi_buf.copy_(mask_indptr)
        return self._cu_buf, self._mask_buf, self._mi_buf

    def run(self, q: torch.Tensor, paged_kv_cache, *args, q_scale=None, k_scale=None,
            v_scale=None, out=None, lse=None, return_lse: bool = False, lse_base: str = "log2",
            lse_layout: str = "NH", enable_pdl=None, window_left=None, sinks=None,
            kv_cache_sf=None, skip_softmax_threshold_scale_factor=None, use_fp16_softmax=None,
            uses_spcompress=None):
        """Attention of ``q`` ``[qo_indptr[-1], num_qo_heads, head_dim]`` with the last plan.

        No host sync unless pagedattn's device-data checks are on (``PAGEDATTN_VALIDATE=1``, or
        the torch backend): capturable in a CUDA graph. Scales as in the decode wrapper's
        ``run``; ``lse_base`` ``"log2"`` or ``"ln"``, ``lse_layout`` ``"NH"`` or ``"HN"``;
        ``window_left`` overrides the plan's for this call.
        """
        refuse_run_extras(args, skip_softmax_threshold_scale_factor, kv_cache_sf)
        if uses_spcompress:
            refuse("uses_spcompress", uses_spcompress, "a trtllm-gen cubin variant")
        if lse_base not in ("log2", "ln"):
            raise ValueError(f"lse_base: expected 'log2' or 'ln', got {lse_base!r}")
        if lse_layout not in ("NH", "HN"):
            raise ValueError(f"lse_layout: expected 'NH' or 'HN', got {lse_layout!r}")
        st = self._require_plan()
        if return_lse and st.alibi is not None:
            refuse("return_lse", True, "with pos_encoding_mode='ALIBI' the outputs match "
                   "FlashInfer but its LSE measures ALiBi from the query's index in the request")
        if sinks is not None and st.alibi is not None:
            refuse("sinks", "<tensor>", "FlashInfer's ALiBi bias differs from pagedattn's by a "
                   "per-row constant, which sinks expose; use one of the two")
        V.check_tensor("q", q, dim=3, dtypes=(st.q_dtype,), device=self.device)
        V.check_shape("q", q, (st.total_q, st.num_qo_heads, st.head_dim))
        k, v, g = self._caches(paged_kv_cache, st.page_size, st.num_kv_heads, st.head_dim,
                               st.max_page)
        if k.dtype != st.kv_dtype:
            raise TypeError(f"paged_kv_cache: the plan expects dtype {st.kv_dtype}, got {k.dtype}")
        if v.shape[-1] != st.head_dim_v:
            raise ValueError(f"paged_kv_cache: V's head dim {v.shape[-1]} differs from the plan's "
                             f"head_dim_vo {st.head_dim_v}")
        window = self._window if window_left is None else \
            (window_left + 1 if window_left >= 0 else None)
        mult, ks, vs, post = self._scales(q_scale, k_scale, v_scale, k.dtype, st.num_kv_heads,
                                          self.device)
        scale = (st.head_dim ** -0.5 if st.scale is None else st.scale) * mult
        # graph mode: the launch grid must not depend on one plan's longest request
        max_q = q.shape[0] if self._use_cuda_graph else st.max_q_len
        res = extend_attention(
            q, k, v, st.block_table, st.cu_seqlens_q, st.seq_lens, layout=self._layout,
            causal=st.causal, custom_mask=st.custom_mask, mask_indptr=st.mask_indptr,
            max_q_len=max_q, scale=scale, k_scale=ks, v_scale=vs, sliding_window=window,
            logit_cap=st.logit_cap, alibi_slopes=st.alibi, sinks=sinks, backend=self._backend,
            out=out, return_lse=return_lse)
        o, lse_nat = res if return_lse else (res, None)
        if post is not None:
            o.mul_(post)
        if not return_lse:
            return o
        return o, self._lse_out(lse_nat, lse, q.shape[0], st.num_qo_heads, self.device,
                                base2=lse_base == "log2", transpose=lse_layout == "HN")

    def run_return_lse(self, q, paged_kv_cache, *args, **kwargs):
        """``run(..., return_lse=True)``."""
        return self.run(q, paged_kv_cache, *args, return_lse=True, **kwargs)

"""What FlashInfer's two paged wrappers share here: constructor arguments, the KV-cache
argument, run-time scales, and the CUDA-graph metadata buffers (see compat/flashinfer.py)."""
import math
from typing import Optional

import torch

from pagedattn import validation as V
from pagedattn.compat._common import (canonical_dtype, fp8, number, out_factor, refuse,
                                      unpack_kv)
from pagedattn.layouts import cache_geometry

KV_LAYOUTS = {"NHD": "bshd", "HND": "bhsd"}  # FlashInfer's name -> pagedattn's layout
OUR_BACKENDS = ("auto", "triton", "hip", "torch")


def alibi_slopes(num_heads: int, device) -> torch.Tensor:
    """FlashInfer's ALiBi slopes (``get_alibi_slope``): with n the largest power of 2 <= H,
    head h < n gets ``2^(-8 (h+1) / n)`` and head h >= n gets ``2^(-4 (2 (h+1-n) - 1) / n)``."""
    n = 2 ** int(math.floor(math.log2(num_heads)))
    s = [2.0 ** (-8.0 * (h + 1) / n) if h < n else 2.0 ** (-4.0 * ((h + 1 - n) * 2 - 1) / n)
         for h in range(num_heads)]
    return torch.tensor(s, dtype=torch.float32, device=device)



def refuse_run_extras(args, skip_softmax_threshold_scale_factor, kv_cache_sf):
    """The ``run`` arguments of FlashInfer's wrappers that have no pagedattn counterpart."""
    if args:
        refuse("*args", args, "custom-kernel arguments have no pagedattn kernel to go to")
    if skip_softmax_threshold_scale_factor is not None:
        refuse("skip_softmax_threshold_scale_factor", skip_softmax_threshold_scale_factor,
               "pagedattn computes exact softmax; leave it None")
    if kv_cache_sf is not None:
        refuse("kv_cache_sf", "<tensor>", "NVFP4 and per-token scale caches are not read; "
               "use an fp8 cache with k_scale/v_scale")

class WrapperBase:
    """Constructor checks and per-run helpers of the compat FlashInfer wrappers."""

    def __init__(self, float_workspace_buffer, kv_layout, use_cuda_graph, backend, jit_args,
                 jit_kwargs, graph_batch: Optional[torch.Tensor], graph_indices):
        if not isinstance(float_workspace_buffer, torch.Tensor):
            raise TypeError("float_workspace_buffer: expected a torch.Tensor (its device is the "
                            "wrapper's device; its memory is not used)")
        if kv_layout not in KV_LAYOUTS:
            raise ValueError(f"kv_layout: expected 'NHD' or 'HND', got {kv_layout!r}")
        if backend not in OUR_BACKENDS:
            refuse("backend", backend, "FlashInfer's kernels do not run here; use 'auto' (or "
                   "pagedattn's 'triton', 'hip', 'torch')")
        for name, val in (("jit_args", jit_args), ("jit_kwargs", jit_kwargs)):
            if val is not None:
                refuse(name, val, "custom JIT attention variants are FlashInfer kernels; "
                       "express the variant with plan/run options or use pagedattn's ops")
        self.device = float_workspace_buffer.device
        self._kv_layout = kv_layout
        self._layout = KV_LAYOUTS[kv_layout]
        self._backend = backend
        self._use_cuda_graph = bool(use_cuda_graph)
        self._plan = None
        self._table_buf = self._lens_buf = None
        if self._use_cuda_graph:
            for name, t in graph_indices:
                if not isinstance(t, torch.Tensor):
                    raise ValueError(f"{name}: required (a torch.Tensor) when use_cuda_graph "
                                     "is True")
            self._fixed_batch_size = graph_batch.numel()
            if graph_indices[0][1].numel() != self._fixed_batch_size + 1:
                raise ValueError(f"{graph_indices[0][0]}: expected batch_size + 1 = "
                                 f"{self._fixed_batch_size + 1} entries, got "
                                 f"{graph_indices[0][1].numel()}")
            self._table_cap = max(1, graph_indices[1][1].numel())
        else:
            self._fixed_batch_size = 0

    @property
    def is_cuda_graph_enabled(self) -> bool:
        return self._use_cuda_graph

    def reset_workspace_buffer(self, float_workspace_buffer, int_workspace_buffer=None,
                               *args, **kwargs) -> None:
        """Accepted for compatibility: pagedattn allocates its own split workspace."""
        self.device = float_workspace_buffer.device

    # ----- plan-time helpers -----

    def _plan_dtypes(self, q_data_type, kv_data_type, o_data_type, data_type=None):
        if data_type is not None:
            q_data_type = data_type if q_data_type is None else q_data_type
            kv_data_type = data_type if kv_data_type is None else kv_data_type
        q_dt = canonical_dtype("q_data_type", q_data_type if q_data_type is not None
                               else torch.float16)
        kv_dt = q_dt if kv_data_type is None else canonical_dtype("kv_data_type", kv_data_type)
        if o_data_type is not None and canonical_dtype("o_data_type", o_data_type) != q_dt:
            refuse("o_data_type", o_data_type, "the output takes q's dtype; convert after run")
        return q_dt, kv_dt

    def _plan_common(self, pos_encoding_mode, logits_soft_cap, window_left, num_qo_heads,
                     use_token_head_sf):
        if pos_encoding_mode not in ("NONE", "ALIBI"):
            refuse("pos_encoding_mode", pos_encoding_mode, "apply RoPE to q and k before "
                   "they reach attention and plan with 'NONE'")
        cap = None if logits_soft_cap is None or logits_soft_cap == 0 else logits_soft_cap
        if pos_encoding_mode == "ALIBI" and cap is not None:
            refuse("logits_soft_cap", logits_soft_cap, "FlashInfer adds ALiBi before the cap, "
                   "pagedattn after it; use one of the two")
        if use_token_head_sf:
            refuse("use_token_head_sf", True, "use a per-tensor or per-KV-head fp8 scale "
                   "(k_scale/v_scale at run)")
        if isinstance(window_left, bool) or not isinstance(window_left, int):
            raise TypeError(f"window_left: expected an int, got {window_left!r}")
        self._window_left = window_left
        alibi = alibi_slopes(num_qo_heads, self.device) if pos_encoding_mode == "ALIBI" else None
        return cap, (window_left + 1 if window_left >= 0 else None), alibi

    def _stage(self, meta, batch_size, block_tables):
        """Graph mode: copy the plan's table and lengths into buffers that keep their address
        across plans (a captured run reads them at replay). Other modes: use them as built.

        The table buffer is as wide as the first plan's ``block_tables``, else as the
        paged_kv_indices buffer is long (every plan FlashInfer accepts fits)."""
        if not self._use_cuda_graph:
            return meta.block_table, meta.seq_lens
        if batch_size != self._fixed_batch_size:
            raise ValueError(f"batch size {batch_size} differs from the CUDA-graph batch size "
                             f"{self._fixed_batch_size} (paged_kv_last_page_len_buffer)")
        w = meta.block_table.shape[1]
        if self._table_buf is None:
            cap = self._table_cap if block_tables is None else w
            self._table_buf = torch.zeros((batch_size, cap), dtype=torch.int32,
                                          device=self.device)
            self._lens_buf = torch.zeros((batch_size,), dtype=torch.int32, device=self.device)
        if w > self._table_buf.shape[1]:
            raise ValueError(f"block_tables: a request needs {w} pages, more than the "
                             f"{self._table_buf.shape[1]} the captured table holds (the first "
                             "plan's block_tables width, else len(paged_kv_indices_buffer))")
        self._table_buf[:, :w].copy_(meta.block_table)
        self._table_buf[:, w:].zero_()
        self._lens_buf.copy_(meta.seq_lens)
        return self._table_buf, self._lens_buf

    # ----- run-time helpers -----

    def _require_plan(self):
        if self._plan is None:
            raise RuntimeError("plan() must be called before run()")
        return self._plan

    def _caches(self, paged_kv_cache, page_size, num_kv_heads, head_dim, max_page):
        k, v = unpack_kv(paged_kv_cache)
        if not isinstance(k, torch.Tensor) or k.dim() != 4:
            raise ValueError(f"paged_kv_cache: expected 4-D K/V tensors in {self._kv_layout}, got "
                             f"{getattr(k, 'shape', type(k).__name__)}")
        g = cache_geometry(k, self._layout)
        if (g.block_size, g.num_kv_heads, g.head_dim) != (page_size, num_kv_heads, head_dim):
            raise ValueError(f"paged_kv_cache: (page_size, num_kv_heads, head_dim) = "
                             f"{(g.block_size, g.num_kv_heads, g.head_dim)} in layout "
                             f"{self._kv_layout} differs from the plan's "
                             f"{(page_size, num_kv_heads, head_dim)}")
        if max_page >= g.num_blocks:
            raise ValueError(f"paged_kv_cache: holds {g.num_blocks} pages but the plan reads page "
                             f"id {max_page}")
        return k, v, g

    @staticmethod
    def _scales(q_scale, k_scale, v_scale, kv_dtype, num_kv_heads, device):
        """FlashInfer folds q_scale and k_scale into sm_scale and multiplies the output by
        v_scale. Returns (scale factor, k_scale, v_scale for an fp8 cache, output factor)."""
        mult = 1.0 if q_scale is None else number("q_scale", q_scale)
        if fp8(kv_dtype):  # pagedattn dequantises fp8 K/V by the scales: the same products
            ks = V._norm_kv_scale("k_scale", 1.0 if k_scale is None else k_scale, kv_dtype,
                                  num_kv_heads, device)
            vs = V._norm_kv_scale("v_scale", 1.0 if v_scale is None else v_scale, kv_dtype,
                                  num_kv_heads, device)
            return mult, ks, vs, None
        if k_scale is not None:
            mult *= number("k_scale", k_scale)
        return mult, None, None, out_factor("v_scale", v_scale)

    @staticmethod
    def _lse_out(lse_nat, lse, rows, heads, device, *, base2=True, transpose=False):
        """FlashInfer's LSE (base 2 by default) from pagedattn's natural-log one, into ``lse``
        when given (a device op: capturable)."""
        src = lse_nat.reshape(rows, heads)
        if transpose:
            src = src.t()
        shape = (heads, rows) if transpose else (rows, heads)
        if lse is None:
            lse = torch.empty(shape, dtype=torch.float32, device=device)
        else:
            V.check_tensor("lse", lse, dtypes=(torch.float32,), device=device)
            V.check_shape("lse", lse, shape)
        if base2:
            torch.mul(src, 1.4426950408889634, out=lse)
        else:
            lse.copy_(src)
        return lse

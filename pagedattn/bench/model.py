"""A tiny randomly initialised decoder that runs its attention through pagedattn's real ops.

Pre-norm Llama-style blocks: RMSNorm -> q/k/v projections -> RoPE -> attention -> o projection ->
residual -> RMSNorm -> SiLU-gated MLP -> residual; a final RMSNorm and an untied LM head. Weights
come from a fixed seed, so two replays of one workload compute the same numbers.

The attention of each layer is a callback ``attn(layer, q, k, v) -> o`` supplied by the caller:
the serving replay writes k/v into the paged cache (``pagedattn.store_kv``) and reads it back with
``extend_attention`` or ``paged_decode``; :meth:`TinyDecoder.dense_logits` uses a plain causal
attention over the whole sequence (no cache at all) as an independent oracle.

Shapes: ``q`` [T, q_heads, head_dim], ``k``/``v`` [T, kv_heads, head_dim], T = tokens this call.
"""
import math
from dataclasses import dataclass
from typing import Callable, Optional

import torch


@dataclass(frozen=True)
class ModelConfig:
    vocab: int = 256
    hidden: int = 128
    layers: int = 2
    q_heads: int = 4
    kv_heads: int = 2        # GQA group of 2
    head_dim: int = 32
    ffn: int = 256
    rope_theta: float = 10000.0
    max_seq_len: int = 512   # the static-allocation baseline reserves this many tokens per request
    seed: int = 0

    def flops_per_token(self) -> int:
        """Matmul FLOPs per token outside attention (2 per multiply-add)."""
        qkv = self.hidden * (self.q_heads + 2 * self.kv_heads) * self.head_dim
        o = self.q_heads * self.head_dim * self.hidden
        mlp = 3 * self.hidden * self.ffn
        return 2 * (self.layers * (qkv + o + mlp) + self.hidden * self.vocab)


AttnFn = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def _rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


class TinyDecoder:
    """Random decoder. ``forward(tokens, positions, attn)`` -> logits of the selected rows."""

    def __init__(self, cfg: ModelConfig = ModelConfig(), *, device="cpu",
                 dtype: torch.dtype = torch.float32):
        if cfg.q_heads % cfg.kv_heads:
            raise ValueError(f"q_heads {cfg.q_heads} must be a multiple of kv_heads {cfg.kv_heads}")
        if cfg.head_dim % 2:
            raise ValueError(f"head_dim must be even for RoPE, got {cfg.head_dim}")
        self.cfg, self.device, self.dtype = cfg, torch.device(device), dtype
        g = torch.Generator().manual_seed(cfg.seed)

        def w(*shape, fan_in):
            t = torch.randn(*shape, generator=g) / math.sqrt(fan_in)
            return t.to(device=self.device, dtype=dtype)

        h, dq, dkv = cfg.hidden, cfg.q_heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim
        self.embed = w(cfg.vocab, h, fan_in=1)
        self.blocks = []
        for _ in range(cfg.layers):
            self.blocks.append({
                "wq": w(h, dq, fan_in=h), "wk": w(h, dkv, fan_in=h), "wv": w(h, dkv, fan_in=h),
                "wo": w(dq, h, fan_in=dq), "w_gate": w(h, cfg.ffn, fan_in=h),
                "w_up": w(h, cfg.ffn, fan_in=h), "w_down": w(cfg.ffn, h, fan_in=cfg.ffn),
                "n1": torch.ones(h, device=self.device, dtype=dtype),
                "n2": torch.ones(h, device=self.device, dtype=dtype),
            })
        self.norm = torch.ones(h, device=self.device, dtype=dtype)
        self.head = w(h, cfg.vocab, fan_in=h) * 4.0  # logits of order 1..10: argmax is stable
        half = cfg.head_dim // 2
        self.inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(half, dtype=torch.float64) / half))

    # ------------------------------------------------------------------------- pieces

    def rope(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Rotary embedding (rotate-half form) of x [T, H, D] at int positions [T]."""
        ang = positions.to(torch.float64).cpu().view(-1, 1) * self.inv_freq.view(1, -1)
        cos = torch.cos(ang).to(self.device, torch.float32).unsqueeze(1)  # [T, 1, D/2]
        sin = torch.sin(ang).to(self.device, torch.float32).unsqueeze(1)
        xf = x.float()
        x1, x2 = xf[..., : xf.shape[-1] // 2], xf[..., xf.shape[-1] // 2:]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, attn: AttnFn, *,
                logit_rows: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Logits [len(logit_rows) or T, vocab] in float32.

        tokens, positions: int64 [T] on any device; attn(layer, q, k, v) -> o [T, Hq, D] is
        called once per layer, in order, after RoPE.
        """
        c = self.cfg
        tokens = tokens.to(self.device, torch.int64)
        positions = positions.to(self.device, torch.int64)
        n = tokens.shape[0]
        x = self.embed[tokens]
        for layer, b in enumerate(self.blocks):
            y = _rms_norm(x, b["n1"])
            q = (y @ b["wq"]).view(n, c.q_heads, c.head_dim)
            k = (y @ b["wk"]).view(n, c.kv_heads, c.head_dim)
            v = (y @ b["wv"]).view(n, c.kv_heads, c.head_dim).contiguous()
            q, k = self.rope(q, positions).contiguous(), self.rope(k, positions).contiguous()
            o = attn(layer, q, k, v)
            x = x + o.reshape(n, -1) @ b["wo"]
            y = _rms_norm(x, b["n2"])
            x = x + (torch.nn.functional.silu(y @ b["w_gate"]) * (y @ b["w_up"])) @ b["w_down"]
        if logit_rows is not None:
            x = x[logit_rows.to(self.device)]
        return (_rms_norm(x, self.norm) @ self.head).float()

    def dense_logits(self, tokens) -> torch.Tensor:
        """Logits [T, vocab] of a whole sequence with plain causal attention and no KV cache:
        the oracle the paged replay is checked against."""
        from pagedattn.reference import attend

        t = torch.as_tensor(tokens, dtype=torch.int64)
        pos = torch.arange(t.shape[0])

        def attn(layer, q, k, v):
            out, _ = attend(q.float(), k.float(), v.float(), pos.to(q.device),
                            scale=self.cfg.head_dim ** -0.5)
            return out.to(q.dtype)

        return self.forward(t, pos, attn)


def sample(logits: torch.Tensor, *, temperature: float = 0.0,
           generator: Optional[torch.Generator] = None) -> int:
    """Greedy (temperature 0) or Gumbel-max sampling of one token from logits [vocab]."""
    if temperature <= 0:
        return int(torch.argmax(logits))
    u = torch.rand(logits.shape, generator=generator).clamp_(1e-9, 1 - 1e-9)
    return int(torch.argmax(logits.float().cpu() / temperature - torch.log(-torch.log(u))))

"""Tile tables of the extend kernel: one default per arch family, and the autotuning space.

A config is (BLOCK_M, BLOCK_N, num_warps, num_stages[, AMD extras]). BLOCK_M counts rows of the
folded (query token x GQA head) dimension, so BLOCK_M // GROUP_P query tokens share each KV tile.
The defaults work with autotuning off; ``PAGEDATTN_AUTOTUNE=1`` lets Triton choose among
:func:`tune_space` per shape class (see ``extend_attention._launch``).

NOTE on the sm_90 default for D <= 128 (BLOCK_M 128, BLOCK_N 128, 8 warps, 2 stages): the H200
autotune of 2026-11-30 (PAGEDATTN_AUTOTUNE=1 over tune_space, bf16, 32/8 heads, page 16) picked it
for the (1, 0, 8192) and (4, 4096, 1024) shape classes over the earlier (128, 64, 8, 3) default,
which measured 31 % of the matmul rate (bench/results/2026-11-30-h200/). Offline it spills about
100 bytes; measured, it is still faster.
"""
import functools
import os
from typing import Dict, List, NamedTuple

import torch

from pagedattn._triton import maxnreg_option, next_pow2


class TileConfig(NamedTuple):
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    waves_per_eu: int = 0  # AMD only (0 = not passed)
    matrix_instr_nonkdim: int = 0  # AMD only (0 = not passed)
    block_nm: int = 0  # keys per masked (diagonal) tile of the variant loop (0 = block_n)


# family -> head_dim_padded upper bound -> config (the first bound >= D_P wins)
_DEFAULTS: Dict[str, Dict[int, TileConfig]] = {
    # D <= 128: 64-key masked tiles (block_nm) for the variant loop, H200 session 10: +3-4 points
    # of the matmul rate on every issue shape (a 128-key masked tile spilled in its loop)
    "sm90": {64: TileConfig(128, 64, 4, 3), 128: TileConfig(128, 128, 8, 2, block_nm=64),
             256: TileConfig(64, 64, 4, 2)},
    "sm80": {64: TileConfig(128, 64, 4, 3), 128: TileConfig(128, 64, 8, 2),
             256: TileConfig(64, 32, 4, 2)},
    "sm8x": {64: TileConfig(64, 64, 4, 2), 128: TileConfig(64, 64, 4, 2),
             256: TileConfig(32, 32, 4, 1)},  # ~100 KB shared memory (sm_86, sm_89)
    "gfx9": {64: TileConfig(128, 64, 4, 1, 2, 16), 128: TileConfig(128, 64, 4, 1, 2, 16),
             256: TileConfig(64, 32, 4, 1, 2, 16)},
    "cuda": {64: TileConfig(64, 32, 4, 2), 128: TileConfig(64, 32, 4, 2),
             256: TileConfig(32, 32, 4, 1)},
    # the interpreter: smallest tiles that keep tl.dot >= 16 in every dim (CPU time)
    "interp": {256: TileConfig(16, 16, 4, 1)},
}


@functools.lru_cache(maxsize=None)
def arch_family(device_type: str, index: int) -> str:
    """``sm90``, ``sm80``, ``sm8x``, ``gfx9``, ``cuda`` (other NVIDIA/AMD) or ``interp``."""
    if device_type != "cuda":
        return "interp"
    props = torch.cuda.get_device_properties(index)
    gcn = getattr(props, "gcnArchName", "") or ""
    if getattr(torch.version, "hip", None):
        return "gfx9" if gcn.startswith("gfx9") else "cuda"
    if props.major >= 9:
        return "sm90"
    if (props.major, props.minor) == (8, 0):
        return "sm80"
    return "sm8x" if props.major == 8 else "cuda"


def is_hip(device: torch.device) -> bool:
    return device.type == "cuda" and getattr(torch.version, "hip", None) is not None


def family_of(device: torch.device) -> str:
    return arch_family(device.type, device.index if device.index is not None else 0)


def _fit(cfg: TileConfig, group_p: int, max_q_len: int) -> TileConfig:
    """BLOCK_M >= the padded group; shrunk for short queries (decode-like extends) but >= 16."""
    bm = max(cfg.block_m, group_p)
    need = max(16, group_p * next_pow2(max(max_q_len, 1)))
    return cfg._replace(block_m=min(bm, max(need, group_p)))


def default_config(device: torch.device, head_dim_p: int, group_p: int,
                   max_q_len: int) -> TileConfig:
    forced = config_override()
    if forced is not None:
        return _fit(forced, group_p, max_q_len)
    table = _DEFAULTS[family_of(device)]
    for bound in sorted(table):
        if head_dim_p <= bound:
            return _fit(table[bound], group_p, max_q_len)
    return _fit(table[max(table)], group_p, max_q_len)


def config_override() -> "TileConfig | None":
    """``PAGEDATTN_EXTEND_CONFIG=BLOCK_M,BLOCK_N,WARPS,STAGES[,WAVES_PER_EU,NONKDIM,BLOCK_NM]``
    (A/B runs): replaces the default. BLOCK_M, BLOCK_N (and BLOCK_NM unless 0) powers of 2 >= 16
    (tl.dot), WARPS a power of 2, STAGES >= 1, the AMD fields >= 0; anything else is a
    ValueError before any launch (not a compile error)."""
    raw = os.environ.get("PAGEDATTN_EXTEND_CONFIG", "")
    if not raw:
        return None
    try:
        v = tuple(int(x) for x in raw.split(","))
    except ValueError:
        v = ()

    def pow2(n, lo):
        return n >= lo and n & (n - 1) == 0
    if not (4 <= len(v) <= 7 and pow2(v[0], 16) and pow2(v[1], 16) and pow2(v[2], 1)
            and v[3] >= 1 and min(v[4:6], default=0) >= 0
            and (len(v) < 7 or v[6] == 0 or pow2(v[6], 16))):
        raise ValueError(f"PAGEDATTN_EXTEND_CONFIG={raw!r}: expected BLOCK_M,BLOCK_N,WARPS,STAGES"
                         "[,WAVES_PER_EU,NONKDIM,BLOCK_NM] (BLOCK_M, BLOCK_N, BLOCK_NM powers of "
                         "2 >= 16, WARPS a power of 2, STAGES >= 1)")
    return TileConfig(*v)


def masked_tile(cfg: TileConfig) -> int:
    """Keys per masked (diagonal) tile of the variant loop: ``PAGEDATTN_EXTEND_MASKED_N`` (A/B
    runs), else the config's ``block_nm``, else its ``block_n``. A power of 2 >= 16 (tl.dot) that
    divides block_n, so every tile start stays page- and tile-aligned."""
    raw = os.environ.get("PAGEDATTN_EXTEND_MASKED_N", "")
    if raw:
        n = int(raw) if raw.isdigit() else 0
        if n < 16 or n & (n - 1):
            raise ValueError(f"PAGEDATTN_EXTEND_MASKED_N={raw!r}: expected a power of 2 >= 16")
    else:
        n = cfg.block_nm or cfg.block_n
    return min(n, cfg.block_n)


def maxnreg_override(device: torch.device) -> dict:
    """``PAGEDATTN_EXTEND_MAXNREG=N`` (A/B runs, NVIDIA): cap the kernel's registers per thread,
    e.g. 128 so that two 8-warp programs share an SM. Unset: no cap ({})."""
    return maxnreg_option("PAGEDATTN_EXTEND_MAXNREG", device)


def autotune_enabled() -> bool:
    return os.environ.get("PAGEDATTN_AUTOTUNE", "") not in ("", "0")


def tune_space(device: torch.device, head_dim_p: int) -> List[TileConfig]:
    """Candidate configs for autotuning on this device (the default first)."""
    fam = family_of(device)
    if fam == "gfx9":
        space = [TileConfig(m, n, w, 1, wpe, 16) for m in (64, 128) for n in (32, 64)
                 for w in (4, 8) for wpe in (1, 2)]
    else:
        stages = (2, 3, 4) if fam in ("sm90", "sm80") else (1, 2)
        space = [TileConfig(m, n, w, s) for m in (64, 128) for n in (32, 64, 128)
                 for w in (4, 8) for s in stages]
    if head_dim_p > 128:  # shared memory: drop the widest tiles
        space = [c for c in space if c.block_n <= 64 and c.num_stages <= 2]
    default = default_config(device, head_dim_p, 1, 1 << 20)
    return [default] + [c for c in space if c != default]


def shape_class(total_q: int, max_q_len: int) -> int:
    """The autotuning key from host-known sizes: log4 buckets of Lq_max and of the token count."""
    def b(n):
        return min(6, max(0, (max(n, 1).bit_length() - 1) // 2))
    return b(max_q_len) * 8 + b(total_q // 64)


_TUNED: Dict[str, object] = {}


def autotuned(kernel):
    """``kernel`` wrapped in triton.autotune over :func:`tune_space` (built once, on first use)."""
    if "k" not in _TUNED:
        import triton

        dev = torch.device("cuda", torch.cuda.current_device())
        cfgs = []
        for c in tune_space(dev, 128):
            kw = {"BLOCK_M": c.block_m, "BLOCK_N": c.block_n, "BLOCK_NM": masked_tile(c)}
            if c.waves_per_eu:
                kw.update(waves_per_eu=c.waves_per_eu, matrix_instr_nonkdim=c.matrix_instr_nonkdim)
            cfgs.append(triton.Config(kw, num_warps=c.num_warps, num_stages=c.num_stages))

        def prune(configs, named_args, **kw):  # BLOCK_M must hold at least one head group
            g = kw.get("GROUP_P", named_args.get("GROUP_P", 1))
            dp = kw.get("HEAD_DIM_P", named_args.get("HEAD_DIM_P", 128))
            keep = [c for c in configs if c.kwargs["BLOCK_M"] >= g
                    and (dp <= 128 or c.kwargs["BLOCK_N"] <= 64)]
            return keep or configs[:1]
        _TUNED["k"] = triton.autotune(
            configs=cfgs, key=["tune_class", "HEAD_DIM_P", "GROUP_P", "PAGE", "KV_FP8", "CAUSAL",
                               "VARIANT"],
            prune_configs_by={"early_config_prune": prune})(kernel)
    return _TUNED["k"]

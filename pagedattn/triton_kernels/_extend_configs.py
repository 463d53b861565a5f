"""Tile tables of the extend kernel: one default per arch family.

A config is (BLOCK_M, BLOCK_N, num_warps, num_stages[, AMD extras]). BLOCK_M counts rows of the
folded (query token x GQA head) dimension, so BLOCK_M // GROUP_P query tokens share each KV tile.

NOTE on the sm_90 default for D <= 128 (BLOCK_M 128, BLOCK_N 128, 8 warps, 2 stages; 3 for the
one-pass loop): an H200 autotune over 144 configs (bf16, 32/8 heads, page 16) picks it for the
(1, 0, 8192) and (4, 4096, 1024) shape classes; the (128, 64, 8, 3) tile it replaces reaches
31 % of the matmul rate. Offline it spills about 100 bytes; measured, it is still faster.
"""
import functools
from typing import Dict, NamedTuple

import torch

from pagedattn._triton import next_pow2


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
    # D <= 128: 64-key masked tiles (block_nm) for the one-pass loop: +3-4 points of the matmul
    # rate on every shape of the extend table on the H200 (a 128-key masked tile spills)
    "sm90": {64: TileConfig(128, 64, 4, 3), 128: TileConfig(128, 128, 8, 2, block_nm=64),
             256: TileConfig(64, 64, 4, 2)},
    "sm80": {64: TileConfig(128, 64, 4, 3), 128: TileConfig(128, 64, 8, 2),
             256: TileConfig(64, 32, 4, 2)},
    "sm8x": {64: TileConfig(64, 64, 4, 2), 128: TileConfig(64, 64, 4, 2),
             256: TileConfig(32, 32, 4, 1)},  # ~100 KB shared memory (sm_86, sm_89)
    # gfx90a/gfx942 (offline, triton 3.9): 8 warps keep every extend loop out of scratch; with
    # 4 warps the 128-row tile spills 148-484 bytes per lane (tests/test_triton_amd_compile.py)
    "gfx9": {64: TileConfig(128, 64, 8, 1, 2, 16), 128: TileConfig(128, 64, 8, 1, 2, 16),
             256: TileConfig(64, 32, 8, 1, 2, 16)},
    "cuda": {64: TileConfig(64, 32, 4, 2), 128: TileConfig(64, 32, 4, 2),
             256: TileConfig(32, 32, 4, 1)},
    # head dims past 256 (K 512/576, MLA's absorbed prefill): 16-row, 16-key tiles, one stage,
    # on every GPU family (compile-checked offline; not yet tuned on a GPU)
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


_WIDE = TileConfig(16, 16, 4, 1)  # padded head dims past 256


def default_config(device: torch.device, head_dim_p: int, group_p: int,
                   max_q_len: int) -> TileConfig:
    fam = family_of(device)
    if head_dim_p > 256 and fam != "interp":
        return _fit(_WIDE if fam != "gfx9" else _WIDE._replace(num_warps=8), group_p, max_q_len)
    table = _DEFAULTS[fam]
    for bound in sorted(table):
        if head_dim_p <= bound:
            return _fit(table[bound], group_p, max_q_len)
    return _fit(table[max(table)], group_p, max_q_len)


def masked_tile(cfg: TileConfig) -> int:
    """Keys per masked (diagonal) tile of the one-pass loop: the config's ``block_nm``, else its
    ``block_n``. A power of 2 >= 16 (tl.dot) that divides block_n, so every tile start stays
    page- and tile-aligned."""
    return min(cfg.block_nm or cfg.block_n, cfg.block_n)

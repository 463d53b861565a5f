"""Tile configs of the Triton decode launcher (``decode.py``): the decode kernel's tiles per
(head dim, rows) bucket and cache dtype, the combine's, and the rules that pick them. Each depends
on the model, the cache and the device, never on the batch (batch invariance)."""
import torch

from pagedattn._triton import next_pow2
from pagedattn.reference import FP8_DTYPES

# (BLOCK_N, num_warps, num_stages) keyed by (padded head dim, rows bucket). One config serves
# every launch shape (batch invariance needs the same tiles). NVIDIA, rows <= 16: 32-token tiles,
# 4 warps, 3 stages: on the H200 16-token tiles run (8, 8192) 32/8 in one wave (69 against 84 us)
# but lose 1.6x at (1, 4096) and 3-4 % at (1, 32768) and (64, 4096). AMD and DCU: one stage
# (no cp.async pipelining there).
# Tiles wider than 256 columns (K 512 or 576 = 512 + 64 with the tail tile, MLA's V 512) hold
# at most 16 rows (decode._head_split): 8 warps keep the q, K and acc tiles in registers.
_CONFIGS = {
    "nvidia": {(128, 16): (32, 4, 3), (128, 64): (64, 4, 3), (128, 256): (32, 8, 2),
               (256, 16): (32, 4, 2), (256, 64): (32, 4, 2), (256, 256): (16, 8, 2),
               (1024, 16): (32, 8, 2)},
    "amd": {(128, 16): (64, 4, 1), (128, 64): (64, 4, 1), (128, 256): (32, 8, 1),
            (256, 16): (32, 4, 1), (256, 64): (32, 4, 1), (256, 256): (16, 8, 1),
            (1024, 16): (16, 8, 1)},
}
# fp8 caches (1 byte per element), rows <= 16, D <= 128: tiles of 128 tokens, 4x the 16-bit tile's
# tokens, twice its bytes. On the H200, with fp16 dots (_f16_dot), 1.05-1.84x faster than 32-token
# tiles with bf16 dots on every e5m2 and e4m3 row (32/8 and 32/32, blocks 16-128). 64-token tiles
# win some one-pass rows at block 64 but lose up to 25 % elsewhere; the tile may not follow the
# launch shape (batch invariance), so one tile serves every block size. AMD, rows 17-64: 32-token
# fp8 tiles (64-token ones spill on gfx942; tests/test_triton_amd_compile.py).
_FP8_CONFIGS = {("nvidia", (128, 16)): (128, 4, 3), ("amd", (128, 64)): (32, 4, 1)}
# Registers per thread the balanced launch is compiled to (ptxas maxnreg), by 16-bit config and
# the triton it was checked under: the plan sizes one wave from shared memory and warps
# (decode._slots: 4 programs of 4 warps per SM at rows <= 16, D 128), which 128 registers keep
# resident. The guarded balanced kernel takes 144-150 otherwise (sm_90, triton 3.6: 3 per SM, a
# second partial wave); at 128 it stores 8 bytes outside its tile loops
# (tests/test_triton_decode_compile.py checks both). On the H200 at 32/8 (1, 32768) the guards
# cost 4.0 % with the cap (bench/results/2026-12-05-h200-9602dfa). Triton 3.9 spills inside
# the loops at 128: no cap there.
_BAL_MAXNREG = {("nvidia", (128, 16), "3.6."): 128}
_TORCH_TO_FAMILY = {True: "amd", False: "nvidia"}
MAX_ROWS = 256  # G * Lq rows per program
# The split launch's combine kernel: (states per load, warps, column blocks per row, pipeline
# stages of the group loop). One warp with >= 32 columns per program keeps a group's rows and
# every per-partition scalar in each thread's registers: the running maxima and pulling row u out
# cost no shuffles and no layout conversions. On the H200 at (1, 32768) 32/8 from CUDA graphs the
# combine takes 3.2 us with (32, 1, 4, 1) against 8.5 with (8, 1, 1, 1); _combine_config caps
# UNROLL at the batch's largest partition count (unrolled neutral states cost 5-8 % at 4
# partitions). Outputs are the same bits for every value.
SPLIT_COMBINE = (32, 1, 4, 1)


def _combine_config(block_d, n_part_max):
    unroll, warps, dsplit, stages = SPLIT_COMBINE
    # no larger than the longest sequence's partition count: the group loop is unrolled, so
    # neutral rows past it cost time (same bits for any group size); >= 32 columns per program:
    # one warp then holds whole columns (no shuffles)
    return (min(unroll, max(2, next_pow2(n_part_max))), warps,
            max(1, min(dsplit, block_d // 32)), max(1, stages))


def _config(block_d, rows, kv_bytes, device):
    fam = _TORCH_TO_FAMILY[bool(getattr(torch.version, "hip", None))]
    bucket = 16 if rows <= 16 else 64 if rows <= 64 else 256
    key = (_width_key(block_d), bucket)
    if kv_bytes == 1 and (fam, key) in _FP8_CONFIGS:
        block_n, warps, stages = _FP8_CONFIGS[(fam, key)]
        # Triton keeps stages - 1 K/V tiles in shared memory (sm_90, triton 3.6: 72 KB at 3
        # stages, D 128, 8 KB of it q and layout scratch); one stage fewer where a block may
        # hold less (99 KB on sm_86/89/120: 3 stages fit there too, with room to spare)
        need = (stages - 1) * block_n * block_d * 2 * kv_bytes + 8 * 1024
        while stages > 2 and need > _smem_per_block(device):
            stages -= 1
            need -= block_n * block_d * 2 * kv_bytes
        return block_n, warps, stages
    return _CONFIGS[fam][key]


def _width_key(width):
    """The config table's width bucket of a tile width (columns of the widest tile row)."""
    return 128 if width <= 128 else 256 if width <= 256 else 1024


def bal_maxnreg(block_d, rows, kv_bytes):
    """The register cap of the balanced 16-bit launch for this config (:data:`_BAL_MAXNREG`),
    or None (no cap: fp8 caches, AMD, other buckets)."""
    if kv_bytes == 1 or getattr(torch.version, "hip", None):
        return None
    import triton
    bucket = 16 if rows <= 16 else 64 if rows <= 64 else 256
    key = ("nvidia", (_width_key(block_d), bucket), triton.__version__[:4])
    return _BAL_MAXNREG.get(key)


def _lazy_rowsum(block_m, block_n):
    """Whether the tile loop keeps the row sums per key lane until a partition ends
    (``_decode_kernels._attend``: one cross-warp step per tile, not two): for tiles of <= 512
    logits, where it costs 4 registers per thread."""
    return block_m * block_n <= 512


def _smem_per_block(device):
    if device.type != "cuda":
        return 1 << 30  # interpreter: no limit
    props = torch.cuda.get_device_properties(device)
    return getattr(props, "shared_memory_per_block_optin", 0) or 99 * 1024


def _f16_dot(q_dtype, kv_dtype, device):
    """Whether a bf16 q over an fp8 cache runs its dots in fp16 (``_decode_kernels._fp16_q``):
    always (the interpreter needs it too: its bf16 tl.dot is wrong). Offline (sm_90, triton 3.6)
    the fp8 loop takes 71 instructions per KB of K/V instead of 82; on the H200 it is
    1.04-1.17x faster on every 32/8 row, e5m2 and e4m3, at the same tiles."""
    return q_dtype == torch.bfloat16 and kv_dtype in FP8_DTYPES


# One pass for even batches (the balanced plan's fill): the count rule (FILL x SMs programs), but
# for the swap form not between one and three waves of resident programs. On the H200, MHA with
# one wave plus 20-52 programs (3.15-3.39 per SM) runs 1.13-1.19x faster in shares than in one
# pass (a second wave of whole sequences). Below FILL x SMs the balanced launch's extra programs,
# empty on a fill batch, run beside the sequences and cost 4-18 %, so one pass starts at FILL.


def fill_n(programs, sms, slots, swap, fill):
    """FILL_N of the balanced plan (``_decode_state.plan``: an even batch runs in one pass when
    B x Hkv >= FILL_N): ``programs`` (B x Hkv) when one pass is the launch, else programs + 1
    (never): ``fill`` x SMs programs or more, and for the ``swap`` form at most one wave of
    ``slots`` resident programs or at least three."""
    ok = programs >= fill * sms and (not swap or programs <= slots or programs >= 3 * slots)
    return programs if ok else programs + 1

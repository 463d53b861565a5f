"""Tile configs of the Triton decode launcher (``decode.py``): the decode kernel's tiles per
(head dim, rows) bucket and cache dtype, the combine's, and the per-call tuning knobs
(PAGEDATTN_DECODE_CONFIG / _COMBINE / _ROWSUM / _MAXNREG / _FP8_DOT). Each depends on the model,
the cache and the device, never on the batch (batch invariance)."""
import os

import torch

from pagedattn._triton import maxnreg_option, next_pow2
from pagedattn.reference import FP8_DTYPES

# (BLOCK_N, num_warps, num_stages[, SUB]) keyed by (padded head dim, rows bucket). One config
# serves both launch shapes (batch invariance needs the same tiles). NVIDIA, rows <= 16: 32-token
# tiles, 4 warps, 3 stages; H200 (h200-s3/decode_config_sweep.log): (16, 1, 3) runs (8, 8192)
# 32/8 in one wave (69 vs 84 us) but loses 1.6x at (1, 4096), 3-4 % at (1, 32768), (64, 4096).
# SUB > 1: the column split (_decode_cs.py), 0.70-0.93x on the 32/8 rows (h200-s16). AMD/DCU:
# fewer stages.
_CONFIGS = {
    "nvidia": {(128, 16): (32, 4, 3), (128, 64): (64, 4, 3), (128, 256): (32, 8, 2),
               (256, 16): (32, 4, 2), (256, 64): (32, 4, 2), (256, 256): (16, 8, 2)},
    "amd": {(128, 16): (64, 4, 1), (128, 64): (64, 4, 1), (128, 256): (32, 8, 1),
            (256, 16): (32, 4, 1), (256, 64): (32, 4, 1), (256, 256): (16, 8, 1)},
}
# fp8 caches (1 byte per element), rows <= 16, D <= 128: tiles of 128 tokens, 4x the bf16 tile's
# tokens, twice its bytes. H200, session 9 (bench/results/2026-12-01-h200-s9), with fp16 dots:
# against the session-8 default (bf16 dots, 32-token tiles) 1.05-1.72x faster on all 40 e5m2 rows
# (32/8 and 32/32, blocks 16-128; e4m3 1.05-1.84x). 64-token tiles beat them by up to 17 % on
# most one-pass rows with block 64 (one page per tile) and by 5-6 % at (128, 512) with block 128,
# but lose up to 25 % on the other rows; the tile may not follow the launch shape (batch
# invariance), so one tile serves every block size.
_FP8_CONFIGS = {("nvidia", (128, 16)): (128, 4, 3)}
_TORCH_TO_FAMILY = {True: "amd", False: "nvidia"}
MAX_ROWS = 256  # G * Lq rows per program
# The split launch's combine kernel: (states per load, warps, column blocks per row, pipeline
# stages of the group loop). One warp with >= 32 columns per program keeps a group's rows and
# every per-partition scalar in each thread's registers: the running maxima and pulling row u out
# cost no shuffles and no layout conversions (session 5: the old form, scalars spread over lanes,
# did 3 warp-shuffle reductions per partition: ~0.09 us per partition). H200, session 5
# (bench/results/2026-11-30-h200-s5/combine_*.log), (1, 32768) 32/8 from CUDA graphs: 44.1 us
# with (8, 1, 1, 1), 40.2 with (8, 1, 4, 1), 40.6 with (16, 1, 4, 1), 38.9 with (32, 1, 4, 1)
# (combine kernel 8.5 -> 3.2 us); (8, 8192) and (1, 4096) within 1 %. _combine_config caps
# UNROLL at the batch's largest partition count: with 32 always, B32 L2048 (4 partitions) lost
# 5-8 % (ab_decode_cuda_graph.md). Pipelining the group loop measured slower (session 4); launching
# the combine as a programmatic dependent (_pdl) saved 0.4-0.7 us. UNROLL 64 (one round trip for
# 64 partitions) measured slower in session 8: ncu at (1, 32768) 32/8, 4.9-5.0 us against
# 4.1-4.8 (2026-12-01-h200-s8/ncu_dur_triton*_8.txt; 228 registers).
# PAGEDATTN_DECODE_COMBINE="UNROLL,WARPS[,DSPLIT[,STAGES]]" overrides (A/B runs); outputs are the
# same bits for every value.
SPLIT_COMBINE = (32, 1, 4, 1)


def _env_ints(name, n_min, n_max, pow2=(), why=""):
    """The tuple of positive integers in env ``name`` (None when unset): n_min to n_max of them,
    those at the positions in ``pow2`` powers of 2. Anything else is a ValueError (before any
    launch; tl.arange and the layouts need powers of 2)."""
    raw = os.environ.get(name)
    if not raw:
        return None
    try:
        vals = tuple(int(x) for x in raw.split(","))
    except ValueError:
        vals = ()
    if not (n_min <= len(vals) <= n_max and min(vals) >= 1
            and all(vals[i] & (vals[i] - 1) == 0 for i in pow2 if i < len(vals))):
        raise ValueError(f"{name}={raw!r}: expected {n_min} to {n_max} comma-separated positive "
                         f"integers{why}")
    return vals


def _env_choice(name, choices, default):
    """The value of env ``name`` (``default`` when unset), one of ``choices``; anything else is a
    ValueError before any launch."""
    raw = os.environ.get(name, default)
    if raw not in choices:
        raise ValueError(f"{name}: expected {', '.join(choices[:-1])} or {choices[-1]}, "
                         f"got {raw!r}")
    return raw


def _combine_config(block_d, n_part_max):
    cfg = _env_ints("PAGEDATTN_DECODE_COMBINE", 1, 4, (0, 1, 2),
                    " (UNROLL,WARPS[,DSPLIT[,STAGES]]; the first three powers of 2)")
    cfg = cfg or SPLIT_COMBINE
    unroll, warps, dsplit, stages = (cfg + SPLIT_COMBINE[len(cfg):])[:4]
    # no larger than the longest sequence's partition count: the group loop is unrolled, so
    # neutral rows past it cost time (same bits for any group size); >= 32 columns per program:
    # one warp then holds whole columns (no shuffles)
    return (min(unroll, max(2, next_pow2(n_part_max))), warps,
            max(1, min(dsplit, block_d // 32)), max(1, stages))


def _config(block_d, rows, kv_bytes, device):
    why = " (BLOCK_N,WARPS,STAGES[,SUB]: powers of 2 but STAGES, BLOCK_N >= 16 SUB)"
    env = _env_ints("PAGEDATTN_DECODE_CONFIG", 3, 4, (0, 1, 3), why)
    if env:
        if env[0] < 16 * (env[3] if len(env) > 3 else 1):
            raise ValueError(f"PAGEDATTN_DECODE_CONFIG={env}: expected{why[:-1]}")
        return env
    fam = _TORCH_TO_FAMILY[bool(getattr(torch.version, "hip", None))]
    bucket = 16 if rows <= 16 else 64 if rows <= 64 else 256
    key = (128 if block_d <= 128 else 256, bucket)
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


def _lazy_rowsum(block_m, block_n):
    """PAGEDATTN_DECODE_ROWSUM: ``lazy`` keeps the row sums per key lane until a partition ends
    (``_decode_kernels._attend``: one cross-warp step per tile, not two), ``tile`` sums each
    tile; ``auto`` (default): lazy for tiles of <= 512 logits (4 more registers per thread)."""
    env = _env_choice("PAGEDATTN_DECODE_ROWSUM", ("auto", "lazy", "tile"), "auto")
    return env == "lazy" or (env == "auto" and block_m * block_n <= 512)


def _maxnreg(device):
    """PAGEDATTN_DECODE_MAXNREG=N (A/B runs, NVIDIA): cap the decode kernel's registers per thread.

    Offline (sm_90, triton 3.6) the fp8 cache's 128-token tiles take 206 registers: 2 programs
    per SM, where 64-token tiles (146) fit 3 and won the one-pass rows at block 64 by up to 17 %
    (H200, session 9). At 168 (3 programs) they spill 48-160 bytes. Unset: no cap.
    """
    return maxnreg_option("PAGEDATTN_DECODE_MAXNREG", device)


def _smem_per_block(device):
    if device.type != "cuda":
        return 1 << 30  # interpreter: no limit
    props = torch.cuda.get_device_properties(device)
    return getattr(props, "shared_memory_per_block_optin", 0) or 99 * 1024


def _f16_dot(q_dtype, kv_dtype, device):
    """Whether a bf16 q over an fp8 cache runs its dots in fp16 (``_decode_kernels._fp16_q``):
    the default (PAGEDATTN_DECODE_FP8_DOT=bf16 restores bf16 dots; the interpreter always uses
    fp16: its bf16 tl.dot is wrong, and dispatch.capabilities counts on it).

    Offline (sm_90, triton 3.6) the fp8 loop goes from 82 to 71 instructions per KB of K/V. H200,
    session 9 (bench/results/2026-12-01-h200-s9): 1.04-1.17x faster on every 32/8 issue row, e5m2
    and e4m3, at the same tiles.
    """
    env = _env_choice("PAGEDATTN_DECODE_FP8_DOT", ("f16", "bf16"), "f16")
    if q_dtype != torch.bfloat16 or kv_dtype not in FP8_DTYPES:
        return False
    return env == "f16" or device.type != "cuda"


def _fold_last():
    """PAGEDATTN_DECODE_FOLD: where a split launch merges its partition states. ``combine``
    (default): the combine kernel, a second launch; ``last`` (A/B runs): the decode kernel's last
    program of each (sequence, KV head) to park them (``_decode_state.fold_last``; per-call int32
    counters, zeroed; the same bits). The Triton kernel only; Gluon launches keep the combine.
    H200, session 17 (bench/results/2026-12-02-h200-s17), 32/8 block 16: 0.90x at (1, 32768),
    0.99x at (8, 8192) with 16 states per round trip (0.74x and 0.95x with one): the last
    program's park, release fence, atomic and loads are a chain as long as the combine's tail
    (CUPTI: +6.0 and +3.2 us on the decode span, and 0.9 us for zeroing the counters)."""
    return _env_choice("PAGEDATTN_DECODE_FOLD", ("combine", "last"), "combine") == "last"


def _fold_tile(rows, block_d, num_warps, n_part_max):
    """(rows, states per round trip) of the in-kernel merge (``_decode_state.fold_last``): the
    group's own rows (a power of 2 >= rows, not the dot's 16), and as many states per round trip
    as keep ~64 of their values in each thread's registers (the decode loop's are free by then;
    offline, sm_90, triton 3.6, 32/8 D 128, 16 states: 96-128 registers, still 4 programs per
    SM; the compile tier checks <= 128 and no spills), no more than the longest sequence's
    partition count (states past it are neutral, loaded for nothing)."""
    block_r = next_pow2(rows)
    per_state = max(1, block_r * block_d // (32 * num_warps))  # acc elements per thread
    return block_r, max(1, min(64 // per_state, next_pow2(n_part_max)))


# One pass for even batches (the balanced plan's fill): the count rule (FILL x SMs programs), but
# the swap form not between one and three waves of resident programs. H200 session 22
# (bench/results/2026-12-02-h200-s22/call1-2): MHA one wave plus 20-52 programs (3.15-3.39 per
# SM) ran 1.13-1.19x faster in shares than in one pass (a second wave of whole sequences). One
# pass below FILL x SMs won against split in the A/B (1.02-1.08x at 2.4-2.9 per SM), but the
# balanced launch's fill lost there (0.82-0.96x at (16, 4096) 32/8 block 64, (40, 4096) block 16
# and 32/32 (8, 8192)): its grid's extra programs, empty then, run beside the sequences.


def fill_n(programs, sms, slots, swap, fill):
    """FILL_N of the balanced plan (``_decode_state.plan``: an even batch runs in one pass when
    B x Hkv >= FILL_N): ``programs`` (B x Hkv) when one pass is the launch, else programs + 1
    (never): ``fill`` x SMs programs or more, and for the ``swap`` form at most one wave of
    ``slots`` resident programs or at least three."""
    ok = programs >= fill * sms and (not swap or programs <= slots or programs >= 3 * slots)
    return programs if ok else programs + 1

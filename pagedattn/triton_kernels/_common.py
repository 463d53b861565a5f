"""Shared ``@triton.jit`` helpers of the attention kernels (decode, extend).

Stable names (other kernels import them; change only together with their users):

* :func:`kv_offset`      -- the one address function of ``pagedattn.layouts`` on KVStrides.
* :func:`tanh_exp2`, :func:`soft_cap` -- logit soft-cap through ``exp2`` (no ``tl.tanh`` needed).
* :func:`alibi_bias`     -- ALiBi ``slope * (j - p)``.
* :func:`visible`        -- key visibility: in range, shifted causal, sliding window.
* :func:`first_tile`     -- where a decode query's visible keys start, rounded to a tile.
* :func:`online_softmax_step` -- one tile of the online softmax (log2 domain, NaN-free).
* :func:`finalize_state` -- (m, l, acc) -> normalised output and log2-LSE, with optional sinks.

Units: every logit here is in the log2 domain (natural logit * log2(e)), so the kernels use
``exp2`` (one multiply by log2(e) folded into the scale). Masked logits are a real ``-inf``; an
all-masked row keeps m = -inf and l = 0, and no helper ever evaluates ``-inf - (-inf)``.
"""
import triton
import triton.language as tl

LOG2E = 1.4426950408889634  # log2(e): exp(x) == exp2(x * LOG2E)
LN2 = 0.6931471805599453  # ln(2): natural lse = log2-lse * LN2


@triton.jit
def kv_offset(block, tok, head, d, stride_block: tl.int64, stride_token: tl.int64,
              stride_head: tl.int64, stride_dim_hi: tl.int64, stride_dim_lo: tl.int64,
              X: tl.constexpr, SPLIT_D: tl.constexpr, LO_ONE: tl.constexpr):
    """int64 element offset of (block, token-in-block, head, d); arguments broadcast.

    offset = block*s.block + t*s.token + h*s.head + (d // x)*s.dim_hi + (d % x)*s.dim_lo
    SPLIT_D: the head dim is split by X (the vllm K cache); otherwise d // x == 0.
    LO_ONE: s.dim_lo == 1 (known on the host), so the d term stays contiguous for the
    compiler and loads along d vectorise.
    ``block`` must already be int64 (a loaded block id is widened before this call).
    """
    off = block * stride_block + tok * stride_token + head * stride_head
    if SPLIT_D:
        off += (d // X) * stride_dim_hi
        if LO_ONE:
            off += d % X
        else:
            off += (d % X) * stride_dim_lo
    else:
        if LO_ONE:
            off += d
        else:
            off += d * stride_dim_lo
    return off


@triton.jit
def tanh_exp2(x):
    """tanh(x) = 1 - 2 / (exp2(2 x log2 e) + 1); saturates to +-1 without inf/inf."""
    return 1.0 - 2.0 / (tl.exp2(x * (2.0 * 1.4426950408889634)) + 1.0)


@triton.jit
def soft_cap(s, cap):
    """cap * tanh(s / cap) on natural-domain logits."""
    return cap * tanh_exp2(s / cap)


@triton.jit
def alibi_bias(slope, j, p):
    """slope[row] * (j - p): slope [M, 1] float32, j [1, N] key positions, p [M, 1] query
    positions -> [M, N] (natural domain)."""
    return slope * (j - p).to(tl.float32)


@triton.jit
def visible(j, p, hi, window, CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr):
    """Key j [1, N] visible to the query at absolute position p [M, 1]: j < hi (end of the
    range being read), causal j <= p, window j > p - window. -> bool [M, N]."""
    ok = j < hi
    if CAUSAL:
        ok = ok & (j <= p)
    if HAS_WINDOW:
        ok = ok & (j > p - window)
    return ok


@triton.jit
def first_tile(seq_len, LQ, window, HAS_WINDOW: tl.constexpr, STEP: tl.constexpr):
    """The first key of the first STEP-key tile holding a key some of the LQ last positions of
    a sequence of seq_len keys can see (0 without a window)."""
    lo = 0
    if HAS_WINDOW:
        lo = tl.maximum(seq_len - LQ + 1 - window, 0)
    return lo // STEP * STEP


@triton.jit
def online_softmax_step(m_i, l_i, s):
    """Fold one tile of log2-domain logits s [M, N] (-inf = masked) into the state.

    m_i, l_i: [M] running max and running sum of exp2(s - m_i).
    Returns (m_new, l_new, alpha [M], p [M, N]); the caller rescales acc by alpha and adds
    p @ V. Rows still fully masked keep m = -inf, l = 0, p = 0 (m_safe avoids -inf - -inf).
    """
    m_new = tl.maximum(m_i, tl.max(s, 1))  # [M]
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # [M]
    alpha = tl.exp2(m_i - m_safe)  # [M], 0 when m_i = -inf
    p = tl.exp2(s - m_safe[:, None])  # [M, N]
    l_new = l_i * alpha + tl.sum(p, 1)
    return m_new, l_new, alpha, p


@triton.jit
def finalize_state(m, l, acc, sink, HAS_SINK: tl.constexpr):
    """(m [M], l [M], acc [M, D]) -> (out [M, D] float32, lse2 [M]) in the log2 domain.

    Sinks (sink [M], natural-log logits as loaded) join the denominator only; lse excludes them.
    An empty row (l == 0) gives out 0 and lse2 = -inf; a poisoned one (l NaN, the guarded
    kernels' mark of invalid metadata) out and lse2 NaN. NOTE every product that meets an add is
    an explicit FMA: left to the compiler, ``sink * log2(e) - m2`` was contracted in the split
    combine but not in the decode kernel (sm_90 PTX, triton 3.6), and outputs with a sink near
    the row maximum differed in the last bit between the launch shapes.
    """
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    if HAS_SINK:
        sink2 = sink * 1.4426950408889634  # the max only: a rounded product
        m2 = tl.maximum(m_safe, sink2)
        m2 = tl.where(m == float("-inf"), sink2, m2)
        r = tl.exp2(m_safe - m2)  # [M] rescale of l and acc to the joint max
        den = tl.fma(l, r, tl.exp2(tl.fma(sink, 1.4426950408889634, -m2)))
    else:
        r = tl.full(m.shape, 1.0, tl.float32)
        den = l
    inv = tl.where(den > 0, r / tl.where(den > 0, den, 1.0), 0.0)
    inv = tl.where(l == l, inv, l)  # a poisoned row (l NaN: guarded metadata) stays NaN
    out = acc * inv[:, None]
    lse2 = tl.where(l > 0, m_safe + tl.log2(tl.where(l > 0, l, 1.0)), float("-inf"))
    lse2 = tl.where(l == l, lse2, l)
    return out, lse2

// attn_kernel.cuh: paged attention over a KV-tile pipeline shared by decode and prefix prefill.
//
// One block = 4 waves and 16 * HEAD_TILES "rows". Decode: rows are the query heads of one KV
// head's group (the KV-head grid: every KV tile is read from memory once and used by all heads
// of the group); extend: rows are 64 consecutive queries of one head.
// Wave w owns row tile w % HEAD_TILES and the token slice w / HEAD_TILES of every KV tile; the
// token slices are merged through LDS at the end.
//
// Per KV tile of T = 64 tokens:
//   Phases 1-2: the tile reaches LDS/shared memory: register_tile_loop (attn_tiles.cuh: AMD/
//            Hygon, fp8 caches, extend) or, NVIDIA decode with a 16-bit cache and a group of
//            more than 16 heads, pipelined_tile_loop (attn_pipe.cuh, cp.async). Groups of <= 16
//            heads on that path run decode_cs_kernel (decode_cs.cuh) instead of this kernel.
//   Phase 3: S = Q K^T (Q in registers), mask, online softmax in the exp2 domain.
//   Phase 4: O += P V with P converted in registers (acc_to_frag).
// Then: merge token slices, normalise, write out/lse (one partition) or the split-KV partials.
//
// Torch-free: compiled by the JIT build and, standalone, by csrc/compile_check.
#pragma once

#include "attn_cfg.h"
#include "attn_pipe.cuh"
#include "attn_tiles.cuh"
#include "pk_guard.h"

namespace pk {

template <class Cfg>
__global__ void PK_LAUNCH_BOUNDS(Cfg::kThreads, Cfg::kMinBlocks) attn_kernel(const AttnParams p) {
  using QT = typename Cfg::QT;
  using KVT = typename Cfg::KVT;
  constexpr int D = Cfg::D, T = Cfg::T, NT = Cfg::kThreads, HT = Cfg::kHeadTiles;
  constexpr int KS = Cfg::kKStride, VS = Cfg::kVStride, EPV = Cfg::kEpv;
  constexpr bool kDecode = Cfg::kMode == Mode::kDecode;
  constexpr bool kFp8 = KVT::kBytes == 1;

  // Preconditions (host-checked): page_size a power of 2 >= 16; partition_size % T == 0; cache
  // base pointers 16-byte aligned and k/v strides multiples of EPV; q strides even.
  uint8_t* smem;
  if constexpr (Cfg::kPipe) {
    // (kStages, kStageElems) 16-bit; the swizzle needs 128-byte aligned stages. One alignment
    // for every instantiation: the array is one symbol per translation unit (D 64 is unswizzled)
    extern __shared__ __align__(128) uint8_t pk_dyn_smem[];
    smem = pk_dyn_smem;
  } else {
    __shared__ __align__(16) uint8_t pk_tile_smem[Cfg::kSmemBytes];
    smem = pk_tile_smem;
  }
  __shared__ float red_m[Cfg::kWaves][16];
  __shared__ float red_l[Cfg::kWaves][16];
  uint16_t* Ks = reinterpret_cast<uint16_t*>(smem);     // (T, KS)  K tile, row = token
  uint16_t* Vs = Ks + T * KS;                           // (D, VS)  V^T tile, row = d
  float* red_o = reinterpret_cast<float*>(smem);        // ((kTokSplit-1)*HT, 16, D), after loop

  const int tid = threadIdx.x, lane = lane_id(), wave = wave_id();
  const int rt = wave % HT;   // row tile of this wave
  const int ts = wave / HT;   // token slice of this wave

  // ---- Block coordinates, rows, key range; metadata guards (pk_guard.h) ---------------------
  int seq, kv_head, ctx, row0, nrows, kbeg, kend, q_tok0 = 0, q_head0 = 0, prefix = 0, part = 0;
  bool bad;  // block-uniform: this sequence's metadata is bad; its rows become NaN
  if constexpr (kDecode) {
    kv_head = blockIdx.x / p.blocks_per_kv_head;
    const int hg = blockIdx.x % p.blocks_per_kv_head;
    seq = blockIdx.y;
    part = blockIdx.z;
    ctx = p.seq_lens[seq];
    bad = seq_len_bad(p, ctx);
    if (bad) ctx = 0;  // read nothing; partition 0 writes the NaN rows
    q_head0 = kv_head * p.group + hg * p.heads_per_block;
    nrows = min(p.heads_per_block, p.group - hg * p.heads_per_block);
    kbeg = part * p.partition_size;
    if (part > 0 && kbeg >= ctx) return;  // partition 0 always runs: it writes empty rows
    kend = min(ctx, kbeg + p.partition_size);
    row0 = 0;
    {  // the table entries of keys [kbeg, kend), read by the tile loop
      const int* row = p.block_table + int64_t(seq) * p.table_stride;
      bad = block_any(bad || table_range_bad(p, row, kbeg, kend, NT));
    }
    count_error(p, bad);
    if (bad) kend = kbeg;
  } else {
    const int mb = blockIdx.x;
    q_head0 = blockIdx.y;
    seq = blockIdx.z;
    kv_head = q_head0 / p.group;
    const int cu0 = p.cu_seqlens_q[seq], cu1 = p.cu_seqlens_q[seq + 1];
    const bool cu_ok = 0 <= cu0 && cu0 <= cu1 && cu1 <= p.num_tokens;
    const int lq = cu_ok ? cu1 - cu0 : 0;
    ctx = p.seq_lens[seq];
    bad = !cu_ok || seq_len_bad(p, ctx) || lq > ctx || lq > p.max_q_len;
    row0 = mb * 16 * HT;
    if (!bad && row0 >= lq) return;
    {  // every table entry of the request: all its rows are NaN when one is bad
      const int* row = p.block_table + int64_t(seq) * p.table_stride;
      bad = block_any(bad || table_range_bad(p, row, 0, bad ? 0 : ctx, NT));
    }
    if (bad) {  // rows [cu0, cu1) clipped to q; the last query block also takes rows past the grid
      count_error(p, true);
      const int64_t lo = min(max(cu0, 0), p.num_tokens), hi = max(lo, int64_t(min(cu1, p.num_tokens)));
      const int64_t r0 = lo + row0;
      const int64_t r1 = mb == p.num_m_blocks - 1 ? hi : min(hi, r0 + 16 * HT);
      write_nan_rows<QT, D>(p, r0, r1, q_head0, NT);
      return;
    }
    nrows = min(16 * HT, lq - row0);
    prefix = ctx - lq;
    q_tok0 = cu0;
    kbeg = 0;
    kend = min(ctx, prefix + row0 + nrows);  // last row sees keys <= prefix + row0 + nrows - 1
  }
  const int nchunks = kend > kbeg ? (kend - kbeg + T - 1) / T : 0;
  const bool wave_active = rt * 16 < nrows;

  // Last visible key of each accumulator row of this lane (-1: row masked / not present).
  int lim[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const int x = rt * 16 + acc_x(lane, 2 * r);
    lim[r] = x >= nrows ? -1 : (kDecode ? ctx - 1 : prefix + row0 + x);
  }

  const float kscale = p.k_scale ? p.k_scale[kv_head] : 1.f;
  const float c = p.scale_log2 * kscale;  // logits in log2 units: s * c

  // ---- Q fragments (rows x k = D), zero rows past nrows ------------------------------------
  Frag qf[Cfg::kDTiles];  // (16, D)
  {
    const uint16_t* qb = static_cast<const uint16_t*>(p.q);
#pragma unroll
    for (int r = 0; r < kFragRegs; ++r) {
      const int x = rt * 16 + frag_row(lane, r);
      const bool ok = x < nrows;
      const int64_t off = kDecode
          ? int64_t(seq) * p.q_stride_tok + int64_t(q_head0 + x) * p.q_stride_head
          : int64_t(q_tok0 + row0 + x) * p.q_stride_tok + int64_t(q_head0) * p.q_stride_head;
#pragma unroll
      for (int kk = 0; kk < Cfg::kDTiles; ++kk) {
        qf[kk].r[r] = ok ? *reinterpret_cast<const uint32_t*>(qb + off + 16 * kk + frag_k(lane, r))
                         : 0u;
      }
    }
  }

  // ---- This sequence's table row and K/V caches at its KV head ----------------------------
  const int* table = p.block_table + int64_t(seq) * p.table_stride;
  const char* kb = static_cast<const char*>(p.k_cache) + int64_t(kv_head) * p.k_stride_head * KVT::kBytes;
  const char* vb = static_cast<const char*>(p.v_cache) + int64_t(kv_head) * p.v_stride_head * KVT::kBytes;

  // ---- Softmax state and accumulators --------------------------------------------------------
  float m[kRows], l[kRows];  // running max (log2 units) and this lane's partial sum
#pragma unroll
  for (int r = 0; r < kRows; ++r) m[r] = kNegInf, l[r] = 0.f;
  Acc o[Cfg::kDTiles];  // (16, D): x = row, y = d
#pragma unroll
  for (int n = 0; n < Cfg::kDTiles; ++n) zero(o[n]);

  // Phases 3-4 on one KV tile starting at key c0. kfrag(tb, kk): K operand (16 tokens from tile
  // row tb, 16 d from 16 kk); vfrag(tb, n): V^T operand (16 d from 16 n, 16 tokens from tb).
  auto consume = [&](const int c0, auto&& kfrag, auto&& vfrag) {
    if (wave_active) {
      // Phase 3: S = Q K^T over this wave's token tiles; mask; online softmax (exp2 domain).
      Acc s[Cfg::kTokTiles];  // (16 rows, 16 tokens) each
#pragma unroll
      for (int tt = 0; tt < Cfg::kTokTiles; ++tt) {
        const int tb = (ts * Cfg::kTokTiles + tt) * 16;
        zero(s[tt]);
#pragma unroll
        for (int kk = 0; kk < Cfg::kDTiles; ++kk) mma_nt<QT>(s[tt], qf[kk], kfrag(tb, kk));
      }
      float mx[kRows];
#pragma unroll
      for (int r = 0; r < kRows; ++r) mx[r] = kNegInf;
#pragma unroll
      for (int tt = 0; tt < Cfg::kTokTiles; ++tt) {
        const int tb = c0 + (ts * Cfg::kTokTiles + tt) * 16;
#pragma unroll
        for (int i = 0; i < kAccSlots; ++i) {
          const int j = tb + acc_y(lane, i);
          const float v = j <= lim[acc_row(i)] ? s[tt].v[i] * c : kNegInf;
          s[tt].v[i] = v;
          mx[acc_row(i)] = fmax(mx[acc_row(i)], v);
        }
      }
      float corr[kRows], mu[kRows];
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const float mn = fmax(m[r], reduce_y_max(mx[r]));
        mu[r] = mn == kNegInf ? 0.f : mn;  // an all-masked row keeps p = 0, not NaN
        corr[r] = exp2(m[r] - mu[r]);
        m[r] = mn;
        l[r] *= corr[r];
      }
      Frag pf[Cfg::kTokTiles];
#pragma unroll
      for (int tt = 0; tt < Cfg::kTokTiles; ++tt) {
#pragma unroll
        for (int i = 0; i < kAccSlots; ++i) {
          const float e = exp2(s[tt].v[i] - mu[acc_row(i)]);
          s[tt].v[i] = e;
          l[acc_row(i)] += e;
        }
        pf[tt] = acc_to_frag<QT>(s[tt]);  // (16 rows, 16 tokens in acc_y order)
      }
      // Phase 4: O = O * corr + P V.
#pragma unroll
      for (int n = 0; n < Cfg::kDTiles; ++n) {
#pragma unroll
        for (int i = 0; i < kAccSlots; ++i) o[n].v[i] *= corr[acc_row(i)];
#pragma unroll
        for (int tt = 0; tt < Cfg::kTokTiles; ++tt)
          mma_nt<QT>(o[n], pf[tt], vfrag((ts * Cfg::kTokTiles + tt) * 16, n));
      }
    }
  };

  if constexpr (Cfg::kPipe) {
#if PK_PIPE_ENABLED
    pipelined_tile_loop<Cfg>(p, Ks, table, kb, vb, ctx, kbeg, nchunks, consume);
#endif
  } else {
    register_tile_loop<Cfg>(p, Ks, Vs, table, kb, vb, ctx, kbeg, nchunks, consume);
  }

  // ---- Merge the token slices of each row tile through LDS ------------------------------------
#pragma unroll
  for (int r = 0; r < kRows; ++r) l[r] = reduce_y_sum(l[r]);
  float big_m[kRows], big_l[kRows];
  if constexpr (Cfg::kTokSplit > 1) {
    if ((kRows == 1 ? lane < 16 : (lane & 3) == 0)) {
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        red_m[wave][acc_x(lane, 2 * r)] = m[r];
        red_l[wave][acc_x(lane, 2 * r)] = l[r];
      }
    }
    __syncthreads();
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int x = acc_x(lane, 2 * r);
      float mm = kNegInf;
#pragma unroll
      for (int t = 0; t < Cfg::kTokSplit; ++t) mm = fmax(mm, red_m[t * HT + rt][x]);
      const float mu = mm == kNegInf ? 0.f : mm;
      float ll = 0.f;
#pragma unroll
      for (int t = 0; t < Cfg::kTokSplit; ++t)
        ll += red_l[t * HT + rt][x] * exp2(red_m[t * HT + rt][x] - mu);
      const float f = exp2(m[r] - mu);
#pragma unroll
      for (int n = 0; n < Cfg::kDTiles; ++n)
#pragma unroll
        for (int i = 0; i < kAccSlots; ++i)
          if (acc_row(i) == r) o[n].v[i] *= f;
      big_m[r] = mm;
      big_l[r] = ll;
    }
    if (ts > 0) {
      float* dst = red_o + ((ts - 1) * HT + rt) * 16 * D;
#pragma unroll
      for (int n = 0; n < Cfg::kDTiles; ++n)
#pragma unroll
        for (int i = 0; i < kAccSlots; ++i)
          dst[acc_x(lane, i) * D + 16 * n + acc_y(lane, i)] = o[n].v[i];
    }
    __syncthreads();
    if (ts > 0) return;
#pragma unroll
    for (int t = 1; t < Cfg::kTokSplit; ++t) {
      const float* src = red_o + ((t - 1) * HT + rt) * 16 * D;
#pragma unroll
      for (int n = 0; n < Cfg::kDTiles; ++n)
#pragma unroll
        for (int i = 0; i < kAccSlots; ++i)
          o[n].v[i] += src[acc_x(lane, i) * D + 16 * n + acc_y(lane, i)];
    }
  } else {
#pragma unroll
    for (int r = 0; r < kRows; ++r) big_m[r] = m[r], big_l[r] = l[r];
  }
  if (!wave_active) return;

  // ---- Epilogue: normalise and write -------------------------------------------------------
  // The partition state (o * v_scale, big_m, big_l) goes to the combine; a direct write is its
  // one-partition merge, (o * v_scale) / big_l, rounded as the combine rounds it.
  const float vscale = p.v_scale ? p.v_scale[kv_head] : 1.f;
  float inv[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) inv[r] = bad ? nan_f32() : big_l[r] > 0.f ? 1.f / big_l[r] : 0.f;
  const bool direct = !kDecode || p.max_partitions == 1;
#pragma unroll
  for (int i = 0; i < kAccSlots; ++i) {
    const int x = rt * 16 + acc_x(lane, i);
    if (x >= nrows) continue;
    const int head = kDecode ? q_head0 + x : q_head0;
    const int64_t tok = kDecode ? seq : q_tok0 + row0 + x;
    const float sc = inv[acc_row(i)];
    if (direct) {
      uint16_t* ob = static_cast<uint16_t*>(p.out) + tok * p.o_stride_tok + head * p.o_stride_head;
#pragma unroll
      for (int n = 0; n < Cfg::kDTiles; ++n)
        ob[16 * n + acc_y(lane, i)] = from_float(QT{}, __fmul_rn(o[n].v[i], vscale) * sc);
    } else {
      float* tb = p.tmp_out + ((int64_t(seq) * p.num_q_heads + head) * p.max_partitions + part) * D;
#pragma unroll
      for (int n = 0; n < Cfg::kDTiles; ++n) tb[16 * n + acc_y(lane, i)] = __fmul_rn(o[n].v[i], vscale);
    }
  }
  // Row statistics: one lane per row writes them.
  if ((kRows == 1 ? lane < 16 : (lane & 3) == 0)) {
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int x = rt * 16 + acc_x(lane, 2 * r);
      if (x >= nrows) continue;
      const int head = kDecode ? q_head0 + x : q_head0;
      const int64_t tok = kDecode ? seq : q_tok0 + row0 + x;
      if (direct) {
        if (p.lse) p.lse[tok * p.num_q_heads + head] = bad ? nan_f32() : lse_of(big_m[r], big_l[r]);
      } else {  // a NaN max marks the partition bad for the combine
        const int64_t at = (int64_t(seq) * p.num_q_heads + head) * p.max_partitions + part;
        p.max_logits[at] = bad ? nan_f32() : big_m[r];
        p.exp_sums[at] = big_l[r];
      }
    }
  }
}

}  // namespace pk

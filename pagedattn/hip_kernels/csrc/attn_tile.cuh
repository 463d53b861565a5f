// attn_tile.cuh: the per-tile math and the end-of-work steps that every attention kernel shares
// (attn_kernel.cuh: register path, extend; decode_pipe.cuh: the NVIDIA persistent decode).
//
//   RowState      one wave's softmax state: running max m (log2 units), this lane's partial
//                 row sums l, output accumulator o (16 rows x D)
//   load_q        the wave's 16 query rows as MMA operand fragments (zero rows past nrows)
//   consume_tile  phases 3-4 on one KV tile: S = Q K^T, mask, online softmax, O = O * corr + P V
//   merge_slices  the waves that share a row tile (token slices) merged through shared memory
//   write_rows    normalise; write out/lse, or one split-KV partition's state
//
// Torch-free: compiled by the JIT build and, standalone, by csrc/compile_check.
#pragma once

#include "attn_params.h"
#include "pk_mma.h"

namespace pk {

template <int DTILES>
struct RowState {
  float m[kRows], l[kRows];
  Acc o[DTILES];  // (16, D): x = row, y = d

  PK_DEVICE void reset() {
#pragma unroll
    for (int r = 0; r < kRows; ++r) m[r] = kNegInf, l[r] = 0.f;
#pragma unroll
    for (int n = 0; n < DTILES; ++n) zero(o[n]);
  }
};

// Query rows rt*16 .. +15 of one work item. Decode (rows_are_heads): row x is head head0 + x of
// token tok0; extend: token tok0 + x of head head0. Rows >= nrows are zero.
template <class Cfg>
PK_DEVICE void load_q(Frag (&qf)[Cfg::kDTiles], const AttnParams& p, int64_t tok0, int head0,
                      bool rows_are_heads, int nrows, int rt, int lane) {
  const uint16_t* qb = static_cast<const uint16_t*>(p.q);
#pragma unroll
  for (int r = 0; r < kFragRegs; ++r) {
    const int x = rt * 16 + frag_row(lane, r);
    const bool ok = x < nrows;
    const int64_t off = rows_are_heads
        ? tok0 * p.q_stride_tok + int64_t(head0 + x) * p.q_stride_head
        : (tok0 + x) * p.q_stride_tok + int64_t(head0) * p.q_stride_head;
#pragma unroll
    for (int kk = 0; kk < Cfg::kDTiles; ++kk)
      qf[kk].r[r] =
          ok ? *reinterpret_cast<const uint32_t*>(qb + off + 16 * kk + frag_k(lane, r)) : 0u;
  }
}

// Phases 3-4 on the KV tile starting at key c0, over this wave's token slice ts (kTokTiles
// 16-token tiles). lim[r]: last visible key of the lane's accumulator row r (-1: none);
// c = softmax scale * log2(e) (* k_scale). kfrag(tb, kk): K operand (16 tokens from tile row tb,
// 16 d from 16 kk); vfrag(tb, n): V^T operand (16 d from 16 n, 16 tokens from tb).
// MASK = false: the caller knows every key of the tile is visible to every row it will write
// (rows past the group then carry finite garbage that is never written). LAZY: skip O *= corr
// when no row of the wave raised its max (corr == 1 exactly: the same bits).
template <class Cfg, bool MASK = true, bool LAZY = false, class KF, class VF>
PK_DEVICE void consume_tile(RowState<Cfg::kDTiles>& st, const Frag (&qf)[Cfg::kDTiles], int c0,
                            const int (&lim)[kRows], float c, int ts, int lane, KF&& kfrag,
                            VF&& vfrag) {
  using QT = typename Cfg::QT;
  constexpr int TT = Cfg::kTokTiles;
  // Phase 3: S = Q K^T; mask; online softmax in the exp2 domain.
  Acc s[TT];  // (16 rows, 16 tokens) each
#pragma unroll
  for (int tt = 0; tt < TT; ++tt) {
    const int tb = (ts * TT + tt) * 16;
    zero(s[tt]);
#pragma unroll
    for (int kk = 0; kk < Cfg::kDTiles; ++kk) mma_nt<QT>(s[tt], qf[kk], kfrag(tb, kk));
  }
  float mx[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) mx[r] = kNegInf;
#pragma unroll
  for (int tt = 0; tt < TT; ++tt) {
    const int tb = c0 + (ts * TT + tt) * 16;
#pragma unroll
    for (int i = 0; i < kAccSlots; ++i) {
      const int j = tb + acc_y(lane, i);
      const float v = !MASK || j <= lim[acc_row(i)] ? s[tt].v[i] * c : kNegInf;
      s[tt].v[i] = v;
      mx[acc_row(i)] = fmax(mx[acc_row(i)], v);
    }
  }
  float corr[kRows], mu[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const float mn = fmax(st.m[r], reduce_y_max(mx[r]));
    mu[r] = mn == kNegInf ? 0.f : mn;  // an all-masked row keeps p = 0, not NaN
    corr[r] = exp2(st.m[r] - mu[r]);
    st.m[r] = mn;
    st.l[r] *= corr[r];
  }
  Frag pf[TT];
#pragma unroll
  for (int tt = 0; tt < TT; ++tt) {
#pragma unroll
    for (int i = 0; i < kAccSlots; ++i) {
      const float e = exp2(s[tt].v[i] - mu[acc_row(i)]);
      s[tt].v[i] = e;
      st.l[acc_row(i)] += e;
    }
    pf[tt] = acc_to_frag<QT>(s[tt]);  // (16 rows, 16 tokens in acc_y order)
  }
  // Phase 4: O = O * corr + P V.
  bool same = LAZY;
#pragma unroll
  for (int r = 0; r < kRows; ++r) same = same && corr[r] == 1.f;
  if (!LAZY || !all_lanes(same)) {
#pragma unroll
    for (int n = 0; n < Cfg::kDTiles; ++n)
#pragma unroll
      for (int i = 0; i < kAccSlots; ++i) st.o[n].v[i] *= corr[acc_row(i)];
  }
#pragma unroll
  for (int n = 0; n < Cfg::kDTiles; ++n)
#pragma unroll
    for (int tt = 0; tt < TT; ++tt) mma_nt<QT>(st.o[n], pf[tt], vfrag((ts * TT + tt) * 16, n));
}

// Merge the kTokSplit token slices of every row tile into its wave with ts == 0, which then holds
// o on the common max and gets the rows' (big_m, big_l); in the other waves those are not
// meaningful. Every wave of the block calls it (two barriers). scratch: kRedBytes of shared
// memory that nobody reads after the first barrier until the caller's next barrier (the buffer
// of the tile just consumed); red_m / red_l: [kWaves][16].
template <class Cfg>
PK_DEVICE void merge_slices(RowState<Cfg::kDTiles>& st, float* scratch, float (*red_m)[16],
                            float (*red_l)[16], int wave, int ts, int rt, int lane,
                            float (&big_m)[kRows], float (&big_l)[kRows]) {
  constexpr int D = Cfg::D, HT = Cfg::kHeadTiles, TS = Cfg::kTokSplit;
#pragma unroll
  for (int r = 0; r < kRows; ++r) st.l[r] = reduce_y_sum(st.l[r]);
  if constexpr (TS == 1) {
#pragma unroll
    for (int r = 0; r < kRows; ++r) big_m[r] = st.m[r], big_l[r] = st.l[r];
  } else {
    __syncthreads();  // the last tile is consumed everywhere: scratch and red_* are free
    if ((kRows == 1 ? lane < 16 : (lane & 3) == 0)) {
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        red_m[wave][acc_x(lane, 2 * r)] = st.m[r];
        red_l[wave][acc_x(lane, 2 * r)] = st.l[r];
      }
    }
    if (ts > 0) {
      float* dst = scratch + ((ts - 1) * HT + rt) * 16 * D;  // (16, D) per (slice, row tile)
#pragma unroll
      for (int n = 0; n < Cfg::kDTiles; ++n)
#pragma unroll
        for (int i = 0; i < kAccSlots; ++i)
          dst[acc_x(lane, i) * D + 16 * n + acc_y(lane, i)] = st.o[n].v[i];
    }
    __syncthreads();
    if (ts > 0) return;
    float f[TS][kRows];  // slice t's factor onto the common max, per row of this lane
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int x = acc_x(lane, 2 * r);
      float mm = kNegInf;
#pragma unroll
      for (int t = 0; t < TS; ++t) mm = fmax(mm, red_m[t * HT + rt][x]);
      const float mu = mm == kNegInf ? 0.f : mm;
      float ll = 0.f;
#pragma unroll
      for (int t = 0; t < TS; ++t) {
        f[t][r] = exp2(red_m[t * HT + rt][x] - mu);
        ll += red_l[t * HT + rt][x] * f[t][r];
      }
      big_m[r] = mm;
      big_l[r] = ll;
    }
#pragma unroll
    for (int n = 0; n < Cfg::kDTiles; ++n)
#pragma unroll
      for (int i = 0; i < kAccSlots; ++i) {
        const int r = acc_row(i), at = acc_x(lane, i) * D + 16 * n + acc_y(lane, i);
        float v = st.o[n].v[i] * f[0][r];
#pragma unroll
        for (int t = 1; t < TS; ++t) v += scratch[((t - 1) * HT + rt) * 16 * D + at] * f[t][r];
        st.o[n].v[i] = v;
      }
  }
}

// Normalise and write the rows of a row tile: out (+ lse) when direct, else partition `part`'s
// state (tmp_out, max_logits, exp_sums). Row x: decode (rows_are_heads) head head0 + x of token
// tok0; extend token tok0 + x of head head0.
template <class Cfg>
PK_DEVICE void write_rows(const AttnParams& p, const RowState<Cfg::kDTiles>& st,
                          const float (&big_m)[kRows], const float (&big_l)[kRows], int rt,
                          int lane, int nrows, int64_t tok0, int head0, bool rows_are_heads,
                          bool direct, int part, float vscale) {
  using QT = typename Cfg::QT;
  constexpr int D = Cfg::D;
  float inv[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) inv[r] = big_l[r] > 0.f ? vscale / big_l[r] : 0.f;
#pragma unroll
  for (int i = 0; i < kAccSlots; ++i) {
    const int x = rt * 16 + acc_x(lane, i);
    if (x >= nrows) continue;
    const int head = rows_are_heads ? head0 + x : head0;
    const int64_t tok = rows_are_heads ? tok0 : tok0 + x;
    const float sc = inv[acc_row(i)];
    if (direct) {
      uint16_t* ob = static_cast<uint16_t*>(p.out) + tok * p.o_stride_tok + head * p.o_stride_head;
#pragma unroll
      for (int n = 0; n < Cfg::kDTiles; ++n)
        ob[16 * n + acc_y(lane, i)] = from_float(QT{}, st.o[n].v[i] * sc);
    } else {
      float* tb = p.tmp_out + ((tok * p.num_q_heads + head) * p.max_partitions + part) * D;
#pragma unroll
      for (int n = 0; n < Cfg::kDTiles; ++n) tb[16 * n + acc_y(lane, i)] = st.o[n].v[i] * sc;
    }
  }
  // Row statistics: one lane per row writes them.
  if ((kRows == 1 ? lane < 16 : (lane & 3) == 0)) {
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int x = rt * 16 + acc_x(lane, 2 * r);
      if (x >= nrows) continue;
      const int head = rows_are_heads ? head0 + x : head0;
      const int64_t tok = rows_are_heads ? tok0 : tok0 + x;
      if (direct) {
        if (p.lse)
          p.lse[tok * p.num_q_heads + head] =
              big_l[r] > 0.f ? (big_m[r] + log2_(big_l[r])) * 0.69314718055994531f : kNegInf;
      } else {
        const int64_t at = (tok * p.num_q_heads + head) * p.max_partitions + part;
        p.max_logits[at] = big_m[r];
        p.exp_sums[at] = big_l[r];
      }
    }
  }
}

}  // namespace pk

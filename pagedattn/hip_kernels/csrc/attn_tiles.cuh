// attn_tiles.cuh: attn_kernel's register tile loop (AMD/Hygon, fp8 caches, extend), phases 1-2
// of attn_kernel.cuh: each KV tile is prefetched global -> registers (16-byte loads from
// per-page bases advanced by k_delta / v_delta, pk_kvload.h) while the previous one is
// consumed, then converted into LDS: K as [T][D] rows, V transposed to [D][T] (MMAC: kperm'd
// columns), both in the query's 16-bit type. Torch-free.
#pragma once

#include "attn_cfg.h"
#include "pk_kvload.h"

namespace pk {

// Keys [kbeg, kbeg + nchunks * T) of one sequence (table: its block-table row; kb, vb: the K/V
// caches at its KV head), tile by tile: consume(c0, kfrag, vfrag) runs phases 3-4 on the tile
// of keys c0.., reading operands through kfrag(tb, kk) / vfrag(tb, n). Every thread calls it.
template <class Cfg, class Consume>
PK_DEVICE void register_tile_loop(const AttnParams& p, uint16_t* Ks, uint16_t* Vs,
                                  const int* table, const char* kb, const char* vb, int ctx,
                                  int kbeg, int nchunks, Consume&& consume) {
  using QT = typename Cfg::QT;
  using KVT = typename Cfg::KVT;
  constexpr int D = Cfg::D, T = Cfg::T, NT = Cfg::kThreads;
  constexpr int KS = Cfg::kKStride, VS = Cfg::kVStride, EPV = Cfg::kEpv;
  constexpr bool kFp8 = KVT::kBytes == 1;
  const int tid = threadIdx.x, lane = lane_id();

  // ---- KV cursor: one 64-bit base per page-subtile, advanced by deltas ------------------------
  const int page = p.page_size;
  const int st = page < T ? page : T;  // subtile rows: one page or the whole tile
  int64_t kbase[Cfg::kMaxSub], vbase[Cfg::kMaxSub];  // element offsets (wave-uniform)
  int prev_blk[Cfg::kMaxSub], prev_off[Cfg::kMaxSub];
  static_for<Cfg::kMaxSub>([&](auto S) {
    kbase[S] = vbase[S] = 0;
    prev_blk[S] = prev_off[S] = 0;
  });

  auto advance = [&](int c0) {
    static_for<Cfg::kMaxSub>([&](auto S) {
      constexpr int s = decltype(S)::value;
      const int tok = c0 + s * st;
      if (s * st < T && tok < ctx) {
        const int blk = uniform(table[tok / page]);
        const int off = tok & (page - 1);
        const int64_t table_diff = blk - prev_blk[s], offset_diff = off - prev_off[s];
        kbase[s] += table_diff * p.k_stride_block + offset_diff * p.k_stride_token;  // k_delta
        vbase[s] += table_diff * p.v_stride_block + offset_diff * p.v_stride_token;  // v_delta
        prev_blk[s] = blk;
        prev_off[s] = off;
      }
    });
  };
  auto pick = [&](const int64_t (&b)[Cfg::kMaxSub], int s) {  // b[s] for a runtime s
    int64_t r = b[0];
    static_for<Cfg::kMaxSub>([&](auto J) { r = (s == J) ? b[J] : r; });
    return uniform64(r);
  };

  vec16 kreg[Cfg::kUnits], vreg[Cfg::kUnits];
  auto fetch = [&](int c0) {
    advance(c0);
    constexpr int VPR = D / EPV;  // 16-byte vectors per K row
#pragma unroll
    for (int u = 0; u < Cfg::kUnits; ++u) {
      const int idx = u * NT + tid;
      const int row = idx / VPR, vec = idx % VPR;
      const int s = uniform(row / st);  // a wave's rows lie in one page (page >= 16)
      const int voff = int((row % st) * p.k_stride_token + vec * EPV) * KVT::kBytes;
      kreg[u] = load16(kb + pick(kbase, s) * KVT::kBytes, voff, c0 + row < ctx);
    }
#pragma unroll
    for (int u = 0; u < Cfg::kUnits; ++u) {
      const int idx = u * NT + tid;
      if constexpr (!Cfg::kVTrans) {
        const int row = idx / VPR, vec = idx % VPR;
        const int s = uniform(row / st);
        const int voff = int((row % st) * p.v_stride_token + vec * EPV) * KVT::kBytes;
        vreg[u] = load16(vb + pick(vbase, s) * KVT::kBytes, voff, c0 + row < ctx);
      } else {  // V is [D][page]: a wave reads consecutive d of one token vector
        const int tv = idx / D, d = idx % D;
        const int t0 = tv * EPV;
        const int s = uniform(t0 / st);
        const int voff = int(d * p.v_stride_dim + (t0 % st) * p.v_stride_token) * KVT::kBytes;
        vreg[u] = load16(vb + pick(vbase, s) * KVT::kBytes, voff, c0 + t0 < ctx);
      }
    }
  };

  auto store = [&](int c0) {
    constexpr int VPR = D / EPV;
#pragma unroll
    for (int u = 0; u < Cfg::kUnits; ++u) {
      const int idx = u * NT + tid;
      const int row = idx / VPR, vec = idx % VPR;
      uint32_t w[EPV / 2];
      if constexpr (kFp8) {
        fp8x16_to_16bit<QT, KVT>(kreg[u], *reinterpret_cast<uint32_t(*)[8]>(w));
      } else {
#pragma unroll
        for (int j = 0; j < 4; ++j) w[j] = kreg[u].w[j];
      }
#pragma unroll
      for (int j = 0; j < EPV / 8; ++j)
        *reinterpret_cast<vec16*>(Ks + row * KS + vec * EPV + 8 * j) =
            vec16{{w[4 * j], w[4 * j + 1], w[4 * j + 2], w[4 * j + 3]}};
    }
#pragma unroll
    for (int u = 0; u < Cfg::kUnits; ++u) {
      const int idx = u * NT + tid;
      uint32_t w[EPV / 2];
      if constexpr (kFp8) {
        fp8x16_to_16bit<QT, KVT>(vreg[u], *reinterpret_cast<uint32_t(*)[8]>(w));
      } else {
#pragma unroll
        for (int j = 0; j < 4; ++j) w[j] = vreg[u].w[j];
      }
      if constexpr (!Cfg::kVTrans) {  // transpose: EPV values of one token -> EPV rows of V^T
        const int row = idx / VPR, vec = idx % VPR;
        const int col = tok_col(row);
#pragma unroll
        for (int e = 0; e < EPV; ++e) {
          const int d = vec * EPV + e;
          Vs[d * VS + (col ^ vswz(d))] = half_of(w, e);
        }
      } else {  // EPV tokens of one d; zero the tokens past ctx (their memory is not ours)
        const int tv = idx / D, d = idx % D, t0 = tv * EPV;
#pragma unroll
        for (int e = 0; e < EPV; ++e) {
          const uint16_t h = (c0 + t0 + e < ctx) ? half_of(w, e) : uint16_t(0);
          Vs[d * VS + (tok_col(t0 + e) ^ vswz(d))] = h;
        }
      }
    }
  };

    // ---- register path: tile ci+1 prefetched global -> regs while tile ci is consumed ------
    auto kfrag = [&](int tb, int kk) {
      Frag kf;  // (16 tokens, 16 d)
#pragma unroll
      for (int r = 0; r < kFragRegs; ++r)
        kf.r[r] = *reinterpret_cast<const uint32_t*>(Ks + (tb + frag_row(lane, r)) * KS + 16 * kk +
                                                     frag_k(lane, r));
      return kf;
    };
    auto vfrag = [&](int tb, int n) {
      Frag vf;  // (16 d, 16 tokens), token order matches pf via tok_col
#pragma unroll
      for (int r = 0; r < kFragRegs; ++r) {
        const int d = 16 * n + frag_row(lane, r);
        vf.r[r] = *reinterpret_cast<const uint32_t*>(Vs + d * VS + ((tb + frag_k(lane, r)) ^ vswz(d)));
      }
      return vf;
    };
    if (nchunks > 0) fetch(kbeg);
    for (int ci = 0; ci < nchunks; ++ci) {
      const int c0 = kbeg + ci * T;
      // Phase 1: regs -> LDS (the barrier that ended the previous iteration freed the tile).
      store(c0);
      __syncthreads();
      // Phase 2: prefetch the next tile while this one is consumed.
      if (ci + 1 < nchunks) fetch(c0 + T);
      consume(c0, kfrag, vfrag);
      __syncthreads();
    }
}

}  // namespace pk

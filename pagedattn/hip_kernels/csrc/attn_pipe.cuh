// attn_pipe.cuh: attn_kernel's NVIDIA decode pipeline (16-bit caches), replacing phases 1-2 of
// attn_kernel.cuh: a kStages-deep cp.async pipeline straight into dynamic shared memory (no
// register staging); tile i+kStages-1 is in flight while tile i is consumed. K as [T][D], V as
// [T][D] (hcu: its cache layout [D][T]); fragments are read with ldmatrix (.trans for V [T][D]).
// Torch-free.
#pragma once

#include "attn_cfg.h"

#if PK_PIPE_ENABLED
namespace pk {

// As register_tile_loop (attn_tiles.cuh), with the tiles in Ks's kStages stages.
template <class Cfg, class Consume>
PK_DEVICE void pipelined_tile_loop(const AttnParams& p, uint16_t* Ks, const int* table,
                                   const char* kb, const char* vb, int ctx, int kbeg,
                                   int nchunks, Consume&& consume) {
  constexpr int D = Cfg::D, T = Cfg::T, NT = Cfg::kThreads, KS = Cfg::kKStride;
  const int tid = threadIdx.x, lane = lane_id();
  const int page = p.page_size;
  // ---- cp.async pipeline: stage (ci % kStages) holds tile ci ------------------------------
  constexpr int NS = Cfg::kStages, SE = Cfg::kStageElems, VTS = Cfg::kVtStride;
  constexpr int VPR = D / 8;      // 16-byte vectors per K/V row
  constexpr int RPU = NT / VPR;   // rows one pass of the block covers
  constexpr int TVR = T / 8;      // hcu: 16-byte token vectors per V^T row
  constexpr int DPU = NT / TVR;   // hcu: V^T rows one pass covers
  static_assert(NT % VPR == 0 && Cfg::kUnits * RPU == T, "K/V copies cover the tile once");
  static_assert(NT % TVR == 0 && Cfg::kUnits * DPU == D, "V^T copies cover the tile once");
  const int lg_page = __ffs(page) - 1, pmask = page - 1;
  const int vec = tid % VPR, row0 = tid / VPR;         // this thread's column / first row
  const int tv0 = (tid % TVR) * 8, drow0 = tid / TVR;  // hcu: its token vector / first d row
  // Byte strides; in-page offsets fit 32 bits, the page term is 64-bit.
  const uint64_t ksb = p.k_stride_block * 2, vsb = p.v_stride_block * 2;
  const int kst = int(p.k_stride_token) * 2, vst = int(p.v_stride_token) * 2;
  const int vsd = int(p.v_stride_dim) * 2;

  // Table entries of this thread's rows of the next tile to issue, loaded one issue ahead so
  // that no copy waits on a table read. 0 for rows past ctx or the partition: their copies
  // read nothing, and their (unused) source address stays inside block 0.
  uint32_t nblk[Cfg::kUnits];  // K (and V) rows u * RPU + row0
  uint32_t nvblk = 0;          // hcu V: the token vector tv0
  const int* trow = table;
  asm volatile("" : "+l"(trow));  // keep the row pointer in registers (no per-load rebuild)
  auto load_blocks = [&](int ci) {
    const int c0 = kbeg + ci * T;
#pragma unroll
    for (int u = 0; u < Cfg::kUnits; ++u) {
      const int tok = c0 + u * RPU + row0;
      nblk[u] = ci < nchunks && tok < ctx ? trow[tok >> lg_page] : 0;
    }
    if constexpr (Cfg::kVTrans) {
      const int tok = c0 + tv0;
      nvblk = ci < nchunks && tok < ctx ? trow[tok >> lg_page] : 0;
    }
  };

  // Copy tile ci (keys kbeg + ci*T ..) into stage `st`, then read the table for tile ci+1.
  // Keys past ctx become zeros (0 source bytes: their memory, possibly poisoned, and their
  // table entries are never read). Tiles start at multiples of 64 and pages are powers of
  // 2 >= 16, so a 16-byte vector never straddles a page.
  auto issue = [&](int ci, int st) {
    const int c0 = kbeg + ci * T;
    uint16_t* ks = Ks + st * SE;  // (T, KS)
    uint16_t* vs = ks + T * KS;   // (T, KS), hcu (D, VTS)
#pragma unroll
    for (int u = 0; u < Cfg::kUnits; ++u) {
      const int row = u * RPU + row0, tok = c0 + row;
      const bool ok = tok < ctx;
      const int off = tok & pmask;
      if constexpr (Cfg::kSwz) {
        const int so = Cfg::kv_off(row, vec);
        cp_async16(ks + so, kb + nblk[u] * ksb + (off * kst + vec * 16), ok ? 16 : 0);
        if constexpr (!Cfg::kVTrans)
          cp_async16(vs + so, vb + nblk[u] * vsb + (off * vst + vec * 16), ok ? 16 : 0);
      } else {
        cp_async16(ks + row * KS + vec * 8, kb + nblk[u] * ksb + (off * kst + vec * 16),
                   ok ? 16 : 0);
        if constexpr (!Cfg::kVTrans)
          cp_async16(vs + row * KS + vec * 8, vb + nblk[u] * vsb + (off * vst + vec * 16),
                     ok ? 16 : 0);
      }
    }
    if constexpr (Cfg::kVTrans) {  // 8 tokens of one d: contiguous, within one page
      const int tok = c0 + tv0;
      const bool ok = tok < ctx;
      const char* vsrc = vb + nvblk * vsb + (tok & pmask) * vst;
      const int nbytes = ok ? min(16, 2 * (ctx - tok)) : 0;  // partial vector: zero the tail
#pragma unroll
      for (int u = 0; u < Cfg::kUnits; ++u) {
        const int d = u * DPU + drow0;
        cp_async16(vs + d * VTS + tv0, vsrc + d * vsd, nbytes);
      }
    }
    load_blocks(ci + 1);
  };

  // Prologue: tiles 0 .. NS-2 in flight. Every iteration commits one group (possibly empty),
  // so "group ci complete" is always wait_group<NS-2> after NS-1+ci commits.
  load_blocks(0);
#pragma unroll
  for (int i = 0; i < NS - 1; ++i) {
    if (i < nchunks) issue(i, i);
    cp_async_commit();
  }
  int rd = 0, wr = NS - 1;  // stage of tile ci, stage of tile ci + NS - 1
  for (int ci = 0; ci < nchunks; ++ci) {
    cp_async_wait<NS - 2>();  // this thread's copies of tile ci have landed
    // Everyone's copies of tile ci are visible, and everyone has finished tile ci-1, whose
    // stage (wr) is refilled next.
    __syncthreads();
    if (ci + NS - 1 < nchunks) issue(ci + NS - 1, wr);
    cp_async_commit();
    const uint16_t* ks = Ks + rd * SE;
    const uint16_t* vs = ks + T * KS;
    consume(
        kbeg + ci * T,
        [&](int tb, int kk) {
          if constexpr (Cfg::kSwz) {
            return ldsm_rows(ks, [&](int r, int c) { return Cfg::kv_off(tb + r, 2 * kk + c); },
                             lane);
          } else {
            return ldsm_rows(ks + tb * KS + 16 * kk, KS, lane);
          }
        },
        [&](int tb, int n) {
          if constexpr (Cfg::kVTrans) {
            return ldsm_rows(vs + 16 * n * VTS + tb, VTS, lane);
          } else if constexpr (Cfg::kSwz) {
            return ldsm_cols(vs, [&](int r, int c) { return Cfg::kv_off(tb + r, 2 * n + c); },
                             lane);
          } else {
            return ldsm_cols(vs + tb * KS + 16 * n, KS, lane);
          }
        });
    rd = rd + 1 == NS ? 0 : rd + 1;
    wr = wr + 1 == NS ? 0 : wr + 1;
  }
  cp_async_wait<0>();  // only empty groups remain; the merge below may reuse the stages
}

}  // namespace pk
#endif

// decode_cs_cfg.h: the column-split decode's tile configuration (decode_cs.cuh holds the
// kernel). NVIDIA only. Torch-free.
#pragma once

#include "attn_kernel.cuh"
#include "pk_pipe.h"

#if PK_PIPE_ENABLED
namespace pk {

template <class QT_, int D_, bool V_TRANS_>
struct DecodeCsCfg {
  using QT = QT_;
  static constexpr int D = D_;
  static constexpr bool kVTrans = V_TRANS_;
  static constexpr int kWarps = 4, kThreads = kWarps * kWave;
  static constexpr int T = 32;                   // tokens per KV tile; 8 per warp in phase 2
  static constexpr int kDTiles = D / 16;         // 16-column tiles of Q and O
  static constexpr int kOwnTiles = kDTiles / kWarps;  // O tiles per warp (phase 4)
  // Two stages of 16 KB at D 128: 4 blocks per SM either way, and a third stage did not make
  // the H200 decode benchmark faster.
  static constexpr int kStages = 2;
  // K / V [T][D] tiles: rows of D elements, 16-byte chunk c of row r at chunk c ^ (r & 7). Each
  // 128-byte line a copy instruction fetches lands in one aligned 128-byte block of shared
  // memory, and the 8 rows an ldmatrix reads hit 8 distinct bank groups. (Rows padded to D + 8
  // straddle 128-byte blocks: the L2 then serves 1.5 sectors per DRAM sector.)
  static constexpr int kKStride = D;  // row pitch (16-bit elements)
  static PK_DEVICE int kv_off(int r, int c) { return tile_off<kKStride, true>(r, c); }
  static constexpr int kVtStride = T + 8;        // hcu V^T row pitch
  static constexpr int kPStride = T + 8;         // Ps row pitch
  static constexpr int kStageElems = T * kKStride + (kVTrans ? D * kVtStride : T * kKStride);
  static constexpr int kUnits = T * D / 8 / kThreads;  // 16-byte copies per thread (K, and V)
  static constexpr int kSmemBytes = kStages * kStageElems * 2;
  // 4 blocks (16 warps) per SM where shared memory allows (228 KB per SM, ~3 KB per block for
  // Ps, red and the reserve): every configuration at 2 stages (hcu D 128: 36 KB).
  static constexpr int kFit = 228 * 1024 / (kSmemBytes + 3 * 1024);
  static constexpr int kMinBlocks = kFit < 4 ? kFit : 4;
  static_assert(D == 64 || D == 128, "head_dim 64 or 128");
  static_assert(kOwnTiles >= 1 && kDTiles % kWarps == 0, "whole O tiles per warp");
  static_assert(kWave == 32 && T == 8 * kWarps, "8 tokens per warp");
  static_assert(kUnits >= 1 && (T * D / 8) % kThreads == 0, "whole 16-byte copies per thread");
  static_assert(kStages >= 2 && kMinBlocks >= 2, "a pipeline of >= 2 stages, >= 2 blocks");
};

}  // namespace pk
#endif

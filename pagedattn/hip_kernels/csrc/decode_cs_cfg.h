// decode_cs_cfg.h: the column-split decode's build switches, tile configuration and
// timeline stamps (decode_cs.cuh holds the kernel). Torch-free.
#pragma once

#include "attn_kernel.cuh"
#include "pk_pipe.h"

#ifndef PK_DECODE_COLSPLIT
#define PK_DECODE_COLSPLIT 1
#endif
#ifndef PK_CS_SWIZZLE
#define PK_CS_SWIZZLE 1
#endif
// Pipeline depth of the column split (stages of 16 KB at D 128; 4 blocks per SM either way).
// H200, session 7 (bench/results/2026-12-01-h200-s7): 2 stages beat 3 on 14 of the 20 decode
// rows (1-3 %; (1, 32768) 38.9 vs 40.1 us), lost 1-2 % on the two 32/32 (256, 2048) rows.
#ifndef PK_CS_STAGES
#define PK_CS_STAGES 2
#endif

// PK_TIMELINE=1 (build switch PAGEDATTN_HIP_TIMELINE=1; scripts/decode_timeline.py): thread 0
// of each block writes %globaltimer (ns) at its start, when its first tile has landed, after its
// tile loop and at its exit, and %smid, into p.timeline[block][0..4] (the Gluon kernel's layout).
#ifndef PK_TIMELINE
#define PK_TIMELINE 0
#endif

#if PK_PIPE_ENABLED && PK_DECODE_COLSPLIT
#define PK_COLSPLIT_ENABLED 1
#else
#define PK_COLSPLIT_ENABLED 0
#endif

#if PK_COLSPLIT_ENABLED
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
  static constexpr int kStages = PK_CS_STAGES;
  // K / V [T][D] tiles. Swizzled (PK_CS_SWIZZLE=1): rows of D elements, 16-byte chunk c of row
  // r at chunk c ^ (r & 7). Each 128-byte line a copy instruction fetches then lands in one
  // aligned 128-byte block of shared memory, and the 8 rows an ldmatrix reads hit 8 distinct
  // bank groups. Padded (0): rows of D + 8 elements; there the lines straddle 128-byte blocks
  // and the H200 served 1.5 L2 sectors per DRAM sector (22 M L2 requests instead of 8.4 M at
  // (64, 4096) 32/8; session 7).
  static constexpr bool kSwz = PK_CS_SWIZZLE;
  static constexpr int kKStride = kSwz ? D : D + 8;  // row pitch (16-bit elements)
  static PK_DEVICE int kv_off(int r, int c) { return tile_off<kKStride, kSwz>(r, c); }
  static constexpr int kVtStride = T + 8;        // hcu V^T row pitch
  static constexpr int kPStride = T + 8;         // Ps row pitch
  static constexpr int kStageElems = T * kKStride + (kVTrans ? D * kVtStride : T * kKStride);
  static constexpr int kUnits = T * D / 8 / kThreads;  // 16-byte copies per thread (K, and V)
  static constexpr int kSmemBytes = kStages * kStageElems * 2;
  // 4 blocks (16 warps) per SM where shared memory allows (228 KB per SM, ~3 KB per block for
  // Ps, red and the reserve); hcu D 128 (57 KB) gets 3.
  static constexpr int kFit = 228 * 1024 / (kSmemBytes + 3 * 1024);
  static constexpr int kMinBlocks = kFit < 4 ? kFit : 4;
  static_assert(D == 64 || D == 128, "head_dim 64 or 128");
  static_assert(kOwnTiles >= 1 && kDTiles % kWarps == 0, "whole O tiles per warp");
  static_assert(kWave == 32 && T == 8 * kWarps, "8 tokens per warp");
  static_assert(kUnits >= 1 && (T * D / 8) % kThreads == 0, "whole 16-byte copies per thread");
  static_assert(kStages >= 2 && kMinBlocks >= 2, "a pipeline of >= 2 stages, >= 2 blocks");
};

// Timeline stamp `slot` of this block (PK_TIMELINE builds with p.timeline set; thread 0).
PK_DEVICE void cs_stamp(const AttnParams& p, int slot) {
#if PK_TIMELINE
  if (p.timeline == nullptr || threadIdx.x != 0) return;
  int64_t* t = p.timeline +
      8 * ((int64_t(blockIdx.z) * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x);
  uint64_t ns;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
  t[slot] = static_cast<int64_t>(ns);
  if (slot == 0) {
    uint32_t sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    t[4] = sm;
  }
#endif
}

}  // namespace pk
#endif

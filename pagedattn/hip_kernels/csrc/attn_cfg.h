// attn_cfg.h: attn_kernel's tile configuration (AttnCfg: tile sizes, LDS/shared-memory layout,
// launch geometry) and the helpers its KV staging shares. Torch-free.
#pragma once

#include "attn_params.h"
#include "pk_mma.h"
#include "pk_pipe.h"

// Pipeline depth of the NVIDIA decode (attn_pipe.cuh). build.py passes -DPK_DECODE_STAGES=2 for archs
// other than sm_90/sm_100/sm_103: 3 stages take 104 KB of shared memory per block at D 128
// (2 blocks per SM on those), 2 stages 70 KB, within the 99 KB per-block limit of sm_86/89/120.
#ifndef PK_DECODE_STAGES
#define PK_DECODE_STAGES 3
#endif
#if defined(PK_CUDA)
#define PK_PIPE_ENABLED 1
#else
#define PK_PIPE_ENABLED 0
#endif

namespace pk {

enum class Mode { kDecode, kExtend };

template <class QT_, class KVT_, int D_, int HEAD_TILES_, bool V_TRANS_, Mode MODE_>
struct AttnCfg {
  using QT = QT_;    // f16 | bf16: query, output and MMA operand type
  using KVT = KVT_;  // QT, or e4m3 | e5m2
  static constexpr int D = D_;
  static constexpr int kHeadTiles = HEAD_TILES_;
  static constexpr bool kVTrans = V_TRANS_;  // V cache is [.., D, block_size] (hcu layout)
  static constexpr Mode kMode = MODE_;

  // Pipelined path (NVIDIA decode, 16-bit cache), see below.
  static constexpr bool kPipe = PK_PIPE_ENABLED && MODE_ == Mode::kDecode && KVT_::kBytes == 2;
  static constexpr int kWaves = 4;
  static constexpr int kThreads = kWaves * kWave;
  static constexpr int T = 64;                            // tokens per KV tile
  static constexpr int kTokSplit = kWaves / kHeadTiles;   // waves sharing one row tile
  static constexpr int kTokTiles = T / 16 / kTokSplit;    // 16-token tiles per wave per KV tile
  static constexpr int kDTiles = D / 16;
  static constexpr int kEpv = 16 / KVT::kBytes;           // cache elements per 16-byte load
  static constexpr int kUnits = T * D / kEpv / kThreads;  // 16-byte loads per thread (K, and V)
  // The pipeline's K (and non-hcu V) tiles: at D 128 unpadded rows with XOR-swizzled 16-byte
  // chunks (pk_pipe.h tile_off), so that each 128-byte line a cp.async fetches lands in one
  // aligned 128-byte block of shared memory; padded rows (pitch D + 8) straddle two blocks and
  // split their L2 requests. D 64 keeps padded rows: swizzled, its 2-row-tile form spilled.
  static constexpr bool kSwz = kPipe && D >= 128;
  static constexpr int kKStride = kSwz ? D : D + 8;       // LDS row pitch (16-bit elements)
  static constexpr int kVStride = T + 8;
  static constexpr int kMaxSub = T / 16;                  // page >= 16: <= 4 pages per tile
  static constexpr int kTileBytes = (T * kKStride + D * kVStride) * 2;
  static constexpr int kRedBytes = (kTokSplit - 1) * kHeadTiles * 16 * D * 4;
  static constexpr int kSmemBytes = kTileBytes > kRedBytes ? kTileBytes : kRedBytes;

  // Pipelined path (NVIDIA decode, 16-bit cache). Stage s = K [T][kKStride] then V, either
  // [T][kKStride] or, hcu, [D][kVtStride]. The padding (8 elements = 16 bytes per row) makes the
  // 16-byte copies and the ldmatrix row reads conflict-free (consecutive rows 16 banks apart).
  static constexpr int kStages = PK_DECODE_STAGES;
  static constexpr int kVtStride = kVTrans ? T + 8 : kKStride;
#if PK_PIPE_ENABLED
  static PK_DEVICE int kv_off(int r, int c) { return tile_off<kKStride, kSwz>(r, c); }
#endif
  static constexpr int kStageElems = T * kKStride + (kVTrans ? D : T) * kVtStride;
  static constexpr int kPipeBytes =
      kStages * kStageElems * 2 > kRedBytes ? kStages * kStageElems * 2 : kRedBytes;
  // Blocks per SM the shared memory allows (228 KB per SM, 1 KB reserved per block), capped so
  // that the register limit it implies (64K / (128 * blocks)) causes no spills: with 4 row
  // tiles, D 64 spills at 4 blocks (128 registers), D 128 at 3 (168).
  static constexpr int kPipeBlocks = 228 * 1024 / (kPipeBytes + 2 * 1024);
  static constexpr int kBlockCap = kHeadTiles < 4 ? 4 : D == 128 ? 2 : 3;
  static constexpr int kMinBlocks = !kPipe ? 1 : kPipeBlocks > kBlockCap ? kBlockCap : kPipeBlocks;

  static_assert(D == 64 || D == 128, "head_dim 64 or 128");
  static_assert(kHeadTiles == 1 || kHeadTiles == 2 || kHeadTiles == 4, "row tiles divide 4 waves");
  static_assert(kTokTiles >= 1 && kWaves % kHeadTiles == 0, "whole 16-token tiles per wave");
  static_assert(kUnits >= 1 && (T * D / kEpv) % kThreads == 0, "whole 16-byte loads per thread");
  static_assert(kWave % (D / kEpv) == 0, "a wave's K load covers whole rows");
  static_assert(kPipe || kSmemBytes + 2 * kWaves * 16 * 4 <= 48 * 1024, "static LDS/shared limit");
  static_assert(!kPipe || (kStages >= 2 && kMinBlocks >= 1), "pipeline: >= 2 stages that fit");
  static_assert(kMode == Mode::kDecode || kHeadTiles == 4, "extend: 64 query rows per block");

  // Launch geometry. Decode: (kv_head x head group, seq, partition); extend: (query block of
  // 64, q head, seq). The register path's shared memory is static (<= 48 KB); the pipeline's is
  // dynamic, above 48 KB (the launcher opts in with cudaFuncSetAttribute).
  static dim3 grid(const AttnParams& p) {
    if constexpr (kMode == Mode::kDecode)
      return dim3(p.num_kv_heads * p.blocks_per_kv_head, p.num_seqs, p.max_partitions);
    else
      return dim3(p.num_m_blocks, p.num_q_heads, p.num_seqs);
  }
  static dim3 block() { return dim3(kThreads); }
  static constexpr int dynamic_smem() { return kPipe ? kPipeBytes : 0; }
};

// 16 fp8 bytes -> 8 registers of packed 16-bit QT values (exact).
template <class QT, class KVT>
PK_DEVICE void fp8x16_to_16bit(const vec16& v, uint32_t (&o)[8]) {
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    const uint32_t x = v.w[w];
    o[2 * w] = pack2<QT>(fp8_to_float(KVT{}, x & 0xff), fp8_to_float(KVT{}, (x >> 8) & 0xff));
    o[2 * w + 1] =
        pack2<QT>(fp8_to_float(KVT{}, (x >> 16) & 0xff), fp8_to_float(KVT{}, x >> 24));
  }
}

PK_DEVICE uint16_t half_of(const uint32_t* w, int e) {
  return static_cast<uint16_t>(w[e >> 1] >> (16 * (e & 1)));
}

// LDS column of token t in row d of the V^T tile: kperm within each 16-group (identity except
// MMAC), then an XOR swizzle of column bits 1..3 by d/8. The transposing stores write 8
// consecutive d of one token per lane; without the swizzle every lane of a wave hits the same
// bank (a 16- to 32-way conflict). Fragment reads use one d/8 per register, so they stay
// conflict-free, and k pairs (bit 0) stay adjacent.
PK_DEVICE int tok_col(int t) { return (t & ~15) | kperm(t & 15); }
PK_DEVICE int vswz(int d) { return ((d >> 3) & 7) << 1; }

}  // namespace pk

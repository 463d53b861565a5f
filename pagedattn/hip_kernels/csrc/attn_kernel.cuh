// attn_kernel.cuh: paged attention over a KV-tile pipeline shared by decode and prefix prefill.
//
// One block = 4 waves and 16 * HEAD_TILES "rows". Decode: rows are the query heads of one KV
// head's group (the KV-head grid of reference §5.2.3: every KV tile is read from memory once and
// used by all heads of the group); extend: rows are 64 consecutive queries of one head.
// Wave w owns row tile w % HEAD_TILES and the token slice w / HEAD_TILES of every KV tile; the
// token slices are merged through LDS at the end.
//
// Per KV tile of T = 64 tokens:
//   Phase 1: regs -> LDS. K as [T][D] rows, V transposed to [D][T] (MMAC: kperm'd columns),
//            both converted to the query's 16-bit type (fp8 dequantised to exact values).
//   Phase 2: prefetch the next tile global -> regs (16-byte loads from per-page bases advanced by
//            k_delta / v_delta, reference §5.3.3), overlapping phases 3-4.
//   Phase 3: S = Q K^T (Q in registers), mask, online softmax in the exp2 domain.
//   Phase 4: O += P V with P converted in registers (acc_to_frag).
// Then: merge token slices, normalise, write out/lse (one partition) or the split-KV partials
// (attn_tile.cuh holds phases 3-4 and these end steps).
//
// NVIDIA decode with a 16-bit cache (PK_DECODE_PIPELINE=1, the default) runs decode_pipe_kernel
// instead (decode_pipe.cuh): a persistent cp.async pipeline over runs of work items, on the
// AttnCfg below (kPipe). fp8 caches, extend, and AMD/Hygon run this register path;
// PK_DECODE_PIPELINE=0 (build.py: PAGEDATTN_HIP_DECODE_PIPELINE=0) selects it everywhere.
//
// Torch-free: compiled by the JIT build and, standalone, by csrc/compile_check.
#pragma once

#include "attn_params.h"
#include "attn_tile.cuh"
#include "pk_kvload.h"
#include "pk_mma.h"

#ifndef PK_DECODE_PIPELINE
#define PK_DECODE_PIPELINE 1
#endif
#ifndef PK_DECODE_STAGES
#define PK_DECODE_STAGES 3  // 3 x 34 KB per block (D 128): 2 blocks and ~128 KB in flight per SM
#endif
#ifndef PK_DECODE_SMALL_TILE
#define PK_DECODE_SMALL_TILE 0
#endif
#if defined(PK_CUDA) && PK_DECODE_PIPELINE
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
  // One row tile (<= 16 heads) with PK_DECODE_SMALL_TILE: 2 waves on 32-token tiles, so that
  // twice as many (half as large) blocks share an SM.
  static constexpr bool kSmall = kPipe && PK_DECODE_SMALL_TILE && HEAD_TILES_ == 1;
  static constexpr int kWaves = kSmall ? 2 : 4;
  static constexpr int kThreads = kWaves * kWave;
  static constexpr int T = kSmall ? 32 : 64;              // tokens per KV tile (divides 64)
  static constexpr int kTokSplit = kWaves / kHeadTiles;   // waves sharing one row tile
  static constexpr int kTokTiles = T / 16 / kTokSplit;    // 16-token tiles per wave per KV tile
  static constexpr int kDTiles = D / 16;
  static constexpr int kEpv = 16 / KVT::kBytes;           // cache elements per 16-byte load
  static constexpr int kUnits = T * D / kEpv / kThreads;  // 16-byte loads per thread (K, and V)
  static constexpr int kKStride = D + 8;                  // LDS row pitch (16-bit elements)
  static constexpr int kVStride = T + 8;
  static constexpr int kMaxSub = T / 16;                  // page >= 16: <= 4 pages per tile
  static constexpr int kTileBytes = (T * kKStride + D * kVStride) * 2;
  static constexpr int kRedBytes = (kTokSplit - 1) * kHeadTiles * 16 * D * 4;
  static constexpr int kSmemBytes = kTileBytes > kRedBytes ? kTileBytes : kRedBytes;

  // Pipelined path (NVIDIA decode, 16-bit cache: decode_pipe.cuh). Stage s = K [T][kKStride]
  // then V, either [T][kKStride] or, hcu, [D][kVtStride]. The padding (8 elements = 16 bytes per
  // row) makes the 16-byte copies and the ldmatrix row reads conflict-free (consecutive rows 16
  // banks apart). A consumed stage is the scratch of the token-slice merge (kRedBytes).
  static constexpr int kStages = PK_DECODE_STAGES;
  static constexpr int kVtStride = kVTrans ? T + 8 : kKStride;
  static constexpr int kStageElems = T * kKStride + (kVTrans ? D : T) * kVtStride;
  static constexpr int kPipeBytes = kStages * kStageElems * 2;
  // Blocks per SM the shared memory allows (228 KB per SM, 1 KB reserved per block), capped so
  // that the register limit it implies (64K / (128 * blocks)) causes no spills: with 2 or 4 row
  // tiles D 64 spills at 4 blocks (128 registers), with 4 D 128 at 3 (168).
  static constexpr int kPipeBlocks = 228 * 1024 / (kPipeBytes + 2 * 1024);
  static constexpr int kBlockCap = kHeadTiles == 1 ? 4 : kHeadTiles == 2 || D == 64 ? 3 : 2;
  static constexpr int kMinBlocks = !kPipe ? 1 : kPipeBlocks > kBlockCap ? kBlockCap : kPipeBlocks;

  static_assert(D == 64 || D == 128, "head_dim 64 or 128");
  static_assert(kHeadTiles == 1 || kHeadTiles == 2 || kHeadTiles == 4, "row tiles divide 4 waves");
  static_assert(kTokTiles >= 1 && kWaves % kHeadTiles == 0, "whole 16-token tiles per wave");
  static_assert(kUnits >= 1 && (T * D / kEpv) % kThreads == 0, "whole 16-byte loads per thread");
  static_assert(kWave % (D / kEpv) == 0, "a wave's K load covers whole rows");
  static_assert(kPipe || kSmemBytes + 2 * kWaves * 16 * 4 <= 48 * 1024, "static LDS/shared limit");
  static_assert(!kPipe || (kStages >= 2 && kMinBlocks >= 1), "pipeline: >= 2 stages that fit");
  static_assert(!kPipe || kStageElems * 2 >= kRedBytes, "a stage holds the merge scratch");
  static_assert(kMode == Mode::kDecode || kHeadTiles == 4, "extend: 64 query rows per block");

  // Launch geometry of the register path. Decode: (kv_head x head group, seq, partition);
  // extend: (query block of 64, q head, seq); its shared memory is static (<= 48 KB). The
  // pipelined decode is persistent (a 1-D grid, attn_inst.cuh) with dynamic shared memory above
  // 48 KB (the launcher opts in with cudaFuncSetAttribute).
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
  static_assert(!Cfg::kPipe, "pipelined configs run decode_pipe_kernel (decode_pipe.cuh)");
  __shared__ __align__(16) uint8_t smem[Cfg::kSmemBytes];
  __shared__ float red_m[Cfg::kWaves][16];
  __shared__ float red_l[Cfg::kWaves][16];
  uint16_t* Ks = reinterpret_cast<uint16_t*>(smem);     // (T, KS)  K tile, row = token
  uint16_t* Vs = Ks + T * KS;                           // (D, VS)  V^T tile, row = d
  float* red_o = reinterpret_cast<float*>(smem);        // ((kTokSplit-1)*HT, 16, D), after loop

  const int tid = threadIdx.x, lane = lane_id(), wave = wave_id();
  const int rt = wave % HT;   // row tile of this wave
  const int ts = wave / HT;   // token slice of this wave

  // ---- Block coordinates, rows, key range --------------------------------------------------
  int seq, kv_head, ctx, row0, nrows, kbeg, kend, q_tok0 = 0, q_head0 = 0, prefix = 0, part = 0;
  if constexpr (kDecode) {
    kv_head = blockIdx.x / p.blocks_per_kv_head;
    const int hg = blockIdx.x % p.blocks_per_kv_head;
    seq = blockIdx.y;
    part = blockIdx.z;
    ctx = p.seq_lens[seq];
    q_head0 = kv_head * p.group + hg * p.heads_per_block;
    nrows = min(p.heads_per_block, p.group - hg * p.heads_per_block);
    kbeg = part * p.partition_size;
    if (part > 0 && kbeg >= ctx) return;  // partition 0 always runs: it writes empty rows
    kend = min(ctx, kbeg + p.partition_size);
    row0 = 0;
  } else {
    const int mb = blockIdx.x;
    q_head0 = blockIdx.y;
    seq = blockIdx.z;
    kv_head = q_head0 / p.group;
    const int lq = p.cu_seqlens_q[seq + 1] - p.cu_seqlens_q[seq];
    row0 = mb * 16 * HT;
    if (row0 >= lq) return;
    nrows = min(16 * HT, lq - row0);
    ctx = p.seq_lens[seq];
    prefix = ctx - lq;
    q_tok0 = p.cu_seqlens_q[seq];
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
  load_q<Cfg>(qf, p, kDecode ? int64_t(seq) : int64_t(q_tok0 + row0), q_head0, kDecode, nrows,
              rt, lane);

  // ---- KV cursor: one 64-bit base per page-subtile, advanced by deltas ------------------------
  const int page = p.page_size;
  const int st = page < T ? page : T;  // subtile rows: one page or the whole tile
  const int* table = p.block_table + int64_t(seq) * p.table_stride;
  const char* kb = static_cast<const char*>(p.k_cache) + int64_t(kv_head) * p.k_stride_head * KVT::kBytes;
  const char* vb = static_cast<const char*>(p.v_cache) + int64_t(kv_head) * p.v_stride_head * KVT::kBytes;
  int64_t kbase[Cfg::kMaxSub], vbase[Cfg::kMaxSub];  // element offsets (wave-uniform)
  int prev_blk[Cfg::kMaxSub], prev_off[Cfg::kMaxSub];
#pragma unroll
  for (int s = 0; s < Cfg::kMaxSub; ++s) kbase[s] = vbase[s] = 0, prev_blk[s] = prev_off[s] = 0;

  auto advance = [&](int c0) {
#pragma unroll
    for (int s = 0; s < Cfg::kMaxSub; ++s) {
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
    }
  };
  auto pick = [&](const int64_t (&b)[Cfg::kMaxSub], int s) {
    int64_t r = b[0];
#pragma unroll
    for (int j = 1; j < Cfg::kMaxSub; ++j) r = (s == j) ? b[j] : r;
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

  RowState<Cfg::kDTiles> rs;
  rs.reset();

  // ---- tile ci+1 prefetched global -> regs while tile ci is consumed -------------------------
  {
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
      if (wave_active) consume_tile<Cfg>(rs, qf, c0, lim, c, ts, lane, kfrag, vfrag);
      __syncthreads();
    }
  }

  // ---- Merge the token slices (the tile buffer is free), normalise, write -------------------
  float big_m[kRows], big_l[kRows];
  merge_slices<Cfg>(rs, red_o, red_m, red_l, wave, ts, rt, lane, big_m, big_l);
  if (ts > 0 || !wave_active) return;
  write_rows<Cfg>(p, rs, big_m, big_l, rt, lane, nrows, kDecode ? int64_t(seq) : int64_t(q_tok0 + row0),
                  q_head0, kDecode, !kDecode || p.max_partitions == 1, part,
                  p.v_scale ? p.v_scale[kv_head] : 1.f);
}

// Split-KV combine (HIP.md §4.5): out = sum_p w_p o_p / sum_p w_p, w_p = l_p 2^(m_p - M).
// grid (Hq, S), D threads. A sequence with no keys gets out 0 and lse -inf.
template <class QT, int D>
__global__ void __launch_bounds__(D) combine_kernel(const AttnParams p) {
  __shared__ float red[D / kWave > 0 ? D / kWave : 1];
  const int head = blockIdx.x, seq = blockIdx.y, tid = threadIdx.x;
  const int ctx = p.seq_lens[seq];
  const int parts = (ctx + p.partition_size - 1) / p.partition_size;
  const int64_t base = (int64_t(seq) * p.num_q_heads + head) * p.max_partitions;

  auto block_reduce = [&](float v, bool is_max) {
#pragma unroll
    for (int msk = kWave / 2; msk > 0; msk >>= 1) {
      const float o = shfl_xor(v, msk);
      v = is_max ? fmax(v, o) : v + o;
    }
    __syncthreads();
    if (lane_id() == 0) red[wave_id()] = v;
    __syncthreads();
    v = red[0];
    for (int w = 1; w < D / kWave; ++w) v = is_max ? fmax(v, red[w]) : v + red[w];
    return v;
  };
  // Phase 1: global max over the partitions' maxima.
  float mx = kNegInf;
  for (int i = tid; i < parts; i += D) mx = fmax(mx, p.max_logits[base + i]);
  mx = block_reduce(mx, true);
  const float mu = mx == kNegInf ? 0.f : mx;
  // Phase 2: the total weight.
  float sum = 0.f;
  for (int i = tid; i < parts; i += D) sum += p.exp_sums[base + i] * exp2(p.max_logits[base + i] - mu);
  sum = block_reduce(sum, false);
  // Phase 3: weighted sum of the partition outputs, thread = d. Unrolled so that eight
  // partitions' loads are in flight at once (only the FMA chain on acc is serial).
  float acc = 0.f;
#pragma unroll 8
  for (int i = 0; i < parts; ++i) {
    const float w = p.exp_sums[base + i] * exp2(p.max_logits[base + i] - mu);
    acc += w * p.tmp_out[(base + i) * D + tid];
  }
  const float inv = sum > 0.f ? 1.f / sum : 0.f;
  uint16_t* ob = static_cast<uint16_t*>(p.out) + int64_t(seq) * p.o_stride_tok + head * p.o_stride_head;
  ob[tid] = from_float(QT{}, acc * inv);
  if (p.lse && tid == 0)
    p.lse[int64_t(seq) * p.num_q_heads + head] =
        sum > 0.f ? (mx + log2_(sum)) * 0.69314718055994531f : kNegInf;
}

}  // namespace pk

// attn_kernel.cuh: paged attention over a KV-tile pipeline shared by decode and prefix prefill.
//
// One block = 4 waves and 16 * HEAD_TILES "rows". Decode: rows are the query heads of one KV
// head's group (the KV-head grid: every KV tile is read from memory once and used by all heads
// of the group); extend: rows are 64 consecutive queries of one head.
// Wave w owns row tile w % HEAD_TILES and the token slice w / HEAD_TILES of every KV tile; the
// token slices are merged through LDS at the end.
//
// Per KV tile of T = 64 tokens (register path: AMD/Hygon, fp8 caches, extend):
//   Phase 1: regs -> LDS. K as [T][D] rows, V transposed to [D][T] (MMAC: kperm'd columns),
//            both converted to the query's 16-bit type (fp8 dequantised to exact values).
//   Phase 2: prefetch the next tile global -> regs (16-byte loads from per-page bases advanced by
//            k_delta / v_delta: pk_kvload.h), overlapping phases 3-4.
//   Phase 3: S = Q K^T (Q in registers), mask, online softmax in the exp2 domain.
//   Phase 4: O += P V with P converted in registers (acc_to_frag).
// Then: merge token slices, normalise, write out/lse (one partition) or the split-KV partials.
//
// NVIDIA decode with a 16-bit cache: groups of <= 16 heads run decode_cs_kernel
// (decode_cs.cuh); larger groups run this kernel with phases 1-2 replaced by a kStages-deep
// cp.async pipeline straight into dynamic shared memory (no register staging):
//   tile i+kStages-1 is in flight while tile i is consumed; K as [T][D], V as [T][D] (hcu: its
//   cache layout [D][T]); fragments are read with ldmatrix (.trans for V [T][D]).
//
// Torch-free: compiled by the JIT build and, standalone, by csrc/compile_check.
#pragma once

#include "attn_params.h"
#include "pk_guard.h"
#include "pk_kvload.h"
#include "pk_mma.h"
#include "pk_pipe.h"

// Pipeline depth of the NVIDIA decode above. build.py passes -DPK_DECODE_STAGES=2 for archs
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

  // ---- KV cursor: one 64-bit base per page-subtile, advanced by deltas ------------------------
  const int page = p.page_size;
  const int st = page < T ? page : T;  // subtile rows: one page or the whole tile
  const int* table = p.block_table + int64_t(seq) * p.table_stride;
  const char* kb = static_cast<const char*>(p.k_cache) + int64_t(kv_head) * p.k_stride_head * KVT::kBytes;
  const char* vb = static_cast<const char*>(p.v_cache) + int64_t(kv_head) * p.v_stride_head * KVT::kBytes;
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

#if PK_PIPE_ENABLED
  if constexpr (Cfg::kPipe) {
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
  } else
#endif
  {
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

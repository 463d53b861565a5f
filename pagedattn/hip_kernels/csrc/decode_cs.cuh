// decode_cs.cuh: NVIDIA paged decode, column-split form, for groups of <= 16 query heads over a
// 16-bit cache (larger groups and fp8 caches run attn_kernel).
//
// Why: attn_kernel gives each of its 4 waves 16 tokens of a 64-token tile and merges the token
// slices at the end, so a block needs 34 KB per stage and an SM holds 2 blocks (8 warps): too
// few to hide the tile loop's latency. Here the 4 warps
// share one 32-token tile (16 KB per stage at D 128, 2 stages: 4 blocks and 16 warps per SM):
//
//   Phase 1  wait for tile i (cp.async, kStages deep), barrier, issue tile i+kStages-1;
//            K as [T][D] and V as [T][D] with swizzled 16-byte chunks (hcu: V^T [D][T], padded).
//   Phase 2  S_w = Q K_w^T: warp w takes tokens 8w..8w+7 (one m16n8k16 n-tile, 8 k-steps).
//            Mask, scale to log2 units, row maxima over its 8 tokens -> red_max[w]. Barrier.
//   Phase 3  every warp: tile max of the 4 warps, the same new running max m; P_w = exp2(S_w - m)
//            -> Ps[16][T] (16-bit), l_w += row sums of P_w (each warp keeps its own partial
//            sums: the rescale factors are common, so they add up at partition end). Barrier.
//   Phase 4  O_w = O_w * corr + P V[:, columns of w]: warp w owns D/4 output columns, over all
//            T tokens (mma_nt on ldmatrix fragments of Ps and V).
//   Partition end (every partition_size keys): l = sum of the 4 warps' sums (shared memory);
//            the partition's state is folded into the block's running state (merge_state) or
//            parked for the combine; m, l, O restart empty.
//   End      kMerge: warp w writes its columns of out = A / L, warp 0 the lse.
//
// Launch shapes (attn_inst.cuh, launch_cs): one pass (grid (heads, seqs, 1): each block folds
// all its sequence's partitions) when the (head group, sequence) blocks alone fill the GPU
// three times over; else split: block z owns partitions [z ppp, z ppp + ppp), ppp as small as
// keeps the grid within one wave, and the combine folds the parked states in partition order
// with the same merge_state. Split points depend on the sequence and partition_size only, so
// the output is bitwise the same for every launch shape and batch. Torch-free.
#pragma once

#include "decode_cs_cfg.h"

#if PK_PIPE_ENABLED
namespace pk {

// kMerge: the block folds its partitions into one state (merge_state) and writes out/lse: the
// one-pass launch (p.one_pass: all partitions of the sequence) and the single-partition launch.
// Otherwise it parks each of its partitions' states for the combine (p.parts_per_block per
// block: the pipeline runs on across them).
template <class Cfg, bool kMerge>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kMinBlocks)
    decode_cs_kernel(const AttnParams p) {
  using QT = typename Cfg::QT;
  constexpr int D = Cfg::D, T = Cfg::T, NT = Cfg::kThreads, NS = Cfg::kStages;
  constexpr int KS = Cfg::kKStride, VTS = Cfg::kVtStride, PS = Cfg::kPStride;
  constexpr int SE = Cfg::kStageElems, OWN = Cfg::kOwnTiles;
  constexpr int VPR = D / 8;         // 16-byte vectors per K/V row
  constexpr int RPT = Cfg::kUnits;   // K/V rows per thread: consecutive tokens of one page
  constexpr int TVR = T / 8;         // hcu: 16-byte token vectors per V^T row
  constexpr int DPU = NT / TVR;      // hcu: V^T rows one pass covers
  static_assert(NT % VPR == 0 && NT / VPR * RPT == T, "K/V copies cover the tile once");
  static_assert(16 % RPT == 0, "a thread's rows lie in one page (page >= 16)");
  static_assert(NT % TVR == 0 && Cfg::kUnits * DPU == D, "V^T copies cover the tile once");
  // Preconditions (host-checked): page_size a power of 2 >= 16; partition_size % 64 == 0; cache
  // base pointers 16-byte aligned, k/v strides multiples of 8; q strides even; group <= 16.
  extern __shared__ __align__(128) uint8_t pk_cs_smem[];  // 128: the swizzle assumes it
  uint16_t* stages = reinterpret_cast<uint16_t*>(pk_cs_smem);  // (NS, SE)
  __shared__ __align__(16) uint16_t Ps[16 * PS];                // (16 rows, T tokens) of P
  __shared__ float red[Cfg::kWarps][16];                        // row maxima, then row sums

  const int tid = threadIdx.x, lane = lane_id(), warp = wave_id();
  const int kv_head = blockIdx.x / p.blocks_per_kv_head;
  const int hg = blockIdx.x % p.blocks_per_kv_head;
  const int seq = blockIdx.y;
  if constexpr (!kMerge) grid_dependency_launch();  // the combine may launch; it waits for us
  int ctx = p.seq_lens[seq];
  bool bad = seq_len_bad(p, ctx);  // block-uniform; bad rows become NaN (pk_guard.h)
  if (bad) ctx = 0;                // read nothing; the first block writes the NaN rows
  const int q_head0 = kv_head * p.group + hg * p.heads_per_block;
  const int nrows = min(p.heads_per_block, p.group - hg * p.heads_per_block);
  // Partitions [plo, phi) of the sequence's nparts (an empty sequence has one, neutral).
  const int nparts = max(1, (ctx + p.partition_size - 1) / p.partition_size);
  const int plo = kMerge ? 0 : blockIdx.z * p.parts_per_block;
  if (plo >= nparts) return;
  const int phi = kMerge ? nparts : min(nparts, plo + p.parts_per_block);
  const int kbeg = plo * p.partition_size;
  const int kend = min(ctx, phi * p.partition_size);
  const int* trow = p.block_table + int64_t(seq) * p.table_stride;
  // the table entries of keys [kbeg, kend), read by the tile loop (none when bad: ctx is 0)
  bad = block_any(bad || table_range_bad(p, trow, kbeg, kend, NT));
  count_error(p, bad);
  const int nchunks = !bad && kend > kbeg ? (kend - kbeg + T - 1) / T : 0;
  const int cpp = p.partition_size / T;  // tiles per partition

  Frag qf[Cfg::kDTiles];  // (16 rows, D), zero rows past nrows
  {
    const uint16_t* qb = static_cast<const uint16_t*>(p.q);
#pragma unroll
    for (int r = 0; r < kFragRegs; ++r) {
      const int x = frag_row(lane, r);
      const int64_t off = int64_t(seq) * p.q_stride_tok + int64_t(q_head0 + x) * p.q_stride_head;
#pragma unroll
      for (int kk = 0; kk < Cfg::kDTiles; ++kk)
        qf[kk].r[r] = x < nrows
            ? *reinterpret_cast<const uint32_t*>(qb + off + 16 * kk + frag_k(lane, r)) : 0u;
    }
  }
  // This lane's two rows (l/4 and l/4 + 8) and their last visible key (-1: no such row).
  int lim[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) lim[h] = lane / 4 + 8 * h < nrows ? ctx - 1 : -1;
  const float c = p.scale_log2;

  // ---- cp.async pipeline (as attn_kernel's): stage ci % NS holds tile ci --------------------
  const int lg_page = __ffs(p.page_size) - 1, pmask = p.page_size - 1;
  const int vec = tid % VPR, row0 = tid / VPR * RPT;
  const int tv0 = (tid % TVR) * 8, drow0 = tid / TVR;
  const uint64_t ksb = p.k_stride_block * 2, vsb = p.v_stride_block * 2;
  const int kst = int(p.k_stride_token) * 2, vst = int(p.v_stride_token) * 2;
  const int vsd = int(p.v_stride_dim) * 2;
  const char* kb = static_cast<const char*>(p.k_cache) + int64_t(kv_head) * p.k_stride_head * 2;
  const char* vb = static_cast<const char*>(p.v_cache) + int64_t(kv_head) * p.v_stride_head * 2;
  // Table entry of this thread's rows (one page) / hcu token vector in the next tile to issue,
  // read one issue ahead so that no copy waits on it; 0 past ctx (those copies read nothing).
  uint32_t nblk = 0, nvblk = 0;
  auto load_blocks = [&](int ci) {
    const int c0 = kbeg + ci * T;
    const int tok = c0 + row0;
    nblk = ci < nchunks && tok < ctx ? trow[tok >> lg_page] : 0;
    if constexpr (Cfg::kVTrans) {
      const int tok = c0 + tv0;
      nvblk = ci < nchunks && tok < ctx ? trow[tok >> lg_page] : 0;
    }
  };
  auto issue = [&](int ci, int st) {  // keys past ctx become zeros (0 source bytes)
    const int c0 = kbeg + ci * T;
    uint16_t* ks = stages + st * SE;  // (T, KS)
    uint16_t* vs = ks + T * KS;       // (T, KS), hcu (D, VTS)
    const int tok0 = c0 + row0, off0 = tok0 & pmask;
    const char* ksrc = kb + nblk * ksb + (off0 * kst + vec * 16);
#pragma unroll
    for (int u = 0; u < RPT; ++u)
      cp_async16(ks + Cfg::kv_off(row0 + u, vec), ksrc + u * kst, tok0 + u < ctx ? 16 : 0);
    if constexpr (!Cfg::kVTrans) {
      const char* vsrc = vb + nblk * vsb + (off0 * vst + vec * 16);
#pragma unroll
      for (int u = 0; u < RPT; ++u)
        cp_async16(vs + Cfg::kv_off(row0 + u, vec), vsrc + u * vst, tok0 + u < ctx ? 16 : 0);
    } else {  // 8 tokens of one d: contiguous, within one page
      const int tok = c0 + tv0;
      const char* vsrc = vb + nvblk * vsb + (tok & pmask) * vst;
      const int nbytes = tok < ctx ? min(16, 2 * (ctx - tok)) : 0;  // partial vector: zeros
#pragma unroll
      for (int u = 0; u < Cfg::kUnits; ++u) {
        const int d = u * DPU + drow0;
        cp_async16(vs + d * VTS + tv0, vsrc + d * vsd, nbytes);
      }
    }
    load_blocks(ci + 1);
  };

  float m[2] = {kNegInf, kNegInf}, l[2] = {0.f, 0.f};  // rows l/4, l/4 + 8 (l: this warp's sum)
  Acc o[OWN];  // (16 rows, 16 columns) x OWN: columns 16 (warp * OWN + j) ..
#pragma unroll
  for (int j = 0; j < OWN; ++j) zero(o[j]);
  // kMerge: the running state of the partitions done so far (M, L, A; merge_state).
  float M[2] = {kNegInf, kNegInf}, L[2] = {0.f, 0.f};
  Acc A[kMerge ? OWN : 1];
#pragma unroll
  for (int j = 0; j < (kMerge ? OWN : 1); ++j) zero(A[j]);

  // End of partition pi: its row sums over the 4 warps (through red: every warp is past phase
  // 3's reads of it), then fold into (M, L, A) or park; the next partition starts empty.
  auto finish_partition = [&](int pi) {
    float lp[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      lp[h] = l[h] + shfl_xor(l[h], 1);
      lp[h] += shfl_xor(lp[h], 2);
    }
    if ((lane & 3) == 0) red[warp][lane / 4] = lp[0], red[warp][lane / 4 + 8] = lp[1];
    __syncthreads();  // read back before the next tile's phase 2 writes red (after a barrier)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int x = lane / 4 + 8 * h;
      lp[h] = red[0][x];
#pragma unroll
      for (int w = 1; w < Cfg::kWarps; ++w) lp[h] += red[w][x];
    }
    if constexpr (kMerge) {
      MergeFactors f[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) f[h] = merge_state(M[h], L[h], m[h], lp[h]);
#pragma unroll
      for (int j = 0; j < OWN; ++j)
#pragma unroll
        for (int i = 0; i < kAccSlots; ++i)
          A[j].v[i] = merge_acc(A[j].v[i], o[j].v[i], f[acc_row(i)]);
    } else {
#pragma unroll
      for (int i = 0; i < kAccSlots; ++i) {
        const int x = acc_x(lane, i);
        if (x >= nrows) continue;
        float* tb = p.tmp_out + ((int64_t(seq) * p.num_q_heads + q_head0 + x) * p.max_partitions + pi) * D;
#pragma unroll
        for (int j = 0; j < OWN; ++j) tb[16 * (warp * OWN + j) + acc_y(lane, i)] = o[j].v[i];
      }
      if (warp == 0 && (lane & 3) == 0) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int x = lane / 4 + 8 * h;
          if (x >= nrows) continue;
          const int64_t at = (int64_t(seq) * p.num_q_heads + q_head0 + x) * p.max_partitions + pi;
          p.max_logits[at] = bad ? nan_f32() : m[h];  // NaN: bad, for the combine
          p.exp_sums[at] = lp[h];
        }
      }
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) m[h] = kNegInf, l[h] = 0.f;
#pragma unroll
    for (int j = 0; j < OWN; ++j) zero(o[j]);
  };

  load_blocks(0);
#pragma unroll
  for (int i = 0; i < NS - 1; ++i) {
    if (i < nchunks) issue(i, i);
    cp_async_commit();
  }
  int rd = 0, wr = NS - 1, left = cpp, pi = plo;
  for (int ci = 0; ci < nchunks; ++ci) {
    // Phase 1.
    cp_async_wait<NS - 2>();
    __syncthreads();  // tile ci visible; tile ci-1, Ps and red are free everywhere
    if (ci + NS - 1 < nchunks) issue(ci + NS - 1, wr);
    cp_async_commit();
    const uint16_t* ks = stages + rd * SE;
    const uint16_t* vs = ks + T * KS;
    const int c0 = kbeg + ci * T;

    // Phase 2: S_w = Q K_w^T over tokens 8 warp .. +7 (4 values per lane: rows l/4, l/4 + 8;
    // tokens 2(l%4), +1).
    float s[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int kc = 0; kc < D / 32; ++kc) {
      uint32_t b[4];
      ldsm_n8_k32(ks, [&](int r, int c) { return Cfg::kv_off(8 * warp + r, 4 * kc + c); }, lane,
                  b);
      mma_n8<QT>(s, qf[2 * kc], b[0], b[1]);
      mma_n8<QT>(s, qf[2 * kc + 1], b[2], b[3]);
    }
    const int j0 = c0 + 8 * warp + 2 * (lane & 3);  // key of slot 0 (slot i: + (i & 1))
    float mx[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float& v = s[2 * h + e];
        v = j0 + e <= lim[h] ? v * c : kNegInf;
      }
      mx[h] = fmax(s[2 * h], s[2 * h + 1]);
      mx[h] = fmax(mx[h], shfl_xor(mx[h], 1));
      mx[h] = fmax(mx[h], shfl_xor(mx[h], 2));
    }
    if ((lane & 3) == 0) red[warp][lane / 4] = mx[0], red[warp][lane / 4 + 8] = mx[1];
    __syncthreads();

    // Phase 3: the common running max; P_w into Ps; this warp's row sums.
    float corr[2], mu[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int x = lane / 4 + 8 * h;
      float tm = red[0][x];
#pragma unroll
      for (int w = 1; w < Cfg::kWarps; ++w) tm = fmax(tm, red[w][x]);
      const float mn = fmax(m[h], tm);
      mu[h] = mn == kNegInf ? 0.f : mn;  // an all-masked row keeps p = 0, not NaN
      corr[h] = exp2(m[h] - mu[h]);
      m[h] = mn;
      const float p0 = exp2(s[2 * h] - mu[h]), p1 = exp2(s[2 * h + 1] - mu[h]);
      l[h] = l[h] * corr[h] + (p0 + p1);
      *reinterpret_cast<uint32_t*>(Ps + x * PS + 8 * warp + 2 * (lane & 3)) = pack2<QT>(p0, p1);
    }
    __syncthreads();

    // Phase 4: O_w = O_w * corr + P V[:, own columns].
    Frag pf[T / 16];  // (16 rows, 16 tokens) x 2
#pragma unroll
    for (int tt = 0; tt < T / 16; ++tt) pf[tt] = ldsm_rows(Ps + 16 * tt, PS, lane);
#pragma unroll
    for (int j = 0; j < OWN; ++j) {
      const int n = warp * OWN + j;  // 16-column tile of O
#pragma unroll
      for (int i = 0; i < kAccSlots; ++i) o[j].v[i] *= corr[acc_row(i)];
#pragma unroll
      for (int tt = 0; tt < T / 16; ++tt) {
        Frag vf;
        if constexpr (Cfg::kVTrans) vf = ldsm_rows(vs + 16 * n * VTS + 16 * tt, VTS, lane);
        else
          vf = ldsm_cols(vs, [&](int r, int c) { return Cfg::kv_off(16 * tt + r, 2 * n + c); },
                         lane);
        mma_nt<QT>(o[j], pf[tt], vf);
      }
    }
    rd = rd + 1 == NS ? 0 : rd + 1;
    wr = wr + 1 == NS ? 0 : wr + 1;
    if (--left == 0 || ci + 1 == nchunks) {
      finish_partition(pi++);
      left = cpp;
    }
  }
  cp_async_wait<0>();
  if (nchunks == 0) finish_partition(plo);  // an empty sequence: its neutral partition
  if constexpr (kMerge) {  // out = A / L, lse
    float inv[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) inv[h] = bad ? nan_f32() : L[h] > 0.f ? 1.f / L[h] : 0.f;
#pragma unroll
    for (int i = 0; i < kAccSlots; ++i) {
      const int x = acc_x(lane, i);
      if (x >= nrows) continue;
      uint16_t* ob = static_cast<uint16_t*>(p.out) + int64_t(seq) * p.o_stride_tok +
                     int64_t(q_head0 + x) * p.o_stride_head;
#pragma unroll
      for (int j = 0; j < OWN; ++j)
        ob[16 * (warp * OWN + j) + acc_y(lane, i)] = from_float(QT{}, A[j].v[i] * inv[acc_row(i)]);
    }
    if (p.lse && warp == 0 && (lane & 3) == 0) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int x = lane / 4 + 8 * h;
        if (x < nrows)
          p.lse[int64_t(seq) * p.num_q_heads + q_head0 + x] = bad ? nan_f32() : lse_of(M[h], L[h]);
      }
    }
  }
}

}  // namespace pk
#endif

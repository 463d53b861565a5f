// decode_pipe.cuh: NVIDIA paged decode over 16-bit caches (AttnCfg::kPipe): a persistent
// cp.async pipeline that runs through a block's whole run of work items.
//
// Work item = (sequence, KV-head group block, partition), numbered with the partition fastest:
//   item = ((seq * num_kv_heads + kv_head) * blocks_per_kv_head + hg) * max_partitions + part.
// Block b owns the items [b N / B, (b+1) N / B) of N = num_seqs * num_kv_heads *
// blocks_per_kv_head * max_partitions, B = gridDim.x (the launcher: one block per resident slot,
// so one wave). Partitions that start past their sequence's end are skipped; partition 0 always
// runs, so an empty sequence writes its empty rows (from one fully masked tile). Every item
// computes what a block of its own would: the same tiles, in the same order, the same merge, so
// the grid size never changes the bits (batch invariance, tested).
//
// The block's KV tiles form one stream through kStages shared-memory stages: tile i+kStages-1 is
// in flight while tile i is consumed, across item boundaries too, so the next item's first
// copies overlap the end of this one and the pipeline fills once per block, not per item. Two
// walkers step through the stream: the issuing one kStages-1 tiles ahead of the consuming one.
//
// Per tile (every wave): wait for the tile's copies, barrier, issue the tile kStages-1 ahead
// (table entries read one issue earlier), phases 3-4 (consume_tile). After an item's last tile:
// merge the token slices through the finished stage's buffer, write the rows, reset the state.
// At an item of a new (sequence, head group), its query rows were prefetched into registers when
// the previous one started.
//
// Torch-free: compiled by the JIT build and, standalone, by csrc/compile_check.
#pragma once

#include "attn_kernel.cuh"
#include "pk_pipe.h"

#ifndef PK_DECODE_LAZY
#define PK_DECODE_LAZY 1  // skip O *= corr when no row max moved (same bits)
#endif
#ifndef PK_DECODE_FULL_TILES
#define PK_DECODE_FULL_TILES 1  // no mask on tiles below ctx
#endif

#if PK_PIPE_ENABLED
namespace pk {

// A position in a block's run of items: the current item and the first key of its current tile.
struct Walker {
  int64_t item, end;        // current item; end of the block's run
  int64_t pair;             // item / max_partitions: its (sequence, KV head, head group)
  int seq, kvh, hg, part;   // the item's coordinates
  int ctx, loaded_seq;      // seq_lens[seq] (read once per sequence)
  int c0, kend;             // the tile's first key; the item's key end (<= c0: an empty sequence)
  bool valid;
};

// Move w to the first item at or after w.item that has keys or is a partition 0.
PK_DEVICE void walker_seek(Walker& w, const AttnParams& p) {
  const int pairs = p.num_kv_heads * p.blocks_per_kv_head;  // (KV head, head group) per sequence
  while (w.item < w.end) {
    const int64_t pair = w.item / p.max_partitions;
    w.pair = pair;
    w.part = int(w.item - pair * p.max_partitions);
    w.seq = int(pair / pairs);
    const int hb = int(pair - int64_t(w.seq) * pairs);
    w.kvh = hb / p.blocks_per_kv_head;
    w.hg = hb - w.kvh * p.blocks_per_kv_head;
    if (w.seq != w.loaded_seq) {
      w.ctx = p.seq_lens[w.seq];
      w.loaded_seq = w.seq;
    }
    const int kbeg = w.part * p.partition_size;
    if (w.part == 0 || kbeg < w.ctx) {
      w.c0 = kbeg;
      w.kend = min(w.ctx, kbeg + p.partition_size);
      w.valid = true;
      return;
    }
    w.item = (pair + 1) * p.max_partitions;  // the pair's later partitions are empty too
  }
  w.valid = false;
}

PK_DEVICE Walker walker_start(int64_t begin, int64_t end, const AttnParams& p) {
  Walker w{};
  w.item = begin;
  w.end = end;
  w.loaded_seq = -1;
  walker_seek(w, p);
  return w;
}

// Step to the next tile of the stream (T keys on, or the next item's first tile).
template <int T>
PK_DEVICE void walker_next(Walker& w, const AttnParams& p) {
  w.c0 += T;
  if (w.c0 < w.kend) return;
  ++w.item;
  walker_seek(w, p);
}

template <class Cfg>
__global__ void PK_LAUNCH_BOUNDS(Cfg::kThreads, Cfg::kMinBlocks)
    decode_pipe_kernel(const AttnParams p) {
  constexpr int D = Cfg::D, T = Cfg::T, NT = Cfg::kThreads, HT = Cfg::kHeadTiles;
  constexpr int KS = Cfg::kKStride, NS = Cfg::kStages, SE = Cfg::kStageElems;
  constexpr int VTS = Cfg::kVtStride;
  constexpr int VPR = D / 8;     // 16-byte vectors per K/V row
  constexpr int RPT = Cfg::kUnits;  // K/V rows per thread: consecutive tokens, within one page
  constexpr int TVR = T / 8;     // hcu: 16-byte token vectors per V^T row
  constexpr int DPU = NT / TVR;  // hcu: V^T rows one pass covers
  // Preconditions (host-checked): page_size a power of 2 >= 16; partition_size % 64 == 0, so
  // tiles never straddle a partition and a 16-byte vector never straddles a page; cache base
  // pointers 16-byte aligned, k/v strides multiples of 8; q strides even.
  static_assert(Cfg::kPipe && Cfg::kMode == Mode::kDecode, "16-bit decode configs only");
  static_assert(NT % VPR == 0 && NT / VPR * RPT == T, "K/V copies cover the tile once");
  static_assert(16 % RPT == 0, "a thread's rows lie in one page (page >= 16)");
  static_assert(NT % TVR == 0 && Cfg::kUnits * DPU == D, "V^T copies cover the tile once");
  extern __shared__ __align__(16) uint8_t pk_dyn_smem[];
  uint16_t* stages = reinterpret_cast<uint16_t*>(pk_dyn_smem);  // (NS, SE) 16-bit
  __shared__ float red_m[Cfg::kWaves][16];
  __shared__ float red_l[Cfg::kWaves][16];

  const int tid = threadIdx.x, lane = lane_id(), wave = wave_id();
  const int rt = wave % HT;  // row tile of this wave
  const int ts = wave / HT;  // token slice of this wave
  const int64_t n_items =
      int64_t(p.num_seqs) * p.num_kv_heads * p.blocks_per_kv_head * p.max_partitions;
  const int64_t i_begin = n_items * blockIdx.x / gridDim.x;
  const int64_t i_end = n_items * (blockIdx.x + 1) / gridDim.x;

  const int lg_page = __ffs(p.page_size) - 1, pmask = p.page_size - 1;
  const int vec = tid % VPR, row0 = tid / VPR * RPT;   // this thread's column / first row
  const int tv0 = (tid % TVR) * 8, drow0 = tid / TVR;  // hcu: its token vector / first d row
  // Byte strides; in-page offsets fit 32 bits, the page term is 64-bit.
  const uint64_t ksb = p.k_stride_block * 2, vsb = p.v_stride_block * 2;
  const int kst = int(p.k_stride_token) * 2, vst = int(p.v_stride_token) * 2;
  const int vsd = int(p.v_stride_dim) * 2;
  const char* kcache = static_cast<const char*>(p.k_cache);
  const char* vcache = static_cast<const char*>(p.v_cache);

  // ---- Issuing side: wi, and the table entries of its tile's rows (read one issue ahead, so
  // that no copy waits on a table read; 0 when the rows are past ctx: those copies read
  // nothing). A thread copies RPT consecutive rows, all in one page: one entry per tile. ----
  Walker wi = walker_start(i_begin, i_end, p);
  uint32_t nblk = 0;   // K (and V) rows row0 .. row0 + RPT - 1
  uint32_t nvblk = 0;  // hcu V: the token vector tv0
  auto load_blocks = [&]() {
    const int* trow = p.block_table + int64_t(wi.seq) * p.table_stride;
    const int tok = wi.c0 + row0;
    nblk = wi.valid && tok < wi.ctx ? trow[tok >> lg_page] : 0;
    if constexpr (Cfg::kVTrans) {
      const int tv = wi.c0 + tv0;
      nvblk = wi.valid && tv < wi.ctx ? trow[tv >> lg_page] : 0;
    }
  };
  // Copy wi's tile into stage st (keys past ctx become zeros), step wi, read its next entries.
  // Every call commits one group, possibly empty: tile i is always group i.
  auto issue = [&](int st) {
    if (wi.valid) {
      uint16_t* ks = stages + st * SE;  // (T, KS)
      uint16_t* vs = ks + T * KS;       // (T, KS), hcu (D, VTS)
      const int tok0 = wi.c0 + row0, off0 = tok0 & pmask;
      const char* ksrc = kcache + int64_t(wi.kvh) * p.k_stride_head * 2 + nblk * ksb +
                         (off0 * kst + vec * 16);
#pragma unroll
      for (int u = 0; u < RPT; ++u)
        cp_async16(ks + (row0 + u) * KS + vec * 8, ksrc + u * kst, tok0 + u < wi.ctx ? 16 : 0);
      if constexpr (!Cfg::kVTrans) {
        const char* vsrc = vcache + int64_t(wi.kvh) * p.v_stride_head * 2 + nblk * vsb +
                           (off0 * vst + vec * 16);
#pragma unroll
        for (int u = 0; u < RPT; ++u)
          cp_async16(vs + (row0 + u) * KS + vec * 8, vsrc + u * vst, tok0 + u < wi.ctx ? 16 : 0);
      } else {  // 8 tokens of one d: contiguous, within one page
        const int tok = wi.c0 + tv0;
        const char* vsrc = vcache + int64_t(wi.kvh) * p.v_stride_head * 2 + nvblk * vsb +
                           (tok & pmask) * vst;
        const int nbytes = tok < wi.ctx ? min(16, 2 * (wi.ctx - tok)) : 0;  // zero the tail
#pragma unroll
        for (int u = 0; u < Cfg::kUnits; ++u) {
          const int d = u * DPU + drow0;
          cp_async16(vs + d * VTS + tv0, vsrc + d * vsd, nbytes);
        }
      }
      walker_next<T>(wi, p);
      load_blocks();
    }
    cp_async_commit();
  };

  // ---- Consuming side: wc, the rows of its (sequence, head group), the softmax state --------
  Walker wc = walker_start(i_begin, i_end, p);
  const int pairs = p.num_kv_heads * p.blocks_per_kv_head;
  auto rows_of = [&](int64_t pair, int& seq, int& head0) {  // -> nrows
    seq = int(pair / pairs);
    const int hb = int(pair - int64_t(seq) * pairs);
    const int kvh = hb / p.blocks_per_kv_head, hg = hb - kvh * p.blocks_per_kv_head;
    head0 = kvh * p.group + hg * p.heads_per_block;
    return min(p.heads_per_block, p.group - hg * p.heads_per_block);
  };
  // The next pair's query rows are prefetched where registers allow it (<= 2 blocks per SM:
  // 256 per thread); with 4 blocks per SM (D 64) they would spill.
  constexpr bool kPrefetchQ = Cfg::kMinBlocks <= 2;
  Frag qf[Cfg::kDTiles], qn[Cfg::kDTiles];  // (16, D): this pair's query rows, the next pair's
  int64_t q_pair = -1, qn_pair = -1;
  int lim[kRows], nrows = 0, head0 = 0;
  bool active = false;
  auto enter_pair = [&]() {  // wc is at a new (sequence, head group): rows, key limit, queries
    int seq;
    nrows = rows_of(wc.pair, seq, head0);
    if (kPrefetchQ && wc.pair == qn_pair) {
#pragma unroll
      for (int kk = 0; kk < Cfg::kDTiles; ++kk) qf[kk] = qn[kk];
    } else {
      load_q<Cfg>(qf, p, seq, head0, true, nrows, rt, lane);
    }
    q_pair = wc.pair;
    if (kPrefetchQ && (wc.pair + 1) * p.max_partitions < i_end) {  // the run's next pair
      int nseq, nhead0;
      const int nn = rows_of(wc.pair + 1, nseq, nhead0);
      load_q<Cfg>(qn, p, nseq, nhead0, true, nn, rt, lane);
      qn_pair = wc.pair + 1;
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r)
      lim[r] = rt * 16 + acc_x(lane, 2 * r) >= nrows ? -1 : wc.ctx - 1;
    active = rt * 16 < nrows;
  };
  if (wc.valid) enter_pair();  // the first queries load under the pipeline fill

  // Prologue: tiles 0 .. NS-2 in flight.
  load_blocks();
#pragma unroll
  for (int s = 0; s < NS - 1; ++s) issue(s);

  RowState<Cfg::kDTiles> rs;
  rs.reset();
  const bool direct = p.max_partitions == 1;

  int rd = 0, wr = NS - 1;  // stage of wc's tile; stage that the next issue fills
  while (wc.valid) {
    cp_async_wait<NS - 2>();  // this thread's copies of wc's tile have landed
    // Everyone's copies of wc's tile are visible, and everyone is done with the previous tile
    // (and the merge scratch), whose stage (wr) is refilled now.
    __syncthreads();
    issue(wr);

    if (wc.pair != q_pair) enter_pair();

    const uint16_t* ks = stages + rd * SE;
    const uint16_t* vs = ks + T * KS;
    auto kfrag = [&](int tb, int kk) { return ldsm_rows(ks + tb * KS + 16 * kk, KS, lane); };
    auto vfrag = [&](int tb, int n) {
      if constexpr (Cfg::kVTrans) return ldsm_rows(vs + 16 * n * VTS + tb, VTS, lane);
      else return ldsm_cols(vs + tb * KS + 16 * n, KS, lane);
    };
    constexpr bool kLazy = PK_DECODE_LAZY;
    if (active) {  // a tile below ctx needs no mask (the last one of a sequence does)
      if (PK_DECODE_FULL_TILES && wc.c0 + T <= wc.ctx)
        consume_tile<Cfg, false, kLazy>(rs, qf, wc.c0, lim, p.scale_log2, ts, lane, kfrag, vfrag);
      else
        consume_tile<Cfg, true, kLazy>(rs, qf, wc.c0, lim, p.scale_log2, ts, lane, kfrag, vfrag);
    }

    if (wc.c0 + T >= wc.kend) {  // the item's last tile: merge, write, reset
      float big_m[kRows], big_l[kRows];
      merge_slices<Cfg>(rs, reinterpret_cast<float*>(stages + rd * SE), red_m, red_l, wave, ts,
                        rt, lane, big_m, big_l);
      if (ts == 0 && active)
        write_rows<Cfg>(p, rs, big_m, big_l, rt, lane, nrows, wc.seq, head0, true, direct,
                        wc.part, 1.f);
      rs.reset();
    }
    walker_next<T>(wc, p);
    rd = rd + 1 == NS ? 0 : rd + 1;
    wr = wr + 1 == NS ? 0 : wr + 1;
  }
  cp_async_wait<0>();  // only empty groups remain
}

}  // namespace pk
#endif

// pk_guard.h: the metadata guards every kernel runs in the default build.
//
// Contract (decode, extend and the combine alike): nothing outside the tensors passed in is
// ever read or written, whatever the metadata holds. A kernel checks what it derives from
// metadata before using it as an address:
//   * seq_len in [0, table_width * page_size]: positions stay within the block table's width;
//   * every block id a program reads from its table rows in [0, num_blocks);
//   * extend: cu_seqlens_q[s] <= cu_seqlens_q[s + 1] within [0, num_tokens], a query length
//     <= seq_len and <= max_q_len (the grid's rows).
// A sequence (decode: every query head; extend: every row of the request, every head) with bad
// metadata is written as NaN, lse NaN too, and reads no KV; the other sequences of the batch
// are computed exactly as without the guards. A program that finds bad metadata adds 1 to
// *p.errors (when set) with an atomic add: no host sync.
//
// The table entries a program will read are checked before its tile loop (table_range_bad +
// block_any), so the loop itself carries no checks. Torch-free.
#pragma once

#include "attn_params.h"
#include "pk_port.h"

namespace pk {

// NaN as the output's 16-bit type and as float.
PK_DEVICE float nan_f32() { return __builtin_nanf(""); }

// seq_len within [0, table_width * page_size] (the host keeps the product below 2^31).
PK_DEVICE bool seq_len_bad(const AttnParams& p, int len) {
  return len < 0 || int64_t(len) > int64_t(p.table_width) * p.page_size;
}

// This thread's share of the check of the table entries that hold keys [kbeg, kend) of one
// table row: true when one of them is outside [0, num_blocks). Threads 0..nthreads-1 split the
// entries; 4 loads in flight per thread (a partition of 512 keys at block size 16 is 32
// entries, one per thread; a one-pass sequence of 32768 keys is 2048).
PK_DEVICE bool table_range_bad(const AttnParams& p, const int* row, int kbeg, int kend,
                               int nthreads) {
  const int lg = __ffs(p.page_size) - 1;  // page_size: a power of 2
  const int last = (kend + p.page_size - 1) >> lg;
  bool bad = false;
#pragma unroll 4
  for (int i = (kbeg >> lg) + static_cast<int>(threadIdx.x); i < last; i += nthreads)
    bad |= static_cast<uint32_t>(row[i]) >= static_cast<uint32_t>(p.num_blocks);
  return bad;
}

// Whether `pred` holds in any thread of the block; a barrier. Every thread of the block calls
// it, once per kernel (the HIP form reuses one shared flag).
PK_DEVICE bool block_any(bool pred) {
#if defined(PK_HIP)
  __shared__ int any;
  if (threadIdx.x == 0) any = 0;
  __syncthreads();
  if (pred) any = 1;  // every writer stores the same value
  __syncthreads();
  return any != 0;
#else
  return __syncthreads_or(pred) != 0;
#endif
}

// out[r, head, :] = NaN and lse[r, head] = NaN for rows r in [r0, r1) (extend: the rows of a
// request with bad metadata). QT: the output's 16-bit type.
template <class QT, int D>
PK_DEVICE void write_nan_rows(const AttnParams& p, int64_t r0, int64_t r1, int head,
                              int nthreads) {
  const uint16_t nan16 = from_float(QT{}, nan_f32());
  uint16_t* out = static_cast<uint16_t*>(p.out);
#pragma unroll 1
  for (int64_t i = threadIdx.x; i < (r1 - r0) * D; i += nthreads) {
    const int64_t r = r0 + i / D;
    out[r * p.o_stride_tok + int64_t(head) * p.o_stride_head + i % D] = nan16;
  }
  if (p.lse) {
#pragma unroll 1
    for (int64_t r = r0 + threadIdx.x; r < r1; r += nthreads)
      p.lse[r * p.num_q_heads + head] = nan_f32();
  }
}

// One thread per program that found bad metadata counts it.
PK_DEVICE void count_error(const AttnParams& p, bool bad) {
  if (bad && p.errors != nullptr && threadIdx.x == 0) atomicAdd(p.errors, 1);
}

}  // namespace pk

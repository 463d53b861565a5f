// combine.cuh: the split-KV combine of the decode kernels (attn_kernel.cuh, decode_cs.cuh), one
// launch after the partition states are parked. Torch-free.
#pragma once

#include "attn_params.h"
#include "pk_guard.h"
#include "pk_port.h"

namespace pk {

// Split-KV combine: fold the partition states in partition order with merge_state, out = A / L.
// A sequence's partition count depends on it alone, and the one-pass decode folds with the same
// merge_state in the same order: outputs are bitwise equal whatever the launch shape. An empty
// sequence has one neutral partition: out 0, lse -inf. A sequence with a bad seq_len (nothing
// read), or a partition parked with a NaN max (its decode block found bad metadata), gives NaN
// rows and lse (pk_guard.h).
// Latency: one round trip per kGroup = 64 partitions ((1, 32768) at partition 512). The block
// fetches each partition's (m, l) once into shared memory, every thread its column of each
// accumulator; a group's loads are independent, so they are all in flight at once. On sm_90 the
// kernel is launched as a programmatic dependent of the decode grid and waits for it only
// before its first workspace read.
// grid (Hq, S), D threads (thread = column).
template <class QT, int D>
__global__ void __launch_bounds__(D) combine_kernel(const AttnParams p) {
  constexpr int kGroup = 64;  // partitions per round trip; thread u < kGroup fetches (m_u, l_u)
  static_assert(D >= kGroup, "one (m, l) fetch per thread");
  __shared__ float sm_m[kGroup], sm_l[kGroup];
  const int head = blockIdx.x, seq = blockIdx.y, tid = threadIdx.x;
  const int ctx = p.seq_lens[seq];
  bool bad = seq_len_bad(p, ctx);
  const int parts = bad ? 0 : max(1, (ctx + p.partition_size - 1) / p.partition_size);
  const int64_t base = (int64_t(seq) * p.num_q_heads + head) * p.max_partitions;
  grid_dependency_wait();
  float M = kNegInf, L = 0.f, A = 0.f;
  for (int g = 0; g < parts; g += kGroup) {
    const int n = min(kGroup, parts - g);
    if (g > 0) __syncthreads();  // the previous group's (m, l) are read
    if (tid < n) {
      sm_m[tid] = p.max_logits[base + g + tid];
      sm_l[tid] = p.exp_sums[base + g + tid];
    }
    float av[kGroup];  // (kGroup) this thread's column of each accumulator
#pragma unroll
    for (int u = 0; u < kGroup; ++u)
      av[u] = u < n ? p.tmp_out[(base + g + u) * D + tid] : 0.f;
    __syncthreads();
#pragma unroll
    for (int u = 0; u < kGroup; ++u) {
      if (u < n) {  // no early exit: the loop unrolls fully and av stays in registers
        bad |= __builtin_isnan(sm_m[u]);
        A = merge_acc(A, av[u], merge_state(M, L, sm_m[u], sm_l[u]));
      }
    }
  }
  const float inv = bad ? nan_f32() : L > 0.f ? 1.f / L : 0.f;
  uint16_t* ob = static_cast<uint16_t*>(p.out) + int64_t(seq) * p.o_stride_tok + head * p.o_stride_head;
  ob[tid] = from_float(QT{}, A * inv);
  if (p.lse && tid == 0)
    p.lse[int64_t(seq) * p.num_q_heads + head] = bad ? nan_f32() : lse_of(M, L);
}

}  // namespace pk

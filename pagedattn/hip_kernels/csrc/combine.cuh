// combine.cuh: the split-KV combine of the decode kernels (attn_kernel.cuh, decode_cs.cuh), one
// launch after the partition states are parked. Torch-free.
#pragma once

#include "attn_params.h"
#include "pk_port.h"

namespace pk {

// Split-KV combine (HIP.md §4.5): fold the partition states in partition order with
// merge_state, out = A / L. grid (Hq, S), D threads (thread = column). A sequence's partition
// count depends on it alone, and the one-pass decode folds with the same merge_state in the same
// order: outputs are bitwise equal whatever the launch shape. An empty sequence has one neutral
// partition: out 0, lse -inf.
// Latency: kGroup partitions' states are loaded at once (one round trip per group; H200 session
// 6: (1, 32768) had 64 dependent loads in flight 8 at a time). On sm_90 the kernel is launched
// as a programmatic dependent of the decode grid and waits for it only before its first
// workspace read.
template <class QT, int D>
__global__ void __launch_bounds__(D) combine_kernel(const AttnParams p) {
  constexpr int kGroup = 32;
  const int head = blockIdx.x, seq = blockIdx.y, tid = threadIdx.x;
  const int ctx = p.seq_lens[seq];
  const int parts = max(1, (ctx + p.partition_size - 1) / p.partition_size);
  const int64_t base = (int64_t(seq) * p.num_q_heads + head) * p.max_partitions;
  grid_dependency_wait();
  float M = kNegInf, L = 0.f, A = 0.f;
  for (int g = 0; g < parts; g += kGroup) {
    float mv[kGroup], lv[kGroup], av[kGroup];
#pragma unroll
    for (int u = 0; u < kGroup; ++u) {
      const bool ok = g + u < parts;
      mv[u] = ok ? p.max_logits[base + g + u] : kNegInf;
      lv[u] = ok ? p.exp_sums[base + g + u] : 0.f;
      av[u] = ok ? p.tmp_out[(base + g + u) * D + tid] : 0.f;
    }
#pragma unroll
    for (int u = 0; u < kGroup; ++u) {
      if (g + u >= parts) break;
      A = merge_acc(A, av[u], merge_state(M, L, mv[u], lv[u]));
    }
  }
  const float inv = L > 0.f ? 1.f / L : 0.f;
  uint16_t* ob = static_cast<uint16_t*>(p.out) + int64_t(seq) * p.o_stride_tok + head * p.o_stride_head;
  ob[tid] = from_float(QT{}, A * inv);
  if (p.lse && tid == 0)
    p.lse[int64_t(seq) * p.num_q_heads + head] = lse_of(M, L);
}

}  // namespace pk

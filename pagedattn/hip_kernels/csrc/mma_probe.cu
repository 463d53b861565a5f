// mma_probe.cu: the matrix-unit layout probe of the first-run self-check
// (pagedattn.hip_kernels.mma_probe). One wave runs known 16x16 tiles through the mma
// abstraction exactly as the attention kernels do (pk_mma.h: frag_row/frag_k operand loads,
// mma_nt, acc_x/acc_y stores), so a wrong lane map or a wrong MMAC/MFMA/mma.sync operand order
// shows as C != A B^T on this device, apart from any attention kernel. Torch-free.
#include "attn_launch.h"
#include "pk_mma.h"

namespace pk {

// c[x][y] = sum_k a[x][k] * b[y][k]: a, b (16, 16) row-major 16-bit, c (16, 16) fp32.
// One block of one wave.
template <class T>
__global__ void __launch_bounds__(kWave) mma_nt_probe(const uint16_t* a, const uint16_t* b,
                                                        float* c) {
  const int lane = lane_id();
  Frag x, y;  // (16 rows, 16 k) each
#pragma unroll
  for (int r = 0; r < kFragRegs; ++r) {
    const int k = frag_k(lane, r);  // the pair (k, k + 1)
    x.r[r] = static_cast<uint32_t>(a[frag_row(lane, r) * 16 + k]) |
             (static_cast<uint32_t>(a[frag_row(lane, r) * 16 + k + 1]) << 16);
    y.r[r] = static_cast<uint32_t>(b[frag_row(lane, r) * 16 + k]) |
             (static_cast<uint32_t>(b[frag_row(lane, r) * 16 + k + 1]) << 16);
  }
  Acc acc;
  zero(acc);
  mma_nt<T>(acc, x, y);
#pragma unroll
  for (int i = 0; i < kAccSlots; ++i) c[acc_x(lane, i) * 16 + acc_y(lane, i)] = acc.v[i];
}

const char* launch_mma_probe(const void* a, const void* b, float* c, bool bf16, void* stream) {
  auto s = static_cast<stream_t>(stream);
  const auto* a16 = static_cast<const uint16_t*>(a);
  const auto* b16 = static_cast<const uint16_t*>(b);
  if (bf16)
    mma_nt_probe<pk::bf16><<<1, kWave, 0, s>>>(a16, b16, c);
  else
    mma_nt_probe<pk::f16><<<1, kWave, 0, s>>>(a16, b16, c);
  return last_launch_error();
}

}  // namespace pk

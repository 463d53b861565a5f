// mmac_shim.h: a syntax check of the Hygon MMAC branch on gfx90a. No compiler here knows
// gfx928/936/938/92a/946, so the real MMAC builtin lines of pk_mma.h are never compiled here
// (tests/test_hip_compile_amd.py checks on the preprocessed source which builtins each arch
// selects); this shim type-checks the MMAC layout code (kperm, the "jump" accumulator) instead.
// Force-included (-include) before the sources: it selects the MMAC code path (PK_EMULATE_MMAC)
// and provides the MMAC builtins as MFMA plus the 4x4 (lane group, slot) transpose that maps the
// MFMA accumulator layout (x = l%16, y = 4g+i) onto MMAC's "jump" layout (x = l%16, y = g+4i).
// The transpose is an involution, so the same function converts both ways. It would also run
// correctly on an MI-class GPU; it proves nothing about real MMAC hardware.
#pragma once

#include <hip/hip_runtime.h>

#define PK_EMULATE_MMAC 1
#define PK_MMAC_SHIM 1

typedef _Float16 pk_shim_half4 __attribute__((ext_vector_type(4)));
typedef short pk_shim_short4 __attribute__((ext_vector_type(4)));
typedef float pk_shim_float4 __attribute__((ext_vector_type(4)));

__device__ inline pk_shim_float4 pk_shim_transpose(pk_shim_float4 c) {
  const int l = threadIdx.x & 63, g = l >> 4;
  pk_shim_float4 r = c;
#pragma unroll
  for (int i = 0; i < 4; ++i) {    // destination slot i <- lane (l%16 + 16 i), slot g
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      const float t = __shfl(c[s], (l & 15) + 16 * i);
      if (s == g) r[i] = t;
    }
  }
  return r;
}

__device__ inline pk_shim_float4 pk_shim_mmac_f16(pk_shim_half4 x, pk_shim_half4 y, pk_shim_float4 c) {
#if defined(__HIP_DEVICE_COMPILE__)
  return pk_shim_transpose(__builtin_amdgcn_mfma_f32_16x16x16f16(y, x, pk_shim_transpose(c), 0, 0, 0));
#else
  return c;
#endif
}

__device__ inline pk_shim_float4 pk_shim_mmac_bf16(pk_shim_short4 x, pk_shim_short4 y, pk_shim_float4 c) {
#if defined(__HIP_DEVICE_COMPILE__)
  return pk_shim_transpose(
      __builtin_amdgcn_mfma_f32_16x16x16bf16_1k(y, x, pk_shim_transpose(c), 0, 0, 0));
#else
  return c;
#endif
}

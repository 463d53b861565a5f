// pk_port.h: the portability layer. HIP is tested first; CUDA lives in the #else
// branch, because torch's hipify rewrites CUDA names (and __CUDACC__) in the copies it compiles.
// Kernels use only the names defined here: wave size, shuffles, wave-uniform hints, exp2,
// 16-bit <-> float conversions, fp8 decoding and 16-byte global loads.
#pragma once

#include <stdint.h>

#include <utility>

#if defined(__HIP__) || defined(__HIP_PLATFORM_AMD__) || defined(USE_ROCM)
#define PK_HIP 1
#include <hip/hip_runtime.h>
#else
#define PK_CUDA 1
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#endif

// ---------------------------------------------------------------------------------------------
// Backend selector: set in the device pass only; the host pass compiles every fallback. The
// matrix unit is chosen by arch, never by __has_builtin (DTK's answer is not decisive for the
// Hygon forms):
//   PK_MMA_MMAC          Hygon MMAC, "jump" accumulator layout (pk_mma.h), with
//     PK_MMAC_PLAIN      gfx936/gfx928: __builtin_amdgcn_mmac_f32_16x16x16{f16,bf16}(a, b, c)
//     PK_MMAC_LIT_LTS    gfx938/gfx92a/gfx946: __builtin_hcu_mmac_f32_16x16x16_{f16,bf16}_lit_lts
//                        (a, b, c, lit = false, lts = false)
//   PK_MMA_MFMA          AMD CDNA gfx90a/gfx94x
//   PK_MMA_SM80          NVIDIA sm_80+ (2 x mma.sync m16n8k16)
// PK_EMULATE_MMAC (csrc/compile_check/mmac_shim.h) routes gfx90a through the MMAC code path
// with the builtins emulated by MFMA: no compiler here knows the Hygon targets.
// ---------------------------------------------------------------------------------------------
#if defined(__HIP_DEVICE_COMPILE__)
#if defined(PK_EMULATE_MMAC)
#define PK_MMA_MMAC 1
#elif defined(__gfx936__) || defined(__gfx928__)
#define PK_MMA_MMAC 1
#define PK_MMAC_PLAIN 1
#elif defined(__gfx938__) || defined(__gfx92a__) || defined(__gfx946__)
#define PK_MMA_MMAC 1
#define PK_MMAC_LIT_LTS 1
#elif defined(__gfx90a__) || defined(__gfx940__) || defined(__gfx941__) || defined(__gfx942__)
#define PK_MMA_MFMA 1
#else
#error "pk: unsupported AMD target (need gfx90a/gfx94x MFMA or Hygon gfx928/936/938/92a/946 MMAC)"
#endif
#elif defined(__CUDA_ARCH__)
#if __CUDA_ARCH__ >= 800
#define PK_MMA_SM80 1
#else
#error "pk: need sm_80+ (mma.sync m16n8k16 with bf16)"
#endif
#endif

#define PK_DEVICE __device__ __forceinline__

// __launch_bounds__(threads, min blocks per SM) on NVIDIA. HIP lowers the second argument to a
// waves-per-EU hint of another meaning, so AMD gets the first one only.
#if defined(PK_HIP)
#define PK_LAUNCH_BOUNDS(threads, min_blocks) __launch_bounds__(threads)
#else
#define PK_LAUNCH_BOUNDS(threads, min_blocks) __launch_bounds__(threads, min_blocks)
#endif

namespace pk {

#if defined(PK_HIP)
constexpr int kWave = 64;  // gfx9 family incl. Hygon; never warpSize (not constexpr on ROCm 7)
using stream_t = hipStream_t;
#else
constexpr int kWave = 32;
using stream_t = cudaStream_t;
#endif

PK_DEVICE int lane_id() { return threadIdx.x & (kWave - 1); }
PK_DEVICE int wave_id() { return threadIdx.x / kWave; }

PK_DEVICE float shfl_xor(float v, int mask) {
#if defined(PK_HIP)
  return __shfl_xor(v, mask);  // ds_bpermute_b32; no 64-bit-mask *_sync needed (DTK, ROCm 5)
#else
  return __shfl_xor_sync(0xffffffffu, v, mask);
#endif
}

PK_DEVICE float shfl(float v, int src) {
#if defined(PK_HIP)
  return __shfl(v, src);
#else
  return __shfl_sync(0xffffffffu, v, src);
#endif
}

// A value the caller knows to be equal in every lane: keep it in SGPRs on AMD.
PK_DEVICE int uniform(int v) {
#if defined(PK_HIP) && defined(__HIP_DEVICE_COMPILE__)
  return __builtin_amdgcn_readfirstlane(v);
#else
  return v;
#endif
}

PK_DEVICE int64_t uniform64(int64_t v) {
#if defined(PK_HIP) && defined(__HIP_DEVICE_COMPILE__)
  const uint64_t u = static_cast<uint64_t>(v);
  const uint32_t lo = __builtin_amdgcn_readfirstlane(static_cast<int>(u & 0xffffffffu));
  const uint32_t hi = __builtin_amdgcn_readfirstlane(static_cast<int>(u >> 32));
  return static_cast<int64_t>((static_cast<uint64_t>(hi) << 32) | lo);
#else
  return v;
#endif
}

// exp2 of a float; exp2(-inf) == 0. The kernels fold scale*log2(e) into one multiplier.
PK_DEVICE float exp2(float x) {
#if defined(PK_HIP)
#if defined(__HIP_DEVICE_COMPILE__) && __has_builtin(__builtin_amdgcn_exp2f)
  return __builtin_amdgcn_exp2f(x);  // clang-19 and DTK; clang-15 lacks it
#else
  return exp2f(x);
#endif
#else
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#endif
}

PK_DEVICE float fmax(float a, float b) { return __builtin_fmaxf(a, b); }

// f(std::integral_constant<int, i>) for i = 0 .. N-1: array indices that are constants in the
// source, not only after unrolling. AMDGPU's promote-alloca pass runs before loop unrolling and
// moves small arrays indexed by a loop variable into LDS or scratch.
template <class F, int... I>
PK_DEVICE void static_for_impl(F&& f, std::integer_sequence<int, I...>) {
  (f(std::integral_constant<int, I>{}), ...);
}
template <int N, class F>
PK_DEVICE void static_for(F&& f) {
  static_for_impl(f, std::make_integer_sequence<int, N>{});
}

constexpr float kNegInf = -__builtin_huge_valf();

// log2 for the epilogues (not in any inner loop).
PK_DEVICE float log2_(float x) {
#if defined(PK_HIP)
  return log2f(x);
#else
  return __log2f(x);
#endif
}

// Partition-state merge (split-KV): a state is (M, L, A): row max in log2 units, row sum, and
// the unnormalised output. Folding (m_p, l_p, A_p) into (M, L, A): M' = max(M, m_p),
// a = 2^(M - M'), b = 2^(m_p - M'), L' = l_p b + L a, A' = A_p b + A a. Every kernel that merges
// (the split combine, the one-pass decode) calls these two, so they round alike; a neutral state
// (-inf, 0, 0) folds as an exact identity and never makes a NaN.
struct MergeFactors {
  float a, b;
};
PK_DEVICE MergeFactors merge_state(float& M, float& L, float m_p, float l_p) {
  const float mn = fmax(M, m_p);
  const float ms = mn == kNegInf ? 0.f : mn;
  const MergeFactors f{exp2(M - ms), exp2(m_p - ms)};
  L = fmaf(l_p, f.b, __fmul_rn(L, f.a));
  M = mn;
  return f;
}
PK_DEVICE float merge_acc(float A, float A_p, MergeFactors f) {
  return fmaf(A_p, f.b, __fmul_rn(A, f.a));
}
// Natural-log LSE of a final state; -inf for a row with no key.
PK_DEVICE float lse_of(float M, float L) {
  return L > 0.f ? (M + log2_(L)) * 0.69314718055994531f : kNegInf;
}

// Programmatic dependent launch (sm_90+; no-ops elsewhere and when launched without the
// attribute): the primary lets its dependent grid start early, the dependent waits for the
// primary's completion and memory before reading what it wrote.
PK_DEVICE void grid_dependency_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
PK_DEVICE void grid_dependency_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

PK_DEVICE float as_float(uint32_t u) {
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
}
PK_DEVICE uint32_t as_uint(float f) {
  uint32_t u;
  __builtin_memcpy(&u, &f, 4);
  return u;
}

// ---------------------------------------------------------------------------------------------
// 16-bit element types. Storage is raw uint16_t everywhere (torch disables the half operators);
// math is fp32 with explicit conversions. Tags select the conversion and the MMA flavour.
// ---------------------------------------------------------------------------------------------
struct f16 {
  static constexpr int kBytes = 2;
  static constexpr bool kIsBf16 = false;
};
struct bf16 {
  static constexpr int kBytes = 2;
  static constexpr bool kIsBf16 = true;
};
struct e4m3 {
  static constexpr int kBytes = 1;
};
struct e5m2 {
  static constexpr int kBytes = 1;
};

PK_DEVICE float to_float(f16, uint16_t b) {
#if defined(PK_HIP)
  return static_cast<float>(__builtin_bit_cast(_Float16, b));
#else
  return __half2float(__ushort_as_half(b));
#endif
}
PK_DEVICE float to_float(bf16, uint16_t b) { return as_float(static_cast<uint32_t>(b) << 16); }

PK_DEVICE uint16_t from_float(f16, float x) {
#if defined(PK_HIP)
  return __builtin_bit_cast(uint16_t, static_cast<_Float16>(x));
#else
  return __half_as_ushort(__float2half_rn(x));
#endif
}
PK_DEVICE uint16_t from_float(bf16, float x) {
#if defined(PK_HIP)
  const uint32_t u = as_uint(x);  // round to nearest even; NaN stays NaN
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
#else
  return __bfloat16_as_ushort(__float2bfloat16_rn(x));
#endif
}

// Two floats -> one 32-bit register holding (lo, hi) 16-bit values.
template <class T>
PK_DEVICE uint32_t pack2(float lo, float hi) {
#if defined(PK_CUDA)
  if constexpr (T::kIsBf16) {
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    uint32_t u;
    __builtin_memcpy(&u, &h, 4);
    return u;
  } else {
    __half2 h = __floats2half2_rn(lo, hi);
    uint32_t u;
    __builtin_memcpy(&u, &h, 4);
    return u;
  }
#else
  return static_cast<uint32_t>(from_float(T{}, lo)) |
         (static_cast<uint32_t>(from_float(T{}, hi)) << 16);
#endif
}

// fp8 -> float, exact. e5m2 is the top byte of an fp16. e4m3fn (bias 7) shifted into fp16
// position (bias 15) is off by 2^8 for normals and subnormals alike; its NaN (0x7f) is never
// decoded here because the kernels zero every slot they may not read.
PK_DEVICE float fp8_to_float(e5m2, uint32_t b) { return to_float(f16{}, static_cast<uint16_t>(b << 8)); }
PK_DEVICE float fp8_to_float(e4m3, uint32_t b) {
  const uint16_t h = static_cast<uint16_t>(((b & 0x80u) << 8) | ((b & 0x7fu) << 7));
  return to_float(f16{}, h) * 256.0f;
}

// ---------------------------------------------------------------------------------------------
// 16-byte vectors and shared-memory access.
// ---------------------------------------------------------------------------------------------
struct alignas(16) vec16 {
  uint32_t w[4];
};

PK_DEVICE vec16 zero16() { return vec16{{0u, 0u, 0u, 0u}}; }

// Read-only 16-byte global load through a plain pointer (NVIDIA: ld.global.nc.v4).
PK_DEVICE vec16 ldg16(const void* p) {
#if defined(PK_CUDA)
  uint4 v = __ldg(reinterpret_cast<const uint4*>(p));
  return vec16{{v.x, v.y, v.z, v.w}};
#else
  return *reinterpret_cast<const vec16*>(p);
#endif
}

// The error of the last launch as a string, or nullptr.
inline const char* last_launch_error() {
#if defined(PK_HIP)
  const hipError_t e = hipGetLastError();
  return e == hipSuccess ? nullptr : hipGetErrorString(e);
#else
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
#endif
}

}  // namespace pk

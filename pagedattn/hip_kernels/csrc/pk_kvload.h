// pk_kvload.h: 16-byte KV loads from a wave-uniform 64-bit base plus a small per-lane offset.
//
// AMD/Hygon: the base becomes a 128-bit buffer resource descriptor (V#) held in SGPRs; the lane
// offset is the 32-bit voffset. A masked lane gets voffset | 0x80000000, past num_records, and
// the hardware returns zeros (CK's invalid-element-offset trick; num_records stays below it).
// NVIDIA: the same base is a plain pointer; masked lanes skip the load and read zeros.
//
// The caller advances the base per KV tile by k_delta = table_diff * page_stride +
// offset_diff * token_stride, in int64 and wave-uniform, so the 32-bit
// voffset never has to span the pool.
#pragma once

#include "pk_port.h"

namespace pk {

#if defined(PK_HIP)
typedef int pk_int4 __attribute__((ext_vector_type(4)));

// Declared through the LLVM intrinsic name: works on clang-15 (hipcc 5.2), clang-19 and DTK.
// Kept in this one header because upstream calls the <4 x i32> forms legacy (llvm PR #148950).
__device__ pk_int4 pk_raw_buffer_load_v4i32(pk_int4 rsrc, int voffset, int soffset, int aux)
    __asm("llvm.amdgcn.raw.buffer.load.v4i32");

constexpr uint32_t kBufferConfig = 0x00020000u;  // dword 3 on gfx9/CDNA and Hygon (CK ck.hpp)
constexpr uint32_t kNumRecords = 0x7ffffff0u;    // below the 0x80000000 poison offset
constexpr int kOobOffset = static_cast<int>(0x80000000u);

PK_DEVICE pk_int4 make_rsrc(const void* base) {
  const uint64_t a = reinterpret_cast<uint64_t>(base);
  pk_int4 r;
  r[0] = uniform(static_cast<int>(a & 0xffffffffu));
  r[1] = uniform(static_cast<int>((a >> 32) & 0xffffu));  // stride 0, no swizzle: raw buffer
  r[2] = static_cast<int>(kNumRecords);
  r[3] = static_cast<int>(kBufferConfig);
  return r;
}
#endif

// 16 bytes at base + voff (bytes); zeros when !valid. `base` must be wave-uniform.
PK_DEVICE vec16 load16(const char* base, int voff, bool valid) {
#if defined(PK_HIP) && defined(__HIP_DEVICE_COMPILE__)
  const pk_int4 v = pk_raw_buffer_load_v4i32(make_rsrc(base), valid ? voff : (voff | kOobOffset),
                                             0, 0);
  return vec16{{static_cast<uint32_t>(v[0]), static_cast<uint32_t>(v[1]),
                static_cast<uint32_t>(v[2]), static_cast<uint32_t>(v[3])}};
#else
  return valid ? ldg16(base + voff) : zero16();
#endif
}

}  // namespace pk

// attn_launch.h: host-side declarations of the launchers defined in attn_<q>_<kv>.cu and
// mma_probe.cu. No GPU or torch headers: bindings.cpp includes this with the host compiler.
#pragma once

#include "attn_params.h"

namespace pk {

const char* launch_decode_f16_f16(AttnParams& p, int head_dim, bool v_trans, void* stream, bool go);
const char* launch_decode_f16_e4m3(AttnParams& p, int head_dim, bool v_trans, void* stream, bool go);
const char* launch_decode_f16_e5m2(AttnParams& p, int head_dim, bool v_trans, void* stream, bool go);
const char* launch_decode_bf16_bf16(AttnParams& p, int head_dim, bool v_trans, void* stream, bool go);
const char* launch_decode_bf16_e4m3(AttnParams& p, int head_dim, bool v_trans, void* stream, bool go);
const char* launch_decode_bf16_e5m2(AttnParams& p, int head_dim, bool v_trans, void* stream, bool go);
const char* launch_extend_f16(const AttnParams& p, int head_dim, void* stream);
const char* launch_extend_bf16(const AttnParams& p, int head_dim, void* stream);
// mma_probe.cu: c (16, 16) fp32 = a b^T for 16-bit a, b (16, 16), through pk_mma.h.
const char* launch_mma_probe(const void* a, const void* b, float* c, bool bf16, void* stream);

// kv_dtype == q_dtype for 16-bit caches. go == false resolves the launch shape into p
// (one_pass: no split workspace needed) and launches nothing.
inline const char* launch_decode(AttnParams& p, DType q_dtype, DType kv_dtype, int head_dim,
                                 bool v_trans, void* stream, bool go) {
  const bool bf = q_dtype == kBF16;
  switch (kv_dtype) {
    case kE4M3:
      return (bf ? launch_decode_bf16_e4m3 : launch_decode_f16_e4m3)(p, head_dim, v_trans, stream, go);
    case kE5M2:
      return (bf ? launch_decode_bf16_e5m2 : launch_decode_f16_e5m2)(p, head_dim, v_trans, stream, go);
    default:
      return (bf ? launch_decode_bf16_bf16 : launch_decode_f16_f16)(p, head_dim, v_trans, stream, go);
  }
}

inline const char* launch_extend(const AttnParams& p, DType q_dtype, int head_dim, void* stream) {
  return (q_dtype == kBF16 ? launch_extend_bf16 : launch_extend_f16)(p, head_dim, stream);
}

}  // namespace pk

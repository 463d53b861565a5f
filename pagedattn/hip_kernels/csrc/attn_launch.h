// attn_launch.h: host-side declarations of the launchers defined in attn_<q>_<kv>.cu. No GPU or
// torch headers: bindings.cpp includes this with the host compiler.
#pragma once

#include "attn_params.h"

namespace pk {

const char* launch_decode_f16_f16(const AttnParams& p, int head_dim, bool v_trans, void* stream);
const char* launch_decode_f16_e4m3(const AttnParams& p, int head_dim, bool v_trans, void* stream);
const char* launch_decode_f16_e5m2(const AttnParams& p, int head_dim, bool v_trans, void* stream);
const char* launch_decode_bf16_bf16(const AttnParams& p, int head_dim, bool v_trans, void* stream);
const char* launch_decode_bf16_e4m3(const AttnParams& p, int head_dim, bool v_trans, void* stream);
const char* launch_decode_bf16_e5m2(const AttnParams& p, int head_dim, bool v_trans, void* stream);
const char* launch_extend_f16(const AttnParams& p, int head_dim, void* stream);
const char* launch_extend_bf16(const AttnParams& p, int head_dim, void* stream);

// kv_dtype == q_dtype for 16-bit caches.
inline const char* launch_decode(const AttnParams& p, DType q_dtype, DType kv_dtype, int head_dim,
                                 bool v_trans, void* stream) {
  const bool bf = q_dtype == kBF16;
  switch (kv_dtype) {
    case kE4M3:
      return (bf ? launch_decode_bf16_e4m3 : launch_decode_f16_e4m3)(p, head_dim, v_trans, stream);
    case kE5M2:
      return (bf ? launch_decode_bf16_e5m2 : launch_decode_f16_e5m2)(p, head_dim, v_trans, stream);
    default:
      return (bf ? launch_decode_bf16_bf16 : launch_decode_f16_f16)(p, head_dim, v_trans, stream);
  }
}

inline const char* launch_extend(const AttnParams& p, DType q_dtype, int head_dim, void* stream) {
  return (q_dtype == kBF16 ? launch_extend_bf16 : launch_extend_f16)(p, head_dim, stream);
}

}  // namespace pk

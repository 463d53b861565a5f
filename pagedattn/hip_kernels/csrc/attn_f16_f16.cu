// Decode kernels for q=f16, kv=f16 (see attn_inst.cuh).
#include "attn_inst.cuh"

PK_DEFINE_DECODE(f16, f16)
PK_DEFINE_EXTEND(f16)

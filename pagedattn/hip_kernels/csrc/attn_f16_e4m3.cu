// Decode kernels for q=f16, kv=e4m3 (see attn_inst.cuh).
#include "attn_inst.cuh"

PK_DEFINE_DECODE(f16, e4m3)

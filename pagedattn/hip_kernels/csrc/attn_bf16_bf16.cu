// Decode kernels for q=bf16, kv=bf16 (see attn_inst.cuh).
#include "attn_inst.cuh"

PK_DEFINE_DECODE(bf16, bf16)
PK_DEFINE_EXTEND(bf16)

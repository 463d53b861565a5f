// Standalone instantiation of the attention kernels for the compile-only CI checks
// (tests/test_hip_compile.py): no torch headers, `-c` only. One 16-bit and one fp8 decode
// family (all head dims, V layouts and REUSE_KV_TIMES tile counts) plus extend.
#include "../attn_inst.cuh"

PK_DEFINE_DECODE(f16, f16)
PK_DEFINE_DECODE(bf16, e5m2)
PK_DEFINE_EXTEND(bf16)

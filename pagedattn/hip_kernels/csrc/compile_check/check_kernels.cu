// Standalone instantiation of the attention kernels for the compile-only CI checks
// (tests/test_hip_compile.py): no torch headers, `-c` only. Default: a 16-bit and an fp8 decode
// family (both head dims, both V layouts, every REUSE_KV_TIMES tile count), the combine kernels
// and extend. -DPK_CHECK_ONE keeps one decode family and extend (the slower shim check).
#include "../attn_inst.cuh"

#if !defined(PK_CHECK_ONE)
PK_DEFINE_DECODE(f16, f16)
#endif
PK_DEFINE_DECODE(bf16, e5m2)
PK_DEFINE_EXTEND(f16)

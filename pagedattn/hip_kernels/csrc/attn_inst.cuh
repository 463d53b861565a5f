// attn_inst.cuh: launchers. Included by the per-dtype translation units (attn_<q>_<kv>.cu) and by
// compile_check/check_kernels.cu; torch-free.
#pragma once

#include <atomic>

#include "attn_kernel.cuh"
#include "decode_cs.cuh"

namespace pk {

// REUSE_KV_TIMES: how many query heads one block serves from each KV tile it loads (reference
// §5.2.3). The switch names the specialisations 1..64; the kernel is instantiated per 16-row MMA
// tile count, so REUSE 1..16 share one binary (HIP.md §0.5) and rows past the group are masked.
#define PK_REUSEKV_SWITCH(reuse, ...)                                              \
  [&] {                                                                            \
    if ((reuse) > 48) { constexpr int REUSE_KV_TIMES = 64; return __VA_ARGS__(); } \
    else if ((reuse) > 32) { constexpr int REUSE_KV_TIMES = 48; return __VA_ARGS__(); } \
    else if ((reuse) > 16) { constexpr int REUSE_KV_TIMES = 32; return __VA_ARGS__(); } \
    else if ((reuse) > 8) { constexpr int REUSE_KV_TIMES = 16; return __VA_ARGS__(); } \
    else if ((reuse) > 4) { constexpr int REUSE_KV_TIMES = 8; return __VA_ARGS__(); } \
    else if ((reuse) > 2) { constexpr int REUSE_KV_TIMES = 4; return __VA_ARGS__(); } \
    else if ((reuse) > 1) { constexpr int REUSE_KV_TIMES = 2; return __VA_ARGS__(); } \
    else { constexpr int REUSE_KV_TIMES = 1; return __VA_ARGS__(); }              \
  }()

constexpr int head_tiles_for(int reuse) { return reuse <= 16 ? 1 : reuse <= 32 ? 2 : 4; }

// Dynamic shared memory above 48 KB needs a per-device opt-in (NVIDIA; the pipelined decodes).
// Done once per device and kernel (Cfg names it); nullptr or the error.
template <class Cfg, class Kernel>
const char* opt_in_smem(Kernel kernel, int bytes) {
#if defined(PK_CUDA)
  if (bytes > 48 * 1024) {
    static std::atomic<uint64_t> done{0};  // bit d: device d opted in
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return last_launch_error();
    const uint64_t bit = dev < 64 ? uint64_t(1) << dev : 0;
    if (bit && (done.load(std::memory_order_relaxed) & bit)) return nullptr;
    if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes) !=
        cudaSuccess)
      return last_launch_error();
    done.fetch_or(bit, std::memory_order_relaxed);
  }
#else
  (void)kernel;
  (void)bytes;
#endif
  return nullptr;
}

template <class Cfg>
const char* launch_attn(const AttnParams& p, stream_t stream) {
  if (const char* err = opt_in_smem<Cfg>(attn_kernel<Cfg>, Cfg::dynamic_smem())) return err;
  attn_kernel<Cfg><<<Cfg::grid(p), Cfg::block(), Cfg::dynamic_smem(), stream>>>(p);
  return last_launch_error();
}

#if PK_COLSPLIT_ENABLED
// The column-split decode (groups <= 16, 16-bit cache): attn_kernel's decode grid.
template <class Cfg>
const char* launch_cs(const AttnParams& p, stream_t stream) {
  if (const char* err = opt_in_smem<Cfg>(decode_cs_kernel<Cfg>, Cfg::kSmemBytes)) return err;
  const dim3 grid(p.num_kv_heads * p.blocks_per_kv_head, p.num_seqs, p.max_partitions);
  decode_cs_kernel<Cfg><<<grid, dim3(Cfg::kThreads), Cfg::kSmemBytes, stream>>>(p);
  return last_launch_error();
}
#endif

template <class QT, class KVT, int D, bool VT>
const char* launch_decode_d(const AttnParams& p, stream_t stream) {
  const char* err = PK_REUSEKV_SWITCH(p.heads_per_block, [&] {
    constexpr int kTiles = head_tiles_for(REUSE_KV_TIMES);
#if PK_COLSPLIT_ENABLED
    if constexpr (kTiles == 1 && KVT::kBytes == 2)
      return launch_cs<DecodeCsCfg<QT, D, VT>>(p, stream);
    else
#endif
      return launch_attn<AttnCfg<QT, KVT, D, kTiles, VT, Mode::kDecode>>(p, stream);
  });
  if (err || p.max_partitions == 1) return err;
  combine_kernel<QT, D><<<dim3(p.num_q_heads, p.num_seqs), dim3(D), 0, stream>>>(p);
  return last_launch_error();
}

template <class QT, class KVT>
const char* launch_decode(const AttnParams& p, int head_dim, bool v_trans, void* stream) {
  auto s = static_cast<stream_t>(stream);
  if (head_dim == 64)
    return v_trans ? launch_decode_d<QT, KVT, 64, true>(p, s) : launch_decode_d<QT, KVT, 64, false>(p, s);
  if (head_dim == 128)
    return v_trans ? launch_decode_d<QT, KVT, 128, true>(p, s)
                   : launch_decode_d<QT, KVT, 128, false>(p, s);
  return "pk: head_dim must be 64 or 128";
}

template <class QT>
const char* launch_extend(const AttnParams& p, int head_dim, void* stream) {
  auto s = static_cast<stream_t>(stream);
  if (head_dim == 64) return launch_attn<AttnCfg<QT, QT, 64, 4, false, Mode::kExtend>>(p, s);
  if (head_dim == 128) return launch_attn<AttnCfg<QT, QT, 128, 4, false, Mode::kExtend>>(p, s);
  return "pk: head_dim must be 64 or 128";
}

}  // namespace pk

// One translation unit per (query type, KV type): instantiations compile in parallel.
#define PK_DEFINE_DECODE(QN, KN)                                                        \
  namespace pk {                                                                        \
  const char* launch_decode_##QN##_##KN(const AttnParams& p, int d, bool vt, void* s) { \
    return launch_decode<QN, KN>(p, d, vt, s);                                          \
  }                                                                                     \
  }
#define PK_DEFINE_EXTEND(QN)                                                       \
  namespace pk {                                                                   \
  const char* launch_extend_##QN(const AttnParams& p, int d, void* s) {            \
    return launch_extend<QN>(p, d, s);                                             \
  }                                                                                \
  }

// attn_inst.cuh: launchers. Included by the per-dtype translation units (attn_<q>_<kv>.cu) and by
// compile_check/check_kernels.cu; torch-free.
#pragma once

#include <atomic>

#include "attn_kernel.cuh"
#include "combine.cuh"
#include "decode_cs.cuh"

namespace pk {

// REUSE_KV_TIMES: how many query heads one block serves from each KV tile it loads. The switch
// names the specialisations 1..64; the kernel is instantiated per 16-row MMA tile count, so
// REUSE 1..16 share one binary and rows past the group are masked.
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

// Shared memory above 48 KB per block, static plus dynamic, needs a per-device opt-in (NVIDIA;
// the pipelined decodes): done for any dynamic size, once per device and kernel (Cfg names it);
// nullptr or the error. (48 KB of stages + 2.5 KB static failed to launch without it.)
template <class Cfg, class Kernel>
const char* opt_in_smem(Kernel kernel, int bytes) {
#if defined(PK_CUDA)
  if (bytes > 0) {
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

// go == false: resolve the launch shape into p (one_pass, parts_per_block) and launch nothing;
// the host entry allocates the split workspace only when it is needed, then calls with go.
template <class Cfg>
const char* launch_attn(AttnParams& p, stream_t stream, bool go = true) {
  p.one_pass = p.max_partitions == 1;  // one block per partition; a lone one writes out
  p.parts_per_block = 1;
  if (!go) return nullptr;
  if (const char* err = opt_in_smem<Cfg>(attn_kernel<Cfg>, Cfg::dynamic_smem())) return err;
  attn_kernel<Cfg><<<Cfg::grid(p), Cfg::block(), Cfg::dynamic_smem(), stream>>>(p);
  return last_launch_error();
}

// The combine; on sm_90+ NVIDIA as a programmatic dependent of the decode grid just launched
// (it may start while that grid drains and waits for it before reading the partition states).
template <class QT, int D>
const char* launch_combine(const AttnParams& p, stream_t stream) {
  const dim3 grid(p.num_q_heads, p.num_seqs), block(D);
#if defined(PK_CUDA)
  int dev = 0, major = 0;
  if (cudaGetDevice(&dev) == cudaSuccess &&
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
      major >= 9) {
    cudaLaunchConfig_t cfg{};
    cudaLaunchAttribute attr{};
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = 1;
    cfg.gridDim = grid, cfg.blockDim = block, cfg.dynamicSmemBytes = 0, cfg.stream = stream;
    cfg.attrs = &attr, cfg.numAttrs = 1;
    if (cudaLaunchKernelEx(&cfg, combine_kernel<QT, D>, p) != cudaSuccess) return last_launch_error();
    return nullptr;
  }
#endif
  combine_kernel<QT, D><<<grid, block, 0, stream>>>(p);
  return last_launch_error();
}

#if PK_PIPE_ENABLED
template <class Cfg, bool kMerge>
struct CsTag {};  // one opt-in flag per kernel

// Resident blocks per SM of a kernel (occupancy API), cached per device; 1 if unknown.
template <class Tag, class Kernel>
int resident_blocks(Kernel kernel, int threads, int smem) {
  static std::atomic<int> cache[64];
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return 1;
  if (dev < 64 && cache[dev].load(std::memory_order_relaxed) > 0) return cache[dev].load();
  int n = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, threads, smem) != cudaSuccess)
    n = 1;
  n = n > 0 ? n : 1;
  if (dev < 64) cache[dev].store(n, std::memory_order_relaxed);
  return n;
}

inline int num_sms() {
  int dev = 0, n = 1;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
    return 1;
  return n;
}

// The column-split decode (groups <= 16, 16-bit cache): picks the launch shape (decode_cs.cuh).
// One pass when the (head group, sequence) blocks fill every SM kFill times (the Triton rule,
// dispatch.core.FILL); else split with the fewest partitions per block that keep the grid within
// one wave of resident blocks. p.decode_mode / p.parts_per_block force a shape (tests). Every
// shape gives the same bits. Resolving is idempotent: decode_mode and parts_per_block are
// rewritten to the resolved values.
template <class Cfg>
const char* launch_cs(AttnParams& p, stream_t stream, bool go) {
  constexpr int kFill = 3;
  auto merge = decode_cs_kernel<Cfg, true>;
  auto park = decode_cs_kernel<Cfg, false>;
  if (const char* err = opt_in_smem<CsTag<Cfg, true>>(merge, Cfg::kSmemBytes)) return err;
  if (const char* err = opt_in_smem<CsTag<Cfg, false>>(park, Cfg::kSmemBytes)) return err;
  const int64_t blocks = int64_t(p.num_kv_heads) * p.blocks_per_kv_head * p.num_seqs;
  const int sms = num_sms();
  p.one_pass = p.max_partitions == 1 || p.decode_mode == 1 ||
               (p.decode_mode < 0 && blocks >= int64_t(kFill) * sms);
  p.decode_mode = p.one_pass;
  if (p.one_pass) {
    if (!go) return nullptr;
    const dim3 grid(p.num_kv_heads * p.blocks_per_kv_head, p.num_seqs, 1);
    merge<<<grid, dim3(Cfg::kThreads), Cfg::kSmemBytes, stream>>>(p);
    return last_launch_error();
  }
  int ppp = p.parts_per_block;
  if (ppp <= 0) {
    const int64_t slots =
        int64_t(sms) * resident_blocks<Cfg>(park, Cfg::kThreads, Cfg::kSmemBytes);
    ppp = int((blocks * p.max_partitions + slots - 1) / slots);
  }
  p.parts_per_block = ppp < 1 ? 1 : ppp > p.max_partitions ? p.max_partitions : ppp;
  if (!go) return nullptr;
  const dim3 grid(p.num_kv_heads * p.blocks_per_kv_head, p.num_seqs,
                  (p.max_partitions + p.parts_per_block - 1) / p.parts_per_block);
  park<<<grid, dim3(Cfg::kThreads), Cfg::kSmemBytes, stream>>>(p);
  return last_launch_error();
}
#endif

template <class QT, class KVT, int D, bool VT>
const char* launch_decode_d(AttnParams& p, stream_t stream, bool go) {
  const char* err = PK_REUSEKV_SWITCH(p.heads_per_block, [&] {
    constexpr int kTiles = head_tiles_for(REUSE_KV_TIMES);
#if PK_PIPE_ENABLED
    if constexpr (kTiles == 1 && KVT::kBytes == 2)
      return launch_cs<DecodeCsCfg<QT, D, VT>>(p, stream, go);
    else
#endif
      return launch_attn<AttnCfg<QT, KVT, D, kTiles, VT, Mode::kDecode>>(p, stream, go);
  });
  if (err || !go || p.one_pass) return err;
  return launch_combine<QT, D>(p, stream);
}

template <class QT, class KVT>
const char* launch_decode(AttnParams& p, int head_dim, bool v_trans, void* stream, bool go) {
  auto s = static_cast<stream_t>(stream);
  if (head_dim == 64)
    return v_trans ? launch_decode_d<QT, KVT, 64, true>(p, s, go)
                   : launch_decode_d<QT, KVT, 64, false>(p, s, go);
  if (head_dim == 128)
    return v_trans ? launch_decode_d<QT, KVT, 128, true>(p, s, go)
                   : launch_decode_d<QT, KVT, 128, false>(p, s, go);
  return "pk: head_dim must be 64 or 128";
}

template <class QT>
const char* launch_extend(const AttnParams& params, int head_dim, void* stream) {
  auto s = static_cast<stream_t>(stream);
  AttnParams p = params;
  if (head_dim == 64) return launch_attn<AttnCfg<QT, QT, 64, 4, false, Mode::kExtend>>(p, s);
  if (head_dim == 128) return launch_attn<AttnCfg<QT, QT, 128, 4, false, Mode::kExtend>>(p, s);
  return "pk: head_dim must be 64 or 128";
}

}  // namespace pk

// One translation unit per (query type, KV type): instantiations compile in parallel.
#define PK_DEFINE_DECODE(QN, KN)                                                            \
  namespace pk {                                                                            \
  const char* launch_decode_##QN##_##KN(AttnParams& p, int d, bool vt, void* s, bool go) { \
    return launch_decode<QN, KN>(p, d, vt, s, go);                                         \
  }                                                                                         \
  }
#define PK_DEFINE_EXTEND(QN)                                                       \
  namespace pk {                                                                   \
  const char* launch_extend_##QN(const AttnParams& p, int d, void* s) {            \
    return launch_extend<QN>(p, d, s);                                             \
  }                                                                                \
  }

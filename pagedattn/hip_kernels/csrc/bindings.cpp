// bindings.cpp: torch custom ops torch.ops.pagedattn_hip.{paged_decode, extend_attention,
// mma_probe}.
// Host code only (torch APIs, which hipify maps on ROCm). Every tensor is validated in the style
// of flash-attention's flash_api.cpp before anything launches.
#include <torch/library.h>
#include <ATen/ATen.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <type_traits>

#include "attn_launch.h"

namespace {

// Error messages are built with std::to_string, never through an ostream: with torch 2.11 and
// the system g++ of a CUDA host, a TORCH_CHECK that streamed an integer into c10::str's
// ostringstream crashed the process (SIGSEGV), while string and dtype messages raised cleanly.
inline std::string piece(const char* s) { return s; }
inline std::string piece(const std::string& s) { return s; }
inline std::string piece(at::ScalarType t) { return c10::toString(t); }
inline std::string piece(const at::Device& d) { return d.str(); }
template <class T, std::enable_if_t<std::is_arithmetic_v<T>, int> = 0>
std::string piece(T v) { return std::to_string(v); }
template <class... A>
std::string msg(const A&... a) {
  std::string r;
  ((r += piece(a)), ...);
  return r;
}
#define PK_CHECK(cond, ...) TORCH_CHECK(cond, msg(__VA_ARGS__))

#define PK_CHECK_DEVICE(x, dev) \
  PK_CHECK((x).is_cuda() && (x).device() == (dev), #x " must be on device ", (dev), ", got ", (x).device())
#define PK_CHECK_LAST_CONTIG(x) \
  PK_CHECK((x).stride(-1) == 1, #x " must have a contiguous last dimension, got strides ", ints((x).strides()))
#define PK_CHECK_SHAPE(x, ...) check_shape((x), #x, {__VA_ARGS__})
#define PK_CHECK_DTYPE(x, dt) PK_CHECK((x).scalar_type() == (dt), #x " must be ", (dt), ", got ", (x).scalar_type())

std::string ints(at::IntArrayRef v) {
  std::string r = "(";
  for (size_t i = 0; i < v.size(); ++i) r += std::to_string(v[i]) + (i + 1 < v.size() ? ", " : "");
  return r + ")";
}

// CHECK_SHAPE: the message is built here from plain integers.
void check_shape(const at::Tensor& t, const char* name, std::initializer_list<int64_t> want) {
  bool ok = t.dim() == static_cast<int64_t>(want.size());
  std::string w = "(", g = "(";
  int64_t i = 0;
  for (int64_t v : want) {
    if (ok && t.size(i) != v) ok = false;
    w += std::to_string(v) + (i + 1 < static_cast<int64_t>(want.size()) ? ", " : ")");
    ++i;
  }
  if (ok) return;
  for (int64_t j = 0; j < t.dim(); ++j) g += std::to_string(t.size(j)) + (j + 1 < t.dim() ? ", " : "");
  g += ")";
  PK_CHECK(false, std::string(name) + " must have shape " + w + ", got " + g);
}

enum Layout : int64_t { kBhsd = 0, kBshd = 1, kHcu = 3 };

pk::DType dtype_code(at::ScalarType t) {
  switch (t) {
    case at::kHalf: return pk::kF16;
    case at::kBFloat16: return pk::kBF16;
    case at::kFloat8_e4m3fn: return pk::kE4M3;
    case at::kFloat8_e5m2: return pk::kE5M2;
    default: PK_CHECK(false, "unsupported dtype ", t);
  }
  return pk::kF16;  // unreachable
}

struct CacheGeom {
  int64_t num_blocks, block_size, num_kv_heads, head_dim;
};

// Fill the cache strides of p for a layout and return (num_blocks, block_size, Hkv, D).
CacheGeom cache_strides(const at::Tensor& k, const at::Tensor& v, int64_t layout, pk::AttnParams& p) {
  PK_CHECK(k.dim() == 4 && v.dim() == 4, "k_cache and v_cache must be 4-D, got ", ints(k.sizes()), " and ",
              ints(v.sizes()));
  CacheGeom g;
  if (layout == kBshd) {  // [N, B, H, D]
    g = {k.size(0), k.size(1), k.size(2), k.size(3)};
    PK_CHECK_SHAPE(v, g.num_blocks, g.block_size, g.num_kv_heads, g.head_dim);
    p.k_stride_block = k.stride(0), p.k_stride_token = k.stride(1), p.k_stride_head = k.stride(2);
    p.v_stride_block = v.stride(0), p.v_stride_token = v.stride(1), p.v_stride_head = v.stride(2);
    p.v_stride_dim = 1;
  } else {  // K [N, H, B, D]
    PK_CHECK(layout == kBhsd || layout == kHcu, "layout must be 0 (bhsd), 1 (bshd) or 3 (hcu), got ", layout);
    g = {k.size(0), k.size(2), k.size(1), k.size(3)};
    p.k_stride_block = k.stride(0), p.k_stride_token = k.stride(2), p.k_stride_head = k.stride(1);
    if (layout == kBhsd) {
      PK_CHECK_SHAPE(v, g.num_blocks, g.num_kv_heads, g.block_size, g.head_dim);
      p.v_stride_block = v.stride(0), p.v_stride_token = v.stride(2), p.v_stride_head = v.stride(1);
      p.v_stride_dim = 1;
    } else {  // V [N, H, D, B]
      PK_CHECK_SHAPE(v, g.num_blocks, g.num_kv_heads, g.head_dim, g.block_size);
      p.v_stride_block = v.stride(0), p.v_stride_head = v.stride(1), p.v_stride_dim = v.stride(2);
      p.v_stride_token = v.stride(3);
    }
  }
  PK_CHECK_LAST_CONTIG(k);
  PK_CHECK_LAST_CONTIG(v);
  PK_CHECK(g.head_dim == 64 || g.head_dim == 128, "head_dim must be 64 or 128, got ", g.head_dim);
  PK_CHECK(g.block_size >= 16 && (g.block_size & (g.block_size - 1)) == 0,
              "block_size must be a power of 2 >= 16, got ", g.block_size);
  // 16-byte loads: aligned bases and strides in whole 16-byte vectors.
  const int64_t epv = 16 / k.element_size();
  PK_CHECK(reinterpret_cast<uintptr_t>(k.data_ptr()) % 16 == 0 &&
                  reinterpret_cast<uintptr_t>(v.data_ptr()) % 16 == 0,
              "k_cache and v_cache must be 16-byte aligned");
  for (int64_t s : {p.k_stride_block, p.k_stride_token, p.k_stride_head, p.v_stride_block,
                    p.v_stride_head, layout == kHcu ? p.v_stride_dim : p.v_stride_token})
    PK_CHECK(s % epv == 0, "cache strides must be multiples of ", epv, " elements, got k ",
                ints(k.strides()), " v ", ints(v.strides()));
  return g;
}

void check_q_like(const at::Tensor& t, const char* name) {
  PK_CHECK(t.stride(-1) == 1, name, " must have a contiguous last dimension");
  PK_CHECK(t.stride(0) % 2 == 0 && t.stride(1) % 2 == 0 &&
                  reinterpret_cast<uintptr_t>(t.data_ptr()) % 4 == 0,
              name, " must be 4-byte aligned with even strides, got ", ints(t.strides()));
}

void check_scale(const std::optional<at::Tensor>& s, const char* name, bool fp8, int64_t hkv,
                 const at::Device& dev) {
  if (!fp8) return;
  PK_CHECK(s.has_value(), name, " is required for an fp8 cache");
  PK_CHECK_DEVICE(*s, dev);
  PK_CHECK_DTYPE(*s, at::kFloat);
  PK_CHECK(s->dim() == 1 && s->size(0) == hkv && s->is_contiguous(), name,
              " must be a contiguous float32 [num_kv_heads=", hkv, "], got ", ints(s->sizes()));
}

// Checks both entry points share (same order and messages in each).
// q [rows, Hq, D] against the cache: same head_dim, whole GQA groups.
void check_heads(const at::Tensor& q, const CacheGeom& g) {
  const int64_t Hq = q.size(1), D = q.size(2);
  PK_CHECK(D == g.head_dim, "q head_dim ", D, " != cache head_dim ", g.head_dim);
  PK_CHECK(Hq % g.num_kv_heads == 0, "num_q_heads ", Hq, " % num_kv_heads ", g.num_kv_heads, " != 0");
}

void check_block_table(const at::Tensor& block_table, int64_t S) {
  PK_CHECK_DTYPE(block_table, at::kInt);
  PK_CHECK(block_table.dim() == 2 && block_table.size(0) >= S, "block_table must be [>= num_seqs, W]");
  PK_CHECK_LAST_CONTIG(block_table);
}

void check_seq_lens(const at::Tensor& seq_lens, int64_t S) {
  PK_CHECK_DTYPE(seq_lens, at::kInt);
  PK_CHECK_SHAPE(seq_lens, S);
  PK_CHECK(seq_lens.is_contiguous(), "seq_lens must be contiguous");
}

// out like q [rows, Hq, D]; lse float32 [rows, Hq].
void check_out_lse(const at::Tensor& q, const at::Tensor& out, const std::optional<at::Tensor>& lse,
                   const at::Device& dev) {
  const int64_t rows = q.size(0), Hq = q.size(1), D = q.size(2);
  PK_CHECK_DTYPE(out, q.scalar_type());
  PK_CHECK_SHAPE(out, rows, Hq, D);
  check_q_like(out, "out");
  if (lse) {
    PK_CHECK_DEVICE(*lse, dev);
    PK_CHECK_DTYPE(*lse, at::kFloat);
    PK_CHECK_SHAPE(*lse, rows, Hq);
    PK_CHECK(lse->is_contiguous(), "lse must be contiguous");
  }
}

// errors: an int32 counter of 1 element on the device (kernels add to it; no host sync).
void check_errors(const std::optional<at::Tensor>& errors, const at::Device& dev) {
  if (!errors) return;
  PK_CHECK_DEVICE(*errors, dev);
  PK_CHECK_DTYPE(*errors, at::kInt);
  PK_CHECK(errors->numel() == 1, "errors must hold 1 element, got ", errors->numel());
}

// Metadata the kernels guard (pk_guard.h): the table's width, the cache's block count. Token
// positions up to width * block_size plus one partition stay below 2^31 (int32 math).
void set_table_bounds(pk::AttnParams& p, const at::Tensor& block_table, const CacheGeom& g,
                      int64_t slack) {
  const int64_t width = block_table.size(1);
  PK_CHECK(width * g.block_size <= INT32_MAX - slack, "block_table width ", width, " x block_size ",
           g.block_size, " must stay below 2^31 - ", slack, " tokens");
  p.table_width = static_cast<int>(width);
  p.num_blocks = static_cast<int>(std::min<int64_t>(g.num_blocks, INT32_MAX));
}

void paged_decode(const at::Tensor& q,            // [S, Hq, D]
                  const at::Tensor& k_cache,      // layout-specific
                  const at::Tensor& v_cache,
                  const at::Tensor& block_table,  // int32 [>= S, W]
                  const at::Tensor& seq_lens,     // int32 [S]
                  at::Tensor& out,                // like q
                  const std::optional<at::Tensor>& lse,      // float32 [S, Hq]
                  const std::optional<at::Tensor>& k_scale,  // float32 [Hkv] (fp8)
                  const std::optional<at::Tensor>& v_scale, int64_t layout, double scale,
                  int64_t partition_size, int64_t mode, int64_t parts_per_block,
                  const std::optional<at::Tensor>& errors) {  // int32 [1]
  const at::Device dev = q.device();
  PK_CHECK(q.is_cuda(), "q must be on a CUDA/HIP device");
  for (const at::Tensor* t : std::initializer_list<const at::Tensor*>{&k_cache, &v_cache, &block_table, &seq_lens, &out})
    PK_CHECK(t->is_cuda() && t->device() == dev, "all tensors must be on ", dev);
  PK_CHECK(q.scalar_type() == at::kHalf || q.scalar_type() == at::kBFloat16, "q must be fp16 or bf16");
  PK_CHECK(k_cache.scalar_type() == v_cache.scalar_type(), "k_cache and v_cache dtypes differ");
  const auto kvt = k_cache.scalar_type();
  const bool fp8 = kvt == at::kFloat8_e4m3fn || kvt == at::kFloat8_e5m2;
  PK_CHECK(fp8 || kvt == q.scalar_type(), "cache dtype must equal q's or be fp8, got ", kvt);
  PK_CHECK(q.dim() == 3, "q must be [num_seqs, num_q_heads, head_dim], got ", ints(q.sizes()));
  check_q_like(q, "q");

  pk::AttnParams p{};
  const CacheGeom g = cache_strides(k_cache, v_cache, layout, p);
  const int64_t S = q.size(0), Hq = q.size(1), D = q.size(2);
  check_heads(q, g);
  check_block_table(block_table, S);
  check_seq_lens(seq_lens, S);
  check_out_lse(q, out, lse, dev);
  check_scale(k_scale, "k_scale", fp8, g.num_kv_heads, dev);
  check_scale(v_scale, "v_scale", fp8, g.num_kv_heads, dev);
  PK_CHECK(partition_size > 0 && partition_size % 64 == 0, "partition_size must be a positive multiple of 64");
  PK_CHECK(std::isfinite(scale) && scale > 0, "scale must be finite and > 0");
  PK_CHECK(mode >= -1 && mode <= 1, "mode must be -1 (auto), 0 (split) or 1 (one pass)");
  PK_CHECK(parts_per_block >= 0, "parts_per_block must be >= 0 (0: auto)");
  check_errors(errors, dev);
  set_table_bounds(p, block_table, g, partition_size + 64);
  if (S == 0) return;

  const c10::cuda::CUDAGuard guard(dev);
  const int64_t G = Hq / g.num_kv_heads;
  const int64_t capacity = block_table.size(1) * g.block_size;
  p.q = q.data_ptr();
  p.out = out.data_ptr();
  p.lse = lse ? lse->data_ptr<float>() : nullptr;
  p.k_cache = k_cache.data_ptr();
  p.v_cache = v_cache.data_ptr();
  p.block_table = block_table.data_ptr<int>();
  p.seq_lens = seq_lens.data_ptr<int>();
  p.errors = errors ? errors->data_ptr<int>() : nullptr;
  p.k_scale = fp8 ? k_scale->data_ptr<float>() : nullptr;
  p.v_scale = fp8 ? v_scale->data_ptr<float>() : nullptr;
  p.q_stride_tok = q.stride(0), p.q_stride_head = q.stride(1);
  p.o_stride_tok = out.stride(0), p.o_stride_head = out.stride(1);
  p.table_stride = block_table.stride(0);
  p.num_seqs = S, p.num_q_heads = Hq, p.num_kv_heads = g.num_kv_heads, p.group = G;
  p.heads_per_block = std::min<int64_t>(G, 64);
  p.blocks_per_kv_head = (G + p.heads_per_block - 1) / p.heads_per_block;
  p.page_size = g.block_size;
  p.partition_size = partition_size;
  p.max_partitions = std::max<int64_t>(1, (capacity + partition_size - 1) / partition_size);
  PK_CHECK(p.max_partitions < 65536 && S < 65536, "grid too large");
  p.scale_log2 = static_cast<float>(scale * 1.4426950408889634);  // exp2 domain
  p.decode_mode = static_cast<int>(mode);
  p.parts_per_block = static_cast<int>(std::min<int64_t>(parts_per_block, p.max_partitions));
  void* stream = c10::cuda::getCurrentCUDAStream().stream();
  const pk::DType qc = dtype_code(q.scalar_type()), kc = dtype_code(kvt);
  const char* err = pk::launch_decode(p, qc, kc, D, layout == kHcu, stream, /*go=*/false);
  PK_CHECK(err == nullptr, "pagedattn_hip.paged_decode launch failed: ", err);
  at::Tensor tmp, ml, es;
  if (!p.one_pass) {  // split: the partition states
    const auto f32 = q.options().dtype(at::kFloat);
    tmp = at::empty({S, Hq, p.max_partitions, D}, f32);
    ml = at::empty({S, Hq, p.max_partitions}, f32);
    es = at::empty({S, Hq, p.max_partitions}, f32);
    p.tmp_out = tmp.data_ptr<float>();
    p.max_logits = ml.data_ptr<float>();
    p.exp_sums = es.data_ptr<float>();
  }
  err = pk::launch_decode(p, qc, kc, D, layout == kHcu, stream, /*go=*/true);
  PK_CHECK(err == nullptr, "pagedattn_hip.paged_decode launch failed: ", err);
}

void extend_attention(const at::Tensor& q,             // [T, Hq, D]
                      const at::Tensor& k_cache, const at::Tensor& v_cache,
                      const at::Tensor& block_table,   // int32 [>= S, W]
                      const at::Tensor& cu_seqlens_q,  // int32 [S + 1]
                      const at::Tensor& seq_lens,      // int32 [S]
                      at::Tensor& out,                 // like q
                      const std::optional<at::Tensor>& lse,  // float32 [T, Hq]
                      int64_t layout, double scale, int64_t max_q_len,
                      const std::optional<at::Tensor>& errors) {  // int32 [1]
  const at::Device dev = q.device();
  PK_CHECK(q.is_cuda(), "q must be on a CUDA/HIP device");
  for (const at::Tensor* t : std::initializer_list<const at::Tensor*>{&k_cache, &v_cache, &block_table, &cu_seqlens_q, &seq_lens, &out})
    PK_CHECK(t->is_cuda() && t->device() == dev, "all tensors must be on ", dev);
  PK_CHECK(q.scalar_type() == at::kHalf || q.scalar_type() == at::kBFloat16, "q must be fp16 or bf16");
  PK_CHECK_DTYPE(k_cache, q.scalar_type());
  PK_CHECK_DTYPE(v_cache, q.scalar_type());
  PK_CHECK(layout == kBhsd || layout == kBshd, "extend supports layouts bhsd (0) and bshd (1)");
  PK_CHECK(q.dim() == 3, "q must be [tokens, num_q_heads, head_dim], got ", ints(q.sizes()));
  check_q_like(q, "q");
  pk::AttnParams p{};
  const CacheGeom g = cache_strides(k_cache, v_cache, layout, p);
  const int64_t T = q.size(0), Hq = q.size(1), D = q.size(2);
  check_heads(q, g);
  PK_CHECK_DTYPE(cu_seqlens_q, at::kInt);
  PK_CHECK(cu_seqlens_q.dim() == 1 && cu_seqlens_q.size(0) >= 1 && cu_seqlens_q.is_contiguous(),
              "cu_seqlens_q must be a contiguous int32 [num_seqs + 1]");
  const int64_t S = cu_seqlens_q.size(0) - 1;
  check_seq_lens(seq_lens, S);
  check_block_table(block_table, S);
  check_out_lse(q, out, lse, dev);
  PK_CHECK(max_q_len >= 0, "max_q_len must be >= 0");
  PK_CHECK(std::isfinite(scale) && scale > 0, "scale must be finite and > 0");
  PK_CHECK(T < INT32_MAX, "q holds too many tokens (", T, ")");
  check_errors(errors, dev);
  set_table_bounds(p, block_table, g, 128);
  if (S == 0 || T == 0) return;

  const c10::cuda::CUDAGuard guard(dev);
  p.q = q.data_ptr();
  p.out = out.data_ptr();
  p.lse = lse ? lse->data_ptr<float>() : nullptr;
  p.k_cache = k_cache.data_ptr();
  p.v_cache = v_cache.data_ptr();
  p.block_table = block_table.data_ptr<int>();
  p.seq_lens = seq_lens.data_ptr<int>();
  p.cu_seqlens_q = cu_seqlens_q.data_ptr<int>();
  p.errors = errors ? errors->data_ptr<int>() : nullptr;
  p.num_tokens = static_cast<int>(T);
  p.q_stride_tok = q.stride(0), p.q_stride_head = q.stride(1);
  p.o_stride_tok = out.stride(0), p.o_stride_head = out.stride(1);
  p.table_stride = block_table.stride(0);
  p.num_seqs = S, p.num_q_heads = Hq, p.num_kv_heads = g.num_kv_heads, p.group = Hq / g.num_kv_heads;
  p.page_size = g.block_size;
  // A request longer than max_q_len is bad metadata (NaN rows); one query block per request
  // at least, so that it exists to write them.
  p.max_q_len = static_cast<int>(std::min(max_q_len, T));
  p.num_m_blocks = std::max<int64_t>(1, (p.max_q_len + 63) / 64);
  PK_CHECK(Hq < 65536 && S < 65536, "grid too large");
  p.scale_log2 = static_cast<float>(scale * 1.4426950408889634);
  void* stream = c10::cuda::getCurrentCUDAStream().stream();
  const char* err = pk::launch_extend(p, dtype_code(q.scalar_type()), D, stream);
  PK_CHECK(err == nullptr, "pagedattn_hip.extend_attention launch failed: ", err);
}

// c = a @ b.T through the kernels' mma abstraction (mma_probe.cu): the self-check's layout probe.
void mma_probe(const at::Tensor& a,  // fp16/bf16 [16, 16], contiguous
               const at::Tensor& b,  // like a
               at::Tensor& c) {      // float32 [16, 16], contiguous
  const at::Device dev = a.device();
  PK_CHECK(a.is_cuda(), "a must be on a CUDA/HIP device");
  PK_CHECK_DEVICE(b, dev);
  PK_CHECK_DEVICE(c, dev);
  PK_CHECK(a.scalar_type() == at::kHalf || a.scalar_type() == at::kBFloat16, "a must be fp16 or bf16");
  PK_CHECK_DTYPE(b, a.scalar_type());
  PK_CHECK_DTYPE(c, at::kFloat);
  PK_CHECK_SHAPE(a, 16, 16);
  PK_CHECK_SHAPE(b, 16, 16);
  PK_CHECK_SHAPE(c, 16, 16);
  PK_CHECK(a.is_contiguous() && b.is_contiguous() && c.is_contiguous(), "a, b and c must be contiguous");
  const c10::cuda::CUDAGuard guard(dev);
  void* stream = c10::cuda::getCurrentCUDAStream().stream();
  const char* err = pk::launch_mma_probe(a.data_ptr(), b.data_ptr(), c.data_ptr<float>(),
                                         a.scalar_type() == at::kBFloat16, stream);
  PK_CHECK(err == nullptr, "pagedattn_hip.mma_probe launch failed: ", err);
}

}  // namespace

TORCH_LIBRARY(pagedattn_hip, m) {
  m.def(
      "paged_decode(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_table, Tensor seq_lens, "
      "Tensor(a!) out, Tensor(b!)? lse, Tensor? k_scale, Tensor? v_scale, int layout, float scale, "
      "int partition_size, int mode, int parts_per_block, Tensor(c!)? errors=None) -> ()");
  m.def(
      "extend_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_table, "
      "Tensor cu_seqlens_q, Tensor seq_lens, Tensor(a!) out, Tensor(b!)? lse, int layout, "
      "float scale, int max_q_len, Tensor(c!)? errors=None) -> ()");
  m.def("mma_probe(Tensor a, Tensor b, Tensor(a!) c) -> ()");
}

TORCH_LIBRARY_IMPL(pagedattn_hip, CUDA, m) {
  m.impl("paged_decode", &paged_decode);
  m.impl("extend_attention", &extend_attention);
  m.impl("mma_probe", &mma_probe);
}

// attn_params.h: the parameter block shared by the host entry (bindings.cpp) and the kernels.
// Plain C++ (no torch, no GPU runtime headers) so both sides and the compile checks include it.
#pragma once

#include <stdint.h>

namespace pk {

enum DType : int { kF16 = 0, kBF16 = 1, kE4M3 = 2, kE5M2 = 3 };

struct AttnParams {
  // Tensors. Shapes use S = num_seqs, T = total new tokens (extend), P = max_partitions.
  const void* q;             // decode [S, Hq, D]; extend [T, Hq, D]       (stride(-1) == 1)
  void* out;                 // like q
  float* lse;                // [S or T, Hq] natural log, contiguous; nullptr when not wanted
  // Decode split-KV partition states (merge_state): unnormalised output (times v_scale), row
  // max (log2 domain) and row sum. tmp_out is nullptr when P == 1.
  float* tmp_out;            // [S, Hq, P, D]
  float* max_logits;         // [S, Hq, P]
  float* exp_sums;           // [S, Hq, P]
  const void* k_cache;       // layout-specific, described by the k_stride_* below
  const void* v_cache;
  const int* block_table;    // [S, table_stride]
  const int* seq_lens;       // [S]
  const int* cu_seqlens_q;   // extend [S + 1]
  const float* k_scale;      // fp8: [Hkv] dequantisation scales; else nullptr
  const float* v_scale;
  // [1] int32 counter: a program that finds bad metadata adds 1 (atomic); nullptr: none
  int* errors;

  // Element strides (int64: pools pass 2^31 elements).
  int64_t q_stride_tok, q_stride_head;
  int64_t o_stride_tok, o_stride_head;
  int64_t k_stride_block, k_stride_token, k_stride_head;                  // d stride is 1
  int64_t v_stride_block, v_stride_token, v_stride_head, v_stride_dim;    // one of the last is 1
  int64_t table_stride;
  int table_width;        // entries per block-table row (W); table_width * page_size < 2^31
  int num_blocks;         // cache blocks: valid block ids are [0, num_blocks) (clamped to 2^31-1)
  int num_tokens;         // extend: rows of q (T); cu_seqlens_q entries lie in [0, T]

  int num_seqs, num_q_heads, num_kv_heads, group;  // group = Hq / Hkv
  int heads_per_block;    // decode: query heads one block serves (KV-head grid: min(G, REUSE))
  int blocks_per_kv_head; // decode: ceil(G / heads_per_block)
  int page_size;          // power of 2, >= 16
  int partition_size;     // decode: multiple of 64
  int max_partitions;     // decode: ceil(table capacity / partition_size)
  int decode_mode;        // decode launch shape: -1 auto, 0 split, 1 one pass (launcher resolves)
  int parts_per_block;    // decode split: partitions per block; 0 = auto (launcher resolves)
  int one_pass;           // decode, set by the launcher: each block merges all its partitions
  int num_m_blocks;       // extend: max(1, ceil(max_q_len / 64))
  int max_q_len;          // extend: longest query length the caller promises (<= num_tokens)
  float scale_log2;       // softmax scale * log2(e)
};

}  // namespace pk

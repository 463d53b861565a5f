// pk_pipe.h: NVIDIA-only pieces of the pipelined decodes (attn_pipe.cuh, decode_cs.cuh):
// 16-byte cp.async copies global -> shared with zero fill, their commit/wait groups, and
// ldmatrix reads of sm80 operand fragments (pk_mma.h lane map) from shared memory.
// PTX semantics: PTX ISA "cp.async", "cp.async.wait_group", "ldmatrix".
#pragma once

#include "pk_mma.h"

#if defined(PK_CUDA)
namespace pk {

PK_DEVICE uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// dst[0, 16) = src[0, nbytes) followed by zeros; nbytes == 0 reads nothing (src only needs to be
// a valid global address). .cg: cached in L2 only, the KV stream is read once.
PK_DEVICE void cp_async16(void* dst, const void* src, int nbytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)), "l"(src),
               "r"(nbytes)
               : "memory");
}
PK_DEVICE void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Wait until at most N of this thread's committed groups are still in flight. The copies become
// visible to other threads only after a barrier.
template <int N>
PK_DEVICE void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// ldmatrix .x4: lane L supplies the address of row L%8 of 8x8 matrix L/8, and matrix j lands in
// register j, lane l holding (row l/4, columns 2(l%4), 2(l%4)+1) of it (.trans: of its transpose).
// Register r of an sm80 operand fragment holds (row l/4 + 8(r&1), k 2(l%4) + 8(r>>1) + {0,1}), so
// matrix r is rows 8(r&1)..+7 x k 8(r>>1)..+7 of the 16x16 operand.

PK_DEVICE void ldsm_x4(const uint16_t* a, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(a)));
}
PK_DEVICE void ldsm_x4_trans(const uint16_t* a, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(a)));
}

// The reads below take the tile's layout as off(r, c): the element offset of 16-byte chunk c (8
// elements) of row r from `tile` (padded rows: r * ld + 8 c; swizzled: tile_off). The int `ld`
// overloads are the padded form.

// Operand (16 rows, 16 k) of a tile stored [row][k] (k contiguous).
template <class Off>
PK_DEVICE Frag ldsm_rows(const uint16_t* tile, Off off, int lane) {
  Frag f;
  ldsm_x4(tile + off((lane & 7) + 8 * ((lane >> 3) & 1), lane >> 4), f.r);
  return f;
}
PK_DEVICE Frag ldsm_rows(const uint16_t* tile, int ld, int lane) {
  return ldsm_rows(tile, [ld](int r, int c) { return r * ld + 8 * c; }, lane);
}

// Operand (16 rows, 16 k) of a tile stored [k][row] (rows contiguous): the transposing read.
// Matrix j is k 8(j>>1)..+7 (memory rows) x rows 8(j&1)..+7 (memory columns).
template <class Off>
PK_DEVICE Frag ldsm_cols(const uint16_t* tile, Off off, int lane) {
  Frag f;
  ldsm_x4_trans(tile + off(8 * (lane >> 4) + (lane & 7), (lane >> 3) & 1), f.r);
  return f;
}
PK_DEVICE Frag ldsm_cols(const uint16_t* tile, int ld, int lane) {
  return ldsm_cols(tile, [ld](int r, int c) { return r * ld + 8 * c; }, lane);
}

// Element offset of the 16-byte chunk c (8 elements) of row r in a [rows][kPitch] 16-bit tile.
// kSwz: the chunk lives at c ^ (r & 7) (kPitch * 2 a multiple of 128 bytes, 128-byte aligned
// tile): a 128-byte line copied in by cp.async lands in one aligned 128-byte block of shared
// memory, and 8 consecutive rows' chunk c sit in 8 distinct bank groups (ldmatrix stays
// conflict-free). Without it, the caller pads rows (kPitch = row + 8 elements).
template <int kPitch, bool kSwz>
PK_DEVICE int tile_off(int r, int c) {
  return r * kPitch + 8 * (kSwz ? c ^ (r & 7) : c);
}

// B operands of two k-steps of an m16n8k16 from 8 rows (n) of a tile stored [n][k] (k
// contiguous), k = 32 from chunk 0 of off: matrix j = rows 0..7 x k 8j..8j+7, so lane l gets
// (row l/4, k 2(l%4) + 8j + {0,1}) in register j: b[0], b[1] are k-step 0's two registers,
// b[2], b[3] k-step 1's.
template <class Off>
PK_DEVICE void ldsm_n8_k32(const uint16_t* tile, Off off, int lane, uint32_t (&b)[4]) {
  ldsm_x4(tile + off(lane & 7, lane >> 3), b);
}

// c[16 x 8] += X[16 x 16] * B[16 x 8] (one m16n8k16): c holds (row l/4 + 8(i>>1), column
// 2(l%4) + (i&1)) in slot i, the first half of an sm80 Acc (pk_mma.h lane map).
template <class T>
PK_DEVICE void mma_n8(float (&c)[4], const Frag& X, uint32_t b0, uint32_t b1) {
  if constexpr (T::kIsBf16) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(X.r[0]), "r"(X.r[1]), "r"(X.r[2]), "r"(X.r[3]), "r"(b0), "r"(b1));
  } else {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(X.r[0]), "r"(X.r[1]), "r"(X.r[2]), "r"(X.r[3]), "r"(b0), "r"(b1));
  }
}

}  // namespace pk
#endif

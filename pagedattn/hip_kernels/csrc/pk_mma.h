// pk_mma.h: one 16x16x16 matrix-multiply abstraction.
//
//   mma_nt(acc, X, Y):  acc[x][y] += sum_k X[x][k] * Y[y][k]     (both operands K-contiguous)
//
// Each backend orders the intrinsic's operands so that the accumulator converts to an operand
// fragment in place (acc_to_frag). Kernels reach lane maps and reductions only through:
//   frag_row/frag_k  where a lane's operand register r comes from (a pair of consecutive k)
//   acc_x/acc_y      which (x, y) accumulator slot i of a lane holds
//   acc_row          which of the lane's kRows row statistics slot i belongs to
//   kperm            where token t of a 16-group sits in an LDS operand row, so that a fragment
//                    read with frag_k matches the k order acc_to_frag produced (identity except
//                    on MMAC, whose "jump" accumulator gives k = g + 4j)
//   reduce_y_*       reduce the lane's row statistics over y (the token axis)
//
// Lane maps (l = lane, g = l/16 on AMD; slots i):
//   backend      operand (row, k)                          accumulator (x, y)
//   MFMA         (l%16, 4g+j)                              (l%16, 4g+i)      via mfma(Y, X)
//   MMAC         (l%16, 4g+j)                              (l%16, g+4i)      via mmac(X, Y)
//   sm80 (2x m16n8k16), reg r = pair (k, k+1):
//                (l/4 + 8(r&1), 2(l%4) + 8(r>>1))          (l/4 + 8((i>>1)&1), 8(i>>2) + 2(l%4) + (i&1))
#pragma once

#include "pk_port.h"

namespace pk {

#if defined(PK_HIP)
constexpr int kFragRegs = 2;  // 4 x 16-bit
constexpr int kAccSlots = 4;
constexpr int kRows = 1;      // accumulator rows (x values) per lane
#else
constexpr int kFragRegs = 4;  // 8 x 16-bit
constexpr int kAccSlots = 8;
constexpr int kRows = 2;
#endif

struct Frag {
  uint32_t r[kFragRegs];
};
struct Acc {
  float v[kAccSlots];
};

PK_DEVICE void zero(Acc& a) {
#pragma unroll
  for (int i = 0; i < kAccSlots; ++i) a.v[i] = 0.f;
}

// --- lane maps --------------------------------------------------------------------------------
#if defined(PK_HIP)
PK_DEVICE int frag_row(int l, int /*r*/) { return l & 15; }
PK_DEVICE int frag_k(int l, int r) { return 4 * (l >> 4) + 2 * r; }
PK_DEVICE int acc_x(int l, int /*i*/) { return l & 15; }
PK_DEVICE int acc_row(int /*i*/) { return 0; }
#if defined(PK_MMA_MMAC)
PK_DEVICE int acc_y(int l, int i) { return (l >> 4) + 4 * i; }
PK_DEVICE int kperm(int t) { return 4 * (t & 3) + (t >> 2); }
#else
PK_DEVICE int acc_y(int l, int i) { return 4 * (l >> 4) + i; }
PK_DEVICE int kperm(int t) { return t; }
#endif
#else
PK_DEVICE int frag_row(int l, int r) { return (l >> 2) + 8 * (r & 1); }
PK_DEVICE int frag_k(int l, int r) { return 2 * (l & 3) + 8 * (r >> 1); }
PK_DEVICE int acc_x(int l, int i) { return (l >> 2) + 8 * ((i >> 1) & 1); }
PK_DEVICE int acc_y(int l, int i) { return 8 * (i >> 2) + 2 * (l & 3) + (i & 1); }
PK_DEVICE int acc_row(int i) { return (i >> 1) & 1; }
PK_DEVICE int kperm(int t) { return t; }
#endif

// --- the multiply ----------------------------------------------------------------------------
#if defined(PK_HIP)
typedef _Float16 pk_half4 __attribute__((ext_vector_type(4)));
typedef short pk_short4 __attribute__((ext_vector_type(4)));
typedef float pk_float4 __attribute__((ext_vector_type(4)));

// MMAC builtins, by arch (pk_port.h). Layout assumptions, from public Hygon kernels and not
// verified on hardware by us; the probe (csrc/mma_probe.cu, hip_kernels.mma_probe) checks them
// per arch before the backend is trusted there:
//   (1) mmac(x, y, c): operand lane l holds row l%16, k 4(l/16) + j in slot j, for both x
//       and y (the MFMA operand map);
//   (2) the result is D[x row][y row] += sum_k x[.][k] y[.][k], slot i of lane l holding
//       D[l%16][l/16 + 4i] (the "jump" layout; MFMA's is D[4(l/16) + i][l%16]);
//   (3) gfx938/92a/946 with lit = lts = false give the same operand and result maps as
//       gfx936/928's plain form, for f16 and bf16 (the int8 forms of the two families are
//       known to differ; they are not used here);
//   (4) bf16 operands are passed as 4 x short bit patterns, f16 as 4 x _Float16.
#if defined(PK_MMA_MMAC)
#if defined(PK_MMAC_SHIM)  // compile_check/mmac_shim.h: MFMA emulation, a syntax check only
#define PK_MMAC_F16(a, b, c) pk_shim_mmac_f16(a, b, c)
#define PK_MMAC_BF16(a, b, c) pk_shim_mmac_bf16(a, b, c)
#elif defined(PK_MMAC_PLAIN)  // gfx936 / gfx928
#define PK_MMAC_F16(a, b, c) __builtin_amdgcn_mmac_f32_16x16x16f16(a, b, c)
#define PK_MMAC_BF16(a, b, c) __builtin_amdgcn_mmac_f32_16x16x16bf16(a, b, c)
#elif defined(PK_MMAC_LIT_LTS)  // gfx938 / gfx92a / gfx946: lit and lts explicitly off
#define PK_MMAC_F16(a, b, c) __builtin_hcu_mmac_f32_16x16x16_f16_lit_lts(a, b, c, false, false)
#define PK_MMAC_BF16(a, b, c) __builtin_hcu_mmac_f32_16x16x16_bf16_lit_lts(a, b, c, false, false)
#endif
#endif
#endif

template <class T>
PK_DEVICE void mma_nt(Acc& acc, const Frag& X, const Frag& Y) {
#if defined(PK_MMA_MFMA) || defined(PK_MMA_MMAC)
  pk_float4 c = {acc.v[0], acc.v[1], acc.v[2], acc.v[3]};
  if constexpr (T::kIsBf16) {
    const pk_short4 x = __builtin_bit_cast(pk_short4, X.r);
    const pk_short4 y = __builtin_bit_cast(pk_short4, Y.r);
#if defined(PK_MMA_MFMA)
    c = __builtin_amdgcn_mfma_f32_16x16x16bf16_1k(y, x, c, 0, 0, 0);  // D[4g+i][l%16]
#else
    c = PK_MMAC_BF16(x, y, c);  // D[l%16][g+4i]
#endif
  } else {
    const pk_half4 x = __builtin_bit_cast(pk_half4, X.r);
    const pk_half4 y = __builtin_bit_cast(pk_half4, Y.r);
#if defined(PK_MMA_MFMA)
    c = __builtin_amdgcn_mfma_f32_16x16x16f16(y, x, c, 0, 0, 0);
#else
    c = PK_MMAC_F16(x, y, c);
#endif
  }
  acc.v[0] = c[0];
  acc.v[1] = c[1];
  acc.v[2] = c[2];
  acc.v[3] = c[3];
#elif defined(PK_MMA_SM80)
  // Output columns 8h..8h+7 come from the Y registers whose row bit (r&1) is h: (0,2), (1,3).
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    if constexpr (T::kIsBf16) {
      asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
          "{%8,%9}, {%0,%1,%2,%3};"
          : "+f"(acc.v[4 * h + 0]), "+f"(acc.v[4 * h + 1]), "+f"(acc.v[4 * h + 2]),
            "+f"(acc.v[4 * h + 3])
          : "r"(X.r[0]), "r"(X.r[1]), "r"(X.r[2]), "r"(X.r[3]), "r"(Y.r[h]), "r"(Y.r[h + 2]));
    } else {
      asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
          "{%8,%9}, {%0,%1,%2,%3};"
          : "+f"(acc.v[4 * h + 0]), "+f"(acc.v[4 * h + 1]), "+f"(acc.v[4 * h + 2]),
            "+f"(acc.v[4 * h + 3])
          : "r"(X.r[0]), "r"(X.r[1]), "r"(X.r[2]), "r"(X.r[3]), "r"(Y.r[h]), "r"(Y.r[h + 2]));
    }
  }
#else
  // Host pass: never called.
  (void)acc;
  (void)X;
  (void)Y;
#endif
}

// The accumulator as an X operand: rows x, k-slots y (in acc_y order, i.e. kperm'd on MMAC).
// Slot pairs (2r, 2r+1) become register r on every backend.
template <class T>
PK_DEVICE Frag acc_to_frag(const Acc& a) {
  Frag f;
#pragma unroll
  for (int r = 0; r < kFragRegs; ++r) f.r[r] = pack2<T>(a.v[2 * r], a.v[2 * r + 1]);
  return f;
}

// --- reductions over y (the token axis) of per-row statistics ----------------------------------
PK_DEVICE float reduce_y_max(float v) {
#if defined(PK_HIP)
  v = fmax(v, shfl_xor(v, 16));  // y spans the lane group g
  v = fmax(v, shfl_xor(v, 32));
#else
  v = fmax(v, shfl_xor(v, 1));  // y spans l%4
  v = fmax(v, shfl_xor(v, 2));
#endif
  return v;
}

PK_DEVICE float reduce_y_sum(float v) {
#if defined(PK_HIP)
  v += shfl_xor(v, 16);
  v += shfl_xor(v, 32);
#else
  v += shfl_xor(v, 1);
  v += shfl_xor(v, 2);
#endif
  return v;
}

}  // namespace pk

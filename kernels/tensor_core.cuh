// mma.sync m16n8k16 (f32 accumulators, 16-bit operands) and the ldmatrix loads that feed it,
// shared by the projections (mma.cuh) and attention (attn_mma.cuh).
#pragma once
#include "common.cuh"

// c += a · b for one 16×8 tile: a is the 16×16 A fragment, (b0, b1) the 16×8 B fragment. The
// pointer argument only picks the operand type.
__device__ __forceinline__ void mma_16816(float c[4], const u32 a[4], u32 b0, u32 b1,
                                          const __nv_bfloat16*) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void mma_16816(float c[4], const u32 a[4], u32 b0, u32 b1,
                                          const __half*) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Four 8×8 16-bit matrices from shared memory: lanes 8i .. 8i + 7 give the row addresses of
// matrix i, and r[i] is this lane's pair of it (row lane / 4, columns 2 (lane % 4) and + 1; with
// TRANS, of its transpose).
template <bool TRANS>
__device__ __forceinline__ void ldsm_x4(u32 addr, u32 (&r)[4]) {
    if (TRANS)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(addr));
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(addr));
}

// Two f32 values rounded to the 16-bit type T and packed (lo in the low half), as an mma
// operand register.
template <typename T>
__device__ __forceinline__ u32 pack2(float lo, float hi) {
    union {
        T h[2];
        u32 u;
    } p;
    narrow(lo, &p.h[0]);
    narrow(hi, &p.h[1]);
    return p.u;
}

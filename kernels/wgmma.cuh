// Hopper's warpgroup MMA (sm_90a), d (m64 × n, f32) += A (16-bit, registers: each warp its 16
// rows in mma.sync's A-fragment layout) × B (16-bit, K-major in shared memory through descriptor
// `b`). Same bits as mma.sync m16n8k16 on the same operands and accumulator, step for step
// (lab/gpu/wgmma_bits.cu, measured on the H200 2026-11-26 with B unswizzled: 0 of 36,864 outputs
// differ over three operand distributions and chains of 1, 4 and 64 steps; the GEMM's 128-byte
// swizzled B passes the GPU bit-identity test). Scale-d is 1 (the accumulator always adds, as
// mma.sync's does); B K-major, except the N-major steps of attention's values.
#pragma once
#include "common.cuh"

// One m64 × N × k16 step, N = 192 (96 accumulators per thread), 144 (72), 128 (64), 64 (32) or
// 32 (16), per dtype.
#define WGMMA_ACC64 \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), \
    "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), \
    "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), \
    "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), \
    "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), \
    "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), \
    "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), \
    "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), \
    "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
    "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), \
    "+f"(d[62]), "+f"(d[63])
// N = 144 and 192: the accumulators of N = 128, then the rest.
#define WGMMA_ACC72 \
    WGMMA_ACC64, "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), \
    "+f"(d[70]), "+f"(d[71])
#define WGMMA_ACC96 \
    WGMMA_ACC72, "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), \
    "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), \
    "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), \
    "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95])
#define WGMMA_ACC32 \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), \
    "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), \
    "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), \
    "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), \
    "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define WGMMA_ACC16 \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), \
    "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), \
    "+f"(d[14]), "+f"(d[15])
#define WGMMA_REGS64 \
    "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15," \
    "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31," \
    "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47," \
    "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63"
#define WGMMA_REGS72 WGMMA_REGS64 ",%64,%65,%66,%67,%68,%69,%70,%71"
#define WGMMA_REGS96 \
    WGMMA_REGS72 ",%72,%73,%74,%75,%76,%77,%78,%79,%80,%81,%82,%83,%84,%85,%86,%87," \
                 "%88,%89,%90,%91,%92,%93,%94,%95"
#define WGMMA_REGS32 \
    "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15," \
    "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31"
#define WGMMA_REGS16 "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15"
#define WGMMA_STEP_AS(NAME, N, DT, W, REGS, TAIL, ACC)                                          \
    __device__ __forceinline__ void NAME(float (&d)[N / 2], const u32 a[4], u64 b, const W*) { \
        asm volatile("wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." #DT "." #DT " {" REGS   \
                     TAIL                                                                       \
                     : ACC                                                                      \
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));                    \
    }
WGMMA_STEP_AS(wgmma_n128, 128, bf16, __nv_bfloat16, WGMMA_REGS64,
              "}, {%64,%65,%66,%67}, %68, 1, 1, 1, 0;\n", WGMMA_ACC64)
WGMMA_STEP_AS(wgmma_n128, 128, f16, __half, WGMMA_REGS64,
              "}, {%64,%65,%66,%67}, %68, 1, 1, 1, 0;\n", WGMMA_ACC64)
WGMMA_STEP_AS(wgmma_n192, 192, bf16, __nv_bfloat16, WGMMA_REGS96,
              "}, {%96,%97,%98,%99}, %100, 1, 1, 1, 0;\n", WGMMA_ACC96)
WGMMA_STEP_AS(wgmma_n192, 192, f16, __half, WGMMA_REGS96,
              "}, {%96,%97,%98,%99}, %100, 1, 1, 1, 0;\n", WGMMA_ACC96)
WGMMA_STEP_AS(wgmma_n144, 144, bf16, __nv_bfloat16, WGMMA_REGS72,
              "}, {%72,%73,%74,%75}, %76, 1, 1, 1, 0;\n", WGMMA_ACC72)
WGMMA_STEP_AS(wgmma_n144, 144, f16, __half, WGMMA_REGS72,
              "}, {%72,%73,%74,%75}, %76, 1, 1, 1, 0;\n", WGMMA_ACC72)
WGMMA_STEP_AS(wgmma_n64, 64, bf16, __nv_bfloat16, WGMMA_REGS32,
              "}, {%32,%33,%34,%35}, %36, 1, 1, 1, 0;\n", WGMMA_ACC32)
WGMMA_STEP_AS(wgmma_n64, 64, f16, __half, WGMMA_REGS32,
              "}, {%32,%33,%34,%35}, %36, 1, 1, 1, 0;\n", WGMMA_ACC32)
// Attention's values (attn_prefill_wg): B N-major (imm-trans-b 1), a tile's values as they lie,
// [position][dim], half of the head dims per step.
WGMMA_STEP_AS(wgmma_n64_nmajor, 64, bf16, __nv_bfloat16, WGMMA_REGS32,
              "}, {%32,%33,%34,%35}, %36, 1, 1, 1, 1;\n", WGMMA_ACC32)
WGMMA_STEP_AS(wgmma_n64_nmajor, 64, f16, __half, WGMMA_REGS32,
              "}, {%32,%33,%34,%35}, %36, 1, 1, 1, 1;\n", WGMMA_ACC32)
// Attention's scores (attn_prefill_wg): m64 × n32 against a tile of 32 keys, A from shared memory
// too (descriptor `a`, K-major: the queries).
#define WGMMA_SS_STEP(NAME, N, DT, W, REGS, TAIL, ACC)                                          \
    __device__ __forceinline__ void NAME(float (&d)[N / 2], u64 a, u64 b, const W*) {         \
        asm volatile("wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." #DT "." #DT " {" REGS   \
                     TAIL                                                                       \
                     : ACC                                                                      \
                     : "l"(a), "l"(b));                                                         \
    }
WGMMA_SS_STEP(wgmma_ss_n32, 32, bf16, __nv_bfloat16, WGMMA_REGS16, "}, %16, %17, 1, 1, 1, 0, 0;\n",
              WGMMA_ACC16)
WGMMA_SS_STEP(wgmma_ss_n32, 32, f16, __half, WGMMA_REGS16, "}, %16, %17, 1, 1, 1, 0, 0;\n",
              WGMMA_ACC16)

// The descriptor of a K-major operand in the 128-byte swizzle layout at `addr` (inside a 1 KiB
// aligned atom of 8 rows × 128 bytes; the k16 step s of the row starts at atom + 32 s): rows
// 128 bytes apart, 8-row atoms 1,024 bytes apart (stride offset); the leading offset is unused.
__device__ __forceinline__ u64 wgmma_desc_sw128(u32 addr) {
    return (u64)((addr & 0x3FFFF) >> 4) | ((u64)1 << 16) | ((u64)(1024 >> 4) << 32) |
           ((u64)1 << 62);
}

// The descriptor of an N-major B operand in the 128-byte swizzle layout at `addr` (1 KiB aligned
// atoms of 8 k-rows × 64 n-elements, 128 bytes per k-row): 8-row groups of k `k8` bytes apart
// (stride offset), 64-element blocks of n `n64` bytes apart (leading offset).
__device__ __forceinline__ u64 wgmma_desc_sw128_nmajor(u32 addr, u32 n64, u32 k8) {
    return (u64)((addr & 0x3FFFF) >> 4) | ((u64)((n64 & 0x3FFFF) >> 4) << 16) |
           ((u64)((k8 & 0x3FFFF) >> 4) << 32) | ((u64)1 << 62);
}

__device__ __forceinline__ void wgmma_fence() {
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// Registers an in-flight wgmma reads or writes are live until here for the compiler (it must not
// move or reuse them while the tensor cores still do).
template <int N>
__device__ __forceinline__ void wgmma_hold(float (&r)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
template <int N>
__device__ __forceinline__ void wgmma_hold(u32 (&r)[N][4]) {
#pragma unroll
    for (int i = 0; i < N; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) asm volatile("" : "+r"(r[i][j])::"memory");
}

template <typename W>
__device__ __forceinline__ void wgmma_step(float (&d)[64], const u32 a[4], u64 b) {
    wgmma_n128(d, a, b, (const W*)nullptr);
}
template <typename W>
__device__ __forceinline__ void wgmma_step(float (&d)[96], const u32 a[4], u64 b) {
    wgmma_n192(d, a, b, (const W*)nullptr);
}
template <typename W>
__device__ __forceinline__ void wgmma_step(float (&d)[72], const u32 a[4], u64 b) {
    wgmma_n144(d, a, b, (const W*)nullptr);
}
template <typename W>
__device__ __forceinline__ void wgmma_step(float (&d)[32], const u32 a[4], u64 b) {
    wgmma_n64(d, a, b, (const W*)nullptr);
}

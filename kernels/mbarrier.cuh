// Shared-memory barriers (mbarrier) and the asynchronous copies that complete on them (cp.async
// arrivals and TMA tensor copies): the warp-specialized GEMM's stage ring (mma.cuh) and
// attn_decode_serial's KV tiles (attention.cu).
// try_wait and the transaction counts are sm_90 instructions: callers use them only in code
// compiled for sm_90.
#pragma once
#include "common.cuh"

__device__ __forceinline__ void mbar_init(u32 bar, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(u32 bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// The arrival fires when every cp.async this thread issued before it has landed (noinc: the
// barrier's count includes it).
__device__ __forceinline__ void mbar_arrive_cp_async(u32 bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}
// Until the phase of parity `parity` has completed (a fresh barrier counts the phase before its
// first, parity 1, as completed).
__device__ __forceinline__ void mbar_wait(u32 bar, u32 parity) {
    asm volatile(
        "{\n"
        ".reg .pred done;\n"
        "WAIT_%=:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra WAIT_%=;\n"
        "}\n" ::"r"(bar),
        "r"(parity)
        : "memory");
}

// The barrier's current phase also waits for `bytes` more of asynchronous copies (no arrival).
__device__ __forceinline__ void mbar_expect_tx(u32 bar, u32 bytes) {
    asm volatile("mbarrier.expect_tx.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(bytes)
                 : "memory");
}
// Arrive on the barrier, its current phase waiting for `bytes` more of asynchronous copies.
__device__ __forceinline__ void mbar_arrive_expect_tx(u32 bar, u32 bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar),
                 "r"(bytes)
                 : "memory");
}

// A CUDA tensor map (CUtensorMap: 128 opaque bytes the host encodes with
// cuTensorMapEncodeTiled), passed to a kernel by value as a __grid_constant__ parameter.
struct __align__(64) TmaMap {
    u64 opaque[16];
};

// Fetch a tensor map into the descriptor cache ahead of its first copy.
__device__ __forceinline__ void tma_prefetch_map(const TmaMap* map) {
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<u64>(map)) : "memory");
}
// The box of `map` at coordinates (c0, c1[, c2]) into shared memory at `dst`, counted in
// barrier `bar`'s transaction bytes (elements past the tensor's bounds arrive as zeros).
__device__ __forceinline__ void tma_load_2d(u32 dst, const TmaMap* map, u32 bar, int c0, int c1) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
        "l"(reinterpret_cast<u64>(map)), "r"(c0), "r"(c1), "r"(bar)
        : "memory");
}
__device__ __forceinline__ void tma_load_3d(u32 dst, const TmaMap* map, u32 bar, int c0, int c1,
                                            int c2) {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(dst),
        "l"(reinterpret_cast<u64>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
        : "memory");
}

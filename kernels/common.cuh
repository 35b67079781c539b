// Shared helpers of every Nerva kernel: element types, 16-byte loads, reductions, the step
// metadata layout. Included textually by the daemon before NVRTC compiles each .cu file.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

typedef unsigned int u32;
typedef unsigned long long u64;

// A decode entry's input token is "what slot s sampled last step": the device token ring
// feeds the next step without the host ever seeing the token first.
#define NERVA_FROM_SLOT 0x80000000u

#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif

// Programmatic dependent launch (Hopper). The backend launches every kernel with programmatic
// stream serialization on sm_90+, so a kernel's blocks may be running while the kernel before it
// drains. The contract each kernel keeps:
//   - before pdl_wait it reads only what no unfinished kernel of the stream writes: weights, the
//     step's metadata and block tables (copied in before the step's first kernel), KV positions
//     of earlier steps; and it writes nothing;
//   - pdl_wait returns once every earlier kernel has finished and its writes are visible;
//   - pdl_trigger comes after pdl_wait, so when a kernel's blocks start early, every kernel
//     before its predecessor has already finished (what the first rule relies on).
// Both are no-ops before sm_90 and when the kernel was launched without the attribute.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

// Wait for the previous kernels, then let the next kernel's blocks be scheduled.
__device__ __forceinline__ void pdl_enter() {
    pdl_wait();
    pdl_trigger();
}

// Weights the kernels after this one will read, asked into L2 by a kernel that leaves HBM idle
// (decode attention at small batches reads a few KiB of KV per token while the next projection
// waits for it). Up to L2_RANGES ranges, 16-byte aligned, multiples of 16 bytes; zero bytes: none.
#define L2_RANGES 4
#define L2_CHUNK (64u * 1024u)
struct L2Prefetch {
    const char* ptr[L2_RANGES];
    unsigned bytes[L2_RANGES];
};

// Worker `w` of `workers` asks L2 for its share of the ranges' 64 KiB chunks (the TMA unit
// fetches them; nothing comes back to the SM). Consecutive workers must sit on different SMs:
// one SM's TMA unit prefetches only ~0.3 TB/s (measured: 16 MiB from one block cost ~60 µs per
// layer). A hint: it changes no result. sm_90+; a no-op before.
__device__ __forceinline__ void l2_prefetch(const L2Prefetch& pf, unsigned w, unsigned workers) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    unsigned base = 0, j = w;
#pragma unroll
    for (int r = 0; r < L2_RANGES; ++r) {
        const unsigned chunks = (pf.bytes[r] + L2_CHUNK - 1) / L2_CHUNK;
        for (; j < base + chunks; j += workers) {
            const unsigned off = (j - base) * L2_CHUNK;
            const unsigned n = min(L2_CHUNK, pf.bytes[r] - off);
            asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(pf.ptr[r] + off),
                         "r"(n)
                         : "memory");
        }
        base += chunks;
    }
#endif
}

// Eight 16-bit weights of one 16-byte load, widened to f32.
__device__ __forceinline__ void widen8(const uint4 raw, const __nv_bfloat16*, float out[8]) {
    const __nv_bfloat162* p = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        float2 f = __bfloat1622float2(p[i]);
        out[2 * i] = f.x;
        out[2 * i + 1] = f.y;
    }
}

__device__ __forceinline__ void widen8(const uint4 raw, const __half*, float out[8]) {
    const __half2* p = reinterpret_cast<const __half2*>(&raw);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        float2 f = __half22float2(p[i]);
        out[2 * i] = f.x;
        out[2 * i + 1] = f.y;
    }
}

__device__ __forceinline__ float widen(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float widen(__half v) { return __half2float(v); }
__device__ __forceinline__ void narrow(float v, __nv_bfloat16* out) { *out = __float2bfloat16_rn(v); }
__device__ __forceinline__ void narrow(float v, __half* out) { *out = __float2half_rn(v); }

// Streamed weights are read once per step: keep them out of L1 so activations stay there.
__device__ __forceinline__ uint4 load_stream(const void* p) {
    return __ldcs(reinterpret_cast<const uint4*>(p));
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ double warp_sum_d(double v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Block-wide sum in a fixed tree order (warp shuffles, then warp 0 over the warp partials):
// the same inputs give the same bits whatever else runs.
__device__ __forceinline__ double block_sum_d(double v, double* scratch /* [32] */) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_sum_d(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    const int warps = (blockDim.x + 31) >> 5;
    double r = lane < warps ? scratch[lane] : 0.0;
    r = warp_sum_d(r);
    return r;  // valid in warp 0; callers broadcast through shared memory
}

// Broadcast warp 0 lane 0's value to the block.
template <typename T>
__device__ __forceinline__ T block_broadcast(T v, T* slot) {
    __syncthreads();
    if (threadIdx.x == 0) *slot = v;
    __syncthreads();
    return *slot;
}

// f32 → u32 key whose unsigned order is the float order (for selections on logits).
__device__ __forceinline__ u32 order_key(float f) {
    u32 b = __float_as_uint(f);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// Per-token and per-sequence arrays of one step, uploaded by the host before the step runs.
struct StepMeta {
    const u32* token;      // [tokens] token id, or NERVA_FROM_SLOT | slot
    const int* position;   // [tokens]
    const int* token_seq;  // [tokens] batch index of the token's sequence
    const int* seq_slot;   // [seqs] sampling slot (also the block-table row)
    const int* counts;     // [0] tokens, [1] seqs, [2] logit rows
    const int* lrow_token; // [logit rows] token whose final hidden state the row projects
    const int* lrow_seq;   // [logit rows] batch index of the row's sequence
    const int* lrow_sample;  // [logit rows] 1 when the row is sampled
    const int* token_slot;   // [tokens] seq_slot[token_seq[t]], one load instead of two
};

// Where element k of a projection input row prepared by to_half (prefill.cu) lies: in order, or
// (wg) in the wgmma GEMM's order, where chunk c (elements 8c .. 8c + 7) of a group of 64 puts
// its element pairs 8 apart from 32 (c / 4) + 2 (c % 4) on (mma.cuh, wg_gemm_body).
__device__ __forceinline__ int xhat_at(int k, int wg) {
    if (!wg) return k;
    const int r = k & 63, c = r >> 3, e = r & 7;
    return (k - r) + 32 * (c >> 2) + 2 * (c & 3) + 8 * (e >> 1) + (e & 1);
}

// Asynchronous 16-byte copies global → shared (sm_80+); `valid` false zero-fills.
__device__ __forceinline__ void cp_async16(u32 dst, const void* src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(valid ? 16 : 0)
                 : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

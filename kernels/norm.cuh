// RMSNorm pieces shared by the kernels that fuse a norm (the projections' prologue computes its
// own; per-head QK-norm uses this warp version). Sums of squares in f64 like the CPU reference.
#pragma once
#include "common.cuh"

// 1 / sqrt(mean(v^2) + eps) of a vector spread over one warp (each lane passes its part's sum).
__device__ __forceinline__ float warp_rms_inv(double lane_sum_sq, int n, float eps) {
    const double s = warp_sum_d(lane_sum_sq);
    const float var = (float)(s / n);
    return 1.0f / sqrtf(var + eps);
}

// The squares of a chunk's 8 elements, in f64, summed left to right: one term of a thread's sum
// in rows_rms_inv's order (every caller adds it with `ss += sum_sq8(a, b)`).
__device__ __forceinline__ double sum_sq8(float4 a, float4 b) {
    return (double)a.x * a.x + (double)a.y * a.y + (double)a.z * a.z + (double)a.w * a.w +
           (double)b.x * b.x + (double)b.y * b.y + (double)b.z * b.z + (double)b.w * b.w;
}

// rows_rms_inv's end, once threads 0..127 hold their sums ss[t] (threads past 127 pass
// nothing): a shuffle tree per warp, then warps 0..3 in order. Every thread of the block calls
// it (it holds barriers).
template <int TT>
__device__ __forceinline__ void rms_inv_finish(const double (&ss)[TT], int K, float eps,
                                               double* ss_red, float* inv) {
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    if (tid < 128) {
#pragma unroll
        for (int t = 0; t < TT; ++t) {
            const double s = warp_sum_d(ss[t]);
            if (lane == 0) ss_red[warp * TT + t] = s;
        }
    }
    __syncthreads();
    if (tid < TT) {
        double s = 0.0;
#pragma unroll
        for (int wi = 0; wi < 4; ++wi) s += ss_red[wi * TT + tid];
        inv[tid] = 1.0f / sqrtf((float)(s / K) + eps);
    }
    __syncthreads();
}

// 1 / sqrt(mean(x^2) + eps) of token rows x[rows[t]] (t < n ≤ TT) into inv[t], in the one order
// every projection prologue uses (gemv.cu, mma.cuh, and prefill.cu's to_half), so a row
// normalized by any of them has the same bits: threads 0..127 each sum chunks tid, tid + 128, ...
// (8 squares each, in f64), a shuffle tree per warp, then warps 0..3 in order. Every thread of
// the block calls it (it holds barriers); ss_red is [4][TT] in shared memory.
template <int TT, int UNROLL = 1>
__device__ __forceinline__ void rows_rms_inv(const float* __restrict__ x, int x_stride,
                                             const int* rows, int n, int K, float eps,
                                             double* ss_red, float* inv) {
    const int tid = threadIdx.x;
    double ss[TT];
#pragma unroll
    for (int t = 0; t < TT; ++t) ss[t] = 0.0;
    if (tid < 128) {
        // UNROLL > 1: that many of a thread's loads in flight together (to_half, whose blocks do
        // nothing else; the projections' prologues keep their registers); each sum still takes
        // its chunks in ascending order.
#pragma unroll UNROLL
        for (int c = tid; c < K / 8; c += 128) {
#pragma unroll
            for (int t = 0; t < TT; ++t) {
                if (t >= n) continue;
                const float* row = x + (size_t)rows[t] * x_stride + c * 8;
                const float4 a = *reinterpret_cast<const float4*>(row);
                const float4 b = *reinterpret_cast<const float4*>(row + 4);
                ss[t] += sum_sq8(a, b);
            }
        }
    }
    rms_inv_finish<TT>(ss, K, eps, ss_red, inv);
}

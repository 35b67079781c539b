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

// The last step of rms_inv_finish, once warps 0..3 have put their sums in ss_red[warp][t]: the
// warps' sums in order, then inv. Every thread of the block calls it (it holds barriers).
template <int TT>
__device__ __forceinline__ void rms_inv_final(int K, float eps, const double* ss_red, float* inv) {
    const int tid = threadIdx.x;
    __syncthreads();
    if (tid < TT) {
        double s = 0.0;
#pragma unroll
        for (int wi = 0; wi < 4; ++wi) s += ss_red[wi * TT + tid];
        inv[tid] = 1.0f / sqrtf((float)(s / K) + eps);
    }
    __syncthreads();
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
    rms_inv_final<TT>(K, eps, ss_red, inv);
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

// rows_rms_inv from the rows' chunk sums of squares already in memory: ssq[row * K / 8 + c] is
// sum_sq8 of chunk c of x row `row`, stored by the kernel that wrote the row (mma.cuh's
// residual-add epilogue, store_chunk_ssq). Each thread adds its chunks tid, tid + 128, ... in
// ascending order, then each warp's shuffle tree and the warps in order, as rows_rms_inv does,
// so inv has the same bits; but a row's loads all go out before its first addition (one round
// trip instead of K / 1,024: 4 at qwen3-8b's K = 4,096) and carry 8 bytes per chunk instead of
// 32. One row after another, only the n present (one round trip each), so that the register
// kernels keep their registers (all TT rows' loads at once spilled n1).
template <int TT>
__device__ __forceinline__ void rows_rms_inv_ssq(const double* __restrict__ ssq, const int* rows,
                                                 int n, int K, float eps, double* ss_red,
                                                 float* inv) {
    constexpr int AHEAD = 4;  // chunks per thread in flight
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, chunks = K / 8;
    if (tid < 128) {
#pragma unroll 1
        for (int t = 0; t < TT; ++t) {
            // Past n: rows_rms_inv's zero sums (no warp tree needed for them).
            double s = 0.0;
            if (t < n) {
                const double* row = ssq + (size_t)rows[t] * chunks;
#pragma unroll 1
                for (int c0 = tid; c0 < chunks; c0 += 128 * AHEAD) {
                    double part[AHEAD];
#pragma unroll
                    for (int j = 0; j < AHEAD; ++j)
                        part[j] = c0 + 128 * j < chunks ? row[c0 + 128 * j] : 0.0;
#pragma unroll
                    for (int j = 0; j < AHEAD; ++j)
                        if (c0 + 128 * j < chunks) s += part[j];
                }
                s = warp_sum_d(s);
            }
            if (lane == 0) ss_red[warp * TT + t] = s;
        }
    }
    rms_inv_final<TT>(K, eps, ss_red, inv);
}

// Chunk c of a row as rows_rms_inv's term (sum_sq8 of its 8 values, v[i * stride] for i < 8),
// at ssq[row * chunks + c]: what rows_rms_inv_ssq reads back.
__device__ __forceinline__ void store_chunk_ssq(double* __restrict__ ssq, size_t row, int chunks,
                                                int c, const float* v, int stride) {
    const float4 a = make_float4(v[0], v[stride], v[2 * stride], v[3 * stride]);
    const float4 b = make_float4(v[4 * stride], v[5 * stride], v[6 * stride], v[7 * stride]);
    ssq[row * chunks + c] = sum_sq8(a, b);
}

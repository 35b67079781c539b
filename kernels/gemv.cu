// Projections: y[t, r] (=|+=) sum_k in(x)[t, k] * W[r, k] (+ bias[r]) for the tokens of one step.
//
// Decode is bandwidth-bound: every weight is read once per step whatever the batch. The design
// keeps the memory system saturated from the first cycle to the last:
//   - one warp owns a row (two rows for 4- and 8-token tiles, so each input value read serves
//     two weights): no cross-warp reduction, no barrier per row;
//   - persistent blocks (as many as fit on the device) walk the rows grid-stride, so the block
//     prologue (RMSNorm statistics, input staging) runs once per resident block, not once per
//     handful of rows, and there is no tail of short-lived blocks;
//   - 16-byte streaming loads, a batch of 8 per lane in flight, and the next batch (of this row
//     or the warp's next row) issued before the current one is consumed;
//   - the first batch is issued before the prologue: it does not depend on the previous
//     kernel's output.
// The prepared input (normalized / activated, f32) is staged in shared memory when it fits
// (STAGED), otherwise each lane prepares the values it needs straight from global memory; the
// two paths compute the same expressions, so they give the same bits.
//
// Prologues fuse what would otherwise be a kernel and a round trip through memory:
//   RMS  – RMSNorm of the input row (input_layernorm / post_attention_layernorm / final norm);
//   SILU – silu(gate) * up from the fused gate|up output;
//   PLAIN – the input as is.
// Epilogue ADD accumulates into y (the residual stream): o_proj and down_proj write x += ...
//
// Batch invariance: each output element is reduced in one fixed order — lane l sums its chunks
// l, l+32, l+64, ... (8 products each, in order), then a fixed shuffle tree over the 32 lanes —
// whatever the number of tokens, the tile width, the staging path or the grid size.
#include "common.cuh"
#include "activation.cuh"

#define GEMV_THREADS 128
#define GEMV_WARPS (GEMV_THREADS / 32)

enum { IN_RMS = 0, IN_PLAIN = 1, IN_SILU = 2 };

// Rows per warp and 16-byte chunks per lane per load batch for a tile of TT tokens.
template <int TT> struct GemvShape {
    static constexpr int RPW = TT >= 4 ? 2 : 1;
    static constexpr int BATCH = 8 / RPW;
};

// Chunk c (8 values) of token row `row` as the projection consumes it.
template <int IN>
__device__ __forceinline__ void prepare8(const float* __restrict__ row, int K, int c,
                                         const float* __restrict__ norm_w, float inv,
                                         float v[8]) {
    const float4 a = *reinterpret_cast<const float4*>(row + c * 8);
    const float4 b = *reinterpret_cast<const float4*>(row + c * 8 + 4);
    v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
    v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
    if (IN == IN_RMS) {
        const float4 na = *reinterpret_cast<const float4*>(norm_w + c * 8);
        const float4 nb = *reinterpret_cast<const float4*>(norm_w + c * 8 + 4);
        const float n[8] = {na.x, na.y, na.z, na.w, nb.x, nb.y, nb.z, nb.w};
#pragma unroll
        for (int i = 0; i < 8; ++i) v[i] = n[i] * (v[i] * inv);
    } else if (IN == IN_SILU) {
        const float4 ua = *reinterpret_cast<const float4*>(row + K + c * 8);
        const float4 ub = *reinterpret_cast<const float4*>(row + K + c * 8 + 4);
        const float u[8] = {ua.x, ua.y, ua.z, ua.w, ub.x, ub.y, ub.z, ub.w};
#pragma unroll
        for (int i = 0; i < 8; ++i) v[i] = silu(v[i]) * u[i];
    }
}

// Batch b of a lane's chunks (lane + 32 * (b * BATCH + j)) for RPW adjacent rows; zeros past
// the matrix (no memory access).
template <typename W, int RPW, int BATCH>
__device__ __forceinline__ void load_batch(const W* __restrict__ w, int row0, int R, int K,
                                           int chunks, int lane, int b,
                                           uint4 out[RPW][BATCH]) {
#pragma unroll
    for (int r = 0; r < RPW; ++r) {
        const int row = row0 + r;
#pragma unroll
        for (int j = 0; j < BATCH; ++j) {
            const int c = lane + 32 * (b * BATCH + j);
            out[r][j] = (row < R && c < chunks) ? load_stream(w + (size_t)row * K + c * 8)
                                                : make_uint4(0, 0, 0, 0);
        }
    }
}

template <typename W, int TT, int IN, bool ADD, bool STAGED>
__device__ __forceinline__ void gemv_body(const W* __restrict__ w, const float* __restrict__ bias,
                                          const float* __restrict__ x, int x_stride,
                                          const int* __restrict__ x_rows,
                                          const float* __restrict__ norm_w, float eps, int K,
                                          int R, int T, float* __restrict__ y, int y_stride) {
    constexpr int RPW = GemvShape<TT>::RPW;
    constexpr int BATCH = GemvShape<TT>::BATCH;
    extern __shared__ float4 stage4[];  // STAGED: [TT][K] prepared inputs
    float* stage = reinterpret_cast<float*>(stage4);
    __shared__ double ss_red[GEMV_WARPS][TT];
    __shared__ float inv[TT];
    __shared__ int rows[TT];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int chunks = K / 8;
    const int batches = ((chunks + 31) / 32 + BATCH - 1) / BATCH;
    const int first = (blockIdx.x * GEMV_WARPS + warp) * RPW;
    const int stride = gridDim.x * GEMV_WARPS * RPW;

    for (int t0 = 0; t0 < T; t0 += TT) {
        uint4 cur[RPW][BATCH];
        load_batch<W, RPW, BATCH>(w, first, R, K, chunks, lane, 0, cur);
        if (tid < TT) {
            const int t = t0 + tid < T ? t0 + tid : t0;
            rows[tid] = x_rows ? x_rows[t] : t;
        }
        __syncthreads();
        if (IN == IN_RMS) {
            double ss[TT];
#pragma unroll
            for (int t = 0; t < TT; ++t) ss[t] = 0.0;
            for (int c = tid; c < chunks; c += GEMV_THREADS) {
#pragma unroll
                for (int t = 0; t < TT; ++t) {
                    if (t0 + t >= T) continue;
                    const float* row = x + (size_t)rows[t] * x_stride + c * 8;
                    const float4 a = *reinterpret_cast<const float4*>(row);
                    const float4 b = *reinterpret_cast<const float4*>(row + 4);
                    ss[t] += (double)a.x * a.x + (double)a.y * a.y + (double)a.z * a.z +
                             (double)a.w * a.w + (double)b.x * b.x + (double)b.y * b.y +
                             (double)b.z * b.z + (double)b.w * b.w;
                }
            }
#pragma unroll
            for (int t = 0; t < TT; ++t) {
                const double s = warp_sum_d(ss[t]);
                if (lane == 0) ss_red[warp][t] = s;
            }
            __syncthreads();
            if (tid < TT) {
                double s = 0.0;
                for (int wi = 0; wi < GEMV_WARPS; ++wi) s += ss_red[wi][tid];
                inv[tid] = 1.0f / sqrtf((float)(s / K) + eps);
            }
            __syncthreads();
        }
        if (STAGED) {
            for (int c = tid; c < chunks; c += GEMV_THREADS) {
#pragma unroll
                for (int t = 0; t < TT; ++t) {
                    float v[8];
                    if (t0 + t < T) {
                        prepare8<IN>(x + (size_t)rows[t] * x_stride, K, c, norm_w,
                                     IN == IN_RMS ? inv[t] : 1.f, v);
                    } else {
#pragma unroll
                        for (int i = 0; i < 8; ++i) v[i] = 0.f;
                    }
                    float4* dst = reinterpret_cast<float4*>(stage + (size_t)t * K + c * 8);
                    dst[0] = make_float4(v[0], v[1], v[2], v[3]);
                    dst[1] = make_float4(v[4], v[5], v[6], v[7]);
                }
            }
            __syncthreads();
        }

        for (int row0 = first; row0 < R; row0 += stride) {
            float acc[RPW][TT];
#pragma unroll
            for (int r = 0; r < RPW; ++r)
#pragma unroll
                for (int t = 0; t < TT; ++t) acc[r][t] = 0.f;
            for (int b = 0; b < batches; ++b) {
                // The next batch of these rows, else the first batch of the warp's next rows.
                uint4 next[RPW][BATCH];
                const bool last = b + 1 == batches;
                load_batch<W, RPW, BATCH>(w, last ? row0 + stride : row0, R, K, chunks, lane,
                                          last ? 0 : b + 1, next);
#pragma unroll
                for (int j = 0; j < BATCH; ++j) {
                    const int c = lane + 32 * (b * BATCH + j);
                    if (c >= chunks) break;
                    float wf[RPW][8];
#pragma unroll
                    for (int r = 0; r < RPW; ++r) widen8(cur[r][j], w, wf[r]);
#pragma unroll
                    for (int t = 0; t < TT; ++t) {
                        float xv[8];
                        if (STAGED) {
                            const float4* src =
                                reinterpret_cast<const float4*>(stage + (size_t)t * K + c * 8);
                            const float4 a = src[0], bb = src[1];
                            xv[0] = a.x; xv[1] = a.y; xv[2] = a.z; xv[3] = a.w;
                            xv[4] = bb.x; xv[5] = bb.y; xv[6] = bb.z; xv[7] = bb.w;
                        } else if (t0 + t < T) {
                            prepare8<IN>(x + (size_t)rows[t] * x_stride, K, c, norm_w,
                                         IN == IN_RMS ? inv[t] : 1.f, xv);
                        } else {
#pragma unroll
                            for (int i = 0; i < 8; ++i) xv[i] = 0.f;
                        }
#pragma unroll
                        for (int r = 0; r < RPW; ++r)
#pragma unroll
                            for (int i = 0; i < 8; ++i)
                                acc[r][t] = fmaf(wf[r][i], xv[i], acc[r][t]);
                    }
                }
#pragma unroll
                for (int r = 0; r < RPW; ++r)
#pragma unroll
                    for (int j = 0; j < BATCH; ++j) cur[r][j] = next[r][j];
            }
#pragma unroll
            for (int r = 0; r < RPW; ++r)
#pragma unroll
                for (int t = 0; t < TT; ++t) {
                    const float s = warp_sum(acc[r][t]);
                    const int row = row0 + r;
                    if (lane == ((r * TT + t) & 31) && row < R && t0 + t < T) {
                        const float v = bias ? s + bias[row] : s;
                        float* out = y + (size_t)(t0 + t) * y_stride + row;
                        if (ADD) *out += v; else *out = v;
                    }
                }
        }
        // The next tile restages the shared inputs.
        __syncthreads();
    }
}

#define GEMV_ENTRY(NAME, W, TT, IN, ADD, STAGED)                                               \
    extern "C" __global__ void __launch_bounds__(GEMV_THREADS)                                 \
        NAME(const W* __restrict__ w, const float* __restrict__ bias,                          \
             const float* __restrict__ x, int x_stride, const int* __restrict__ x_rows,        \
             const float* __restrict__ norm_w, float eps, int K, int R, int T,                  \
             float* __restrict__ y, int y_stride) {                                            \
        gemv_body<W, TT, IN, ADD, STAGED>(w, bias, x, x_stride, x_rows, norm_w, eps, K, R, T,   \
                                          y, y_stride);                                        \
    }

// Per family: staged tiles of 1, 2, 4, 8 tokens, and unstaged ones for inputs too large to
// stage (a single token always fits: K ≤ 16384 is 64 KiB).
#define GEMV_TILES(MODE, IN, ADD, DT, W)                        \
    GEMV_ENTRY(gemv_##MODE##_##DT##_t1, W, 1, IN, ADD, true)    \
    GEMV_ENTRY(gemv_##MODE##_##DT##_t2, W, 2, IN, ADD, true)    \
    GEMV_ENTRY(gemv_##MODE##_##DT##_t4, W, 4, IN, ADD, true)    \
    GEMV_ENTRY(gemv_##MODE##_##DT##_t8, W, 8, IN, ADD, true)    \
    GEMV_ENTRY(gemv_##MODE##_##DT##_t2g, W, 2, IN, ADD, false)  \
    GEMV_ENTRY(gemv_##MODE##_##DT##_t4g, W, 4, IN, ADD, false)  \
    GEMV_ENTRY(gemv_##MODE##_##DT##_t8g, W, 8, IN, ADD, false)

#define GEMV_DTYPE(DT, W)                        \
    GEMV_TILES(rms, IN_RMS, false, DT, W)        \
    GEMV_TILES(plain_add, IN_PLAIN, true, DT, W) \
    GEMV_TILES(silu_add, IN_SILU, true, DT, W)

GEMV_DTYPE(bf16, __nv_bfloat16)
GEMV_DTYPE(f16, __half)

// Projections: y[t, r] (=|+=) sum_k in(x)[t, k] * W[r, k] (+ bias[r]) for the tokens of one step.
//
// Decode is bandwidth-bound: every weight is read once per step whatever the batch, with 16-byte
// streaming loads, several loads in flight per thread, and the full K of a block's rows split
// over all its warps. Activations are f32 (read through L1/L2, reused by every block).
//
// Prologues fuse what would otherwise be a kernel and a round trip through memory:
//   RMS  – RMSNorm of the input row (the layer's input_layernorm / post_attention_layernorm /
//          final norm) computed in the block and applied on the fly;
//   PLAIN – the input as is.
// Epilogues: STORE writes y; ADD accumulates into y (the residual stream: o_proj and down_proj
// write x += ...); GLU takes the gate|up matrix with its rows interleaved in pairs (block b
// holds gate rows 2b, 2b+1 then up rows 2b, 2b+1) and writes silu(gate) * up, so the MLP's
// activation is computed once per step instead of once per down_proj block.
//
// Batch invariance: each output element is reduced in one fixed order (per-thread k order, then
// a fixed shuffle tree, then warps 0..3) whatever the number of tokens or the tile width.
#include "common.cuh"
#include "activation.cuh"
#include "norm.cuh"

#define GEMV_THREADS 128
#define GEMV_WARPS (GEMV_THREADS / 32)
// Rows per block: 4, or 2 for matrices with few rows (more, shorter-lived blocks: the launch
// ramp and the last wave's tail weigh less). The reduction of a row does not depend on it.

enum { IN_RMS = 0, IN_PLAIN = 1 };
enum { EPI_STORE = 0, EPI_ADD = 1, EPI_GLU = 2 };

template <int TT, int IN>
__device__ __forceinline__ void load_inputs(const float* __restrict__ x, int x_stride,
                                            const int* rows, int t0, int T, int c,
                                            const float* __restrict__ norm_w, const float* inv,
                                            float xv[TT][8]) {
#pragma unroll
    for (int t = 0; t < TT; ++t) {
        if (t0 + t >= T) {
#pragma unroll
            for (int i = 0; i < 8; ++i) xv[t][i] = 0.f;
            continue;
        }
        const float* row = x + (size_t)rows[t] * x_stride;
        const float4 a = *reinterpret_cast<const float4*>(row + c * 8);
        const float4 b = *reinterpret_cast<const float4*>(row + c * 8 + 4);
        float v[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
        if (IN == IN_RMS) {
            const float4 na = *reinterpret_cast<const float4*>(norm_w + c * 8);
            const float4 nb = *reinterpret_cast<const float4*>(norm_w + c * 8 + 4);
            const float n[8] = {na.x, na.y, na.z, na.w, nb.x, nb.y, nb.z, nb.w};
#pragma unroll
            for (int i = 0; i < 8; ++i) v[i] = n[i] * (v[i] * inv[t]);
        }
#pragma unroll
        for (int i = 0; i < 8; ++i) xv[t][i] = v[i];
    }
}

// Chunk c (8 weights) of each of the block's rows; zeros past the matrix.
template <typename W, int ROWS>
__device__ __forceinline__ void load_rows(const W* __restrict__ w, int row0, int R, int K, int c,
                                          int chunks, uint4 out[ROWS]) {
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
        const int row = row0 + r;
        out[r] = (c < chunks && row < R) ? load_stream(w + (size_t)row * K + c * 8)
                                         : make_uint4(0, 0, 0, 0);
    }
}

template <typename W, int TT, int IN, int EPI, int GEMV_ROWS>
__device__ __forceinline__ void gemv_body(const W* __restrict__ w, const float* __restrict__ bias,
                                          const float* __restrict__ x, int x_stride,
                                          const int* __restrict__ x_rows,
                                          const float* __restrict__ norm_w, float eps, int K,
                                          int R, int T, float* __restrict__ y, int y_stride) {
    __shared__ float red[GEMV_WARPS][GEMV_ROWS * TT];
    __shared__ double ss_red[GEMV_WARPS][TT];
    __shared__ float inv[TT];
    __shared__ int rows[TT];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int row0 = blockIdx.x * GEMV_ROWS;
    const int chunks = K / 8;

    for (int t0 = 0; t0 < T; t0 += TT) {
        // The first chunk's weights do not depend on the previous kernel's output: their loads
        // go out before the prologue's reductions, and each later chunk's loads before the
        // current chunk's arithmetic (two chunks in flight per row).
        uint4 wr[GEMV_ROWS];
        load_rows<W, GEMV_ROWS>(w, row0, R, K, tid, chunks, wr);
        // Weights only until the previous kernel is done: these loads overlap its drain.
        if (t0 == 0) pdl_enter();
        __syncthreads();
        if (tid < TT) {
            const int t = t0 + tid < T ? t0 + tid : t0;
            rows[tid] = x_rows ? x_rows[t] : t;
        }
        __syncthreads();
        if (IN == IN_RMS)
            rows_rms_inv<TT>(x, x_stride, rows, T - t0, K, eps, &ss_red[0][0], inv);

        float acc[GEMV_ROWS][TT];
#pragma unroll
        for (int r = 0; r < GEMV_ROWS; ++r)
#pragma unroll
            for (int t = 0; t < TT; ++t) acc[r][t] = 0.f;

        for (int c = tid; c < chunks; c += GEMV_THREADS) {
            uint4 next[GEMV_ROWS];
            load_rows<W, GEMV_ROWS>(w, row0, R, K, c + GEMV_THREADS, chunks, next);
            float xv[TT][8];
            load_inputs<TT, IN>(x, x_stride, rows, t0, T, c, norm_w, inv, xv);
#pragma unroll
            for (int r = 0; r < GEMV_ROWS; ++r) {
                float wf[8];
                widen8(wr[r], w, wf);
#pragma unroll
                for (int t = 0; t < TT; ++t)
#pragma unroll
                    for (int i = 0; i < 8; ++i) acc[r][t] = fmaf(wf[i], xv[t][i], acc[r][t]);
            }
#pragma unroll
            for (int r = 0; r < GEMV_ROWS; ++r) wr[r] = next[r];
        }

#pragma unroll
        for (int r = 0; r < GEMV_ROWS; ++r)
#pragma unroll
            for (int t = 0; t < TT; ++t) {
                const float s = warp_sum(acc[r][t]);
                if (lane == 0) red[warp][r * TT + t] = s;
            }
        __syncthreads();
        if (EPI == EPI_GLU) {
            // Output j of this block pairs gate row row0 + j with up row row0 + 2 + j.
            if (tid < 2 * TT) {
                const int j = tid / TT, t = tid % TT;
                if (row0 + 2 + j < R && t0 + t < T) {
                    float g = 0.f, u = 0.f;
#pragma unroll
                    for (int wi = 0; wi < GEMV_WARPS; ++wi) g += red[wi][j * TT + t];
#pragma unroll
                    for (int wi = 0; wi < GEMV_WARPS; ++wi) u += red[wi][(j + 2) * TT + t];
                    if (bias) {
                        g += bias[row0 + j];
                        u += bias[row0 + 2 + j];
                    }
                    y[(size_t)(t0 + t) * y_stride + blockIdx.x * 2 + j] = silu(g) * u;
                }
            }
        } else if (tid < GEMV_ROWS * TT) {
            const int r = tid / TT, t = tid % TT;
            const int row = row0 + r;
            if (row < R && t0 + t < T) {
                float s = 0.f;
#pragma unroll
                for (int wi = 0; wi < GEMV_WARPS; ++wi) s += red[wi][tid];
                if (bias) s += bias[row];
                float* out = y + (size_t)(t0 + t) * y_stride + row;
                if (EPI == EPI_ADD) *out += s; else *out = s;
            }
        }
    }
}

#define GEMV_ENTRY(NAME, W, TT, IN, EPI, ROWS)                                                 \
    extern "C" __global__ void __launch_bounds__(GEMV_THREADS)                                 \
        NAME(const W* __restrict__ w, const float* __restrict__ bias,                          \
             const float* __restrict__ x, int x_stride, const int* __restrict__ x_rows,        \
             const float* __restrict__ norm_w, float eps, int K, int R, int T,                  \
             float* __restrict__ y, int y_stride) {                                            \
        gemv_body<W, TT, IN, EPI, ROWS>(w, bias, x, x_stride, x_rows, norm_w, eps, K, R, T, y,  \
                                        y_stride);                                             \
    }

#define GEMV_TILES(MODE, IN, EPI, DT, W, ROWS, SUFFIX)                     \
    GEMV_ENTRY(gemv_##MODE##_##DT##_t1##SUFFIX, W, 1, IN, EPI, ROWS)       \
    GEMV_ENTRY(gemv_##MODE##_##DT##_t2##SUFFIX, W, 2, IN, EPI, ROWS)       \
    GEMV_ENTRY(gemv_##MODE##_##DT##_t4##SUFFIX, W, 4, IN, EPI, ROWS)       \
    GEMV_ENTRY(gemv_##MODE##_##DT##_t8##SUFFIX, W, 8, IN, EPI, ROWS)

// The GLU epilogue pairs rows within a block of 4.
#define GEMV_DTYPE(DT, W)                                      \
    GEMV_TILES(rms, IN_RMS, EPI_STORE, DT, W, 4, )             \
    GEMV_TILES(rms, IN_RMS, EPI_STORE, DT, W, 2, _r2)          \
    GEMV_TILES(plain_add, IN_PLAIN, EPI_ADD, DT, W, 4, )       \
    GEMV_TILES(plain_add, IN_PLAIN, EPI_ADD, DT, W, 2, _r2)    \
    GEMV_TILES(glu, IN_RMS, EPI_GLU, DT, W, 4, )

GEMV_DTYPE(bf16, __nv_bfloat16)
GEMV_DTYPE(f16, __half)

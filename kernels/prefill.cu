// Prefill projections go through cuBLAS (tensor cores), which takes 16-bit inputs: these kernels
// prepare a projection's input rows as the GEMV kernels do (RMSNorm; silu(gate)·up from the
// gate|up output, whose rows come interleaved in pairs — see gemv.cu; or the rows as they are)
// and round them to the weights' type; add_bias adds a bias row after the GEMM. Block (t, s)
// prepares slice s of gridDim.y of token row t (the host's `to_half_grid`: few tokens still give
// every SM blocks, where one block per row left most SMs idle and each thread waited on a dozen
// loads in turn); with RMSNorm every slice computes the row's norm itself, in the one order. With
// `wg_order` the row is stored in the wgmma GEMM's order (K a multiple of 64).
#include "common.cuh"
#include "activation.cuh"
#include "norm.cuh"

// 128 threads, and the norm through rows_rms_inv as in the GEMV/mma prologues: a prepared row has
// the bits those kernels compute.
#define HALF_THREADS 128

enum { IN_RMS = 0, IN_PLAIN = 1, IN_GLU = 2 };

// Chunk c of a prepared row (elements 8c .. 8c + 7, rounded to W and packed in u) into dst, in
// order or in the wgmma GEMM's.
template <typename W>
__device__ __forceinline__ void store_packed(uint4 u, int c, int wg_order, W* __restrict__ dst) {
    if (wg_order) {
        // The wgmma GEMM's order (mma.cuh, wg_gemm_body): chunk c is elements 8 cc .. 8 cc + 7
        // of half q of its group of 64; mma step 2q + jj takes its elements 4 jj, 4 jj + 1 at
        // logical k 2 cc, 2 cc + 1 and 4 jj + 2, 4 jj + 3 at 8 + 2 cc, 8 + 2 cc + 1, and the
        // group stores step s's logical k l at 16 s + l.
        const int q = (c % 8) / 4, cc = c % 4;
        u32* d = reinterpret_cast<u32*>(dst + (c / 8) * 64 + 32 * q + 2 * cc);
        d[0] = u.x;
        d[4] = u.y;
        d[8] = u.z;
        d[12] = u.w;
    } else {
        *reinterpret_cast<uint4*>(dst + c * 8) = u;
    }
}

// A row's RMSNorm with the row held in registers between its sum of squares and the store of
// the block's slice (chunks c0 .. c1 - 1): each thread loads its chunks tid, tid + 128, ... once,
// all in flight together, and sums them in rows_rms_inv's order (the same bits), where the
// general path loads the slice a second time to store it (ncu, 1,024 tokens of qwen3-8b on the
// H200: 10.5 us per launch, about half the bandwidth for 25 MB). Rows of up to 4 chunks per
// thread (K ≤ 4,096) take it; longer ones the general path.
#define HALF_HELD 4
template <typename W>
__device__ __forceinline__ void to_half_rms_held(const float* __restrict__ row,
                                                 const float* __restrict__ norm_w, float eps,
                                                 int K, int c0, int c1, int wg_order,
                                                 double* scratch, float* inv_s,
                                                 W* __restrict__ dst) {
    const int tid = threadIdx.x, chunks = K / 8;
    float v[HALF_HELD][8];
#pragma unroll
    for (int i = 0; i < HALF_HELD; ++i) {
        const int c = tid + HALF_THREADS * i;
        if (c >= chunks) break;
        const float4 a = *reinterpret_cast<const float4*>(row + c * 8);
        const float4 b = *reinterpret_cast<const float4*>(row + c * 8 + 4);
        v[i][0] = a.x; v[i][1] = a.y; v[i][2] = a.z; v[i][3] = a.w;
        v[i][4] = b.x; v[i][5] = b.y; v[i][6] = b.z; v[i][7] = b.w;
    }
    double ss[1] = {0.0};
#pragma unroll
    for (int i = 0; i < HALF_HELD; ++i) {
        if (tid + HALF_THREADS * i >= chunks) break;
        ss[0] += sum_sq8(make_float4(v[i][0], v[i][1], v[i][2], v[i][3]),
                         make_float4(v[i][4], v[i][5], v[i][6], v[i][7]));
    }
    rms_inv_finish<1>(ss, K, eps, scratch, inv_s);
    const float inv = *inv_s;
#pragma unroll
    for (int i = 0; i < HALF_HELD; ++i) {
        const int c = tid + HALF_THREADS * i;
        if (c >= chunks) break;
        if (c < c0 || c >= c1) continue;
        const float4 na = *reinterpret_cast<const float4*>(norm_w + c * 8);
        const float4 nb = *reinterpret_cast<const float4*>(norm_w + c * 8 + 4);
        const float n[8] = {na.x, na.y, na.z, na.w, nb.x, nb.y, nb.z, nb.w};
        union {
            W h[8];
            uint4 u;
        } pack;
#pragma unroll
        for (int e = 0; e < 8; ++e) narrow(n[e] * (v[i][e] * inv), &pack.h[e]);
        store_packed(pack.u, c, wg_order, dst);
    }
}

template <typename W, int IN>
__device__ __forceinline__ void to_half_body(const float* __restrict__ x, int x_stride, int t0,
                                             const int* __restrict__ rows,
                                             const float* __restrict__ norm_w, float eps, int K,
                                             int wg_order, W* __restrict__ out) {
    __shared__ double scratch[HALF_THREADS / 32];
    static_assert(HALF_THREADS == 128, "rows_rms_inv's order is that of 128 threads");
    __shared__ float inv_s;
    pdl_enter();
    const int t = rows ? rows[t0 + blockIdx.x] : t0 + blockIdx.x;
    const float* row = x + (size_t)t * x_stride;
    const int chunks = K / 8;
    W* dst = out + (size_t)blockIdx.x * K;
    const int c0 = (int)((long long)chunks * blockIdx.y / gridDim.y);
    const int c1 = (int)((long long)chunks * (blockIdx.y + 1) / gridDim.y);
    if (IN == IN_RMS && chunks <= HALF_THREADS * HALF_HELD) {
        to_half_rms_held(row, norm_w, eps, K, c0, c1, wg_order, scratch, &inv_s, dst);
        return;
    }
    float inv = 1.f;
    if (IN == IN_RMS) {
        rows_rms_inv<1, 4>(x, x_stride, &t, 1, K, eps, scratch, &inv_s);
        inv = inv_s;
    }
    // Unrolled so that a thread's loads are in flight together (each chunk is independent).
#pragma unroll 4
    for (int c = c0 + threadIdx.x; c < c1; c += HALF_THREADS) {
        float v[8];
        if (IN == IN_GLU) {
            // Outputs 8c .. 8c+7 from gate|up values 16c .. 16c+15: (g, g, u, u) per pair.
            const float4* src = reinterpret_cast<const float4*>(row + c * 16);
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                const float4 gu = src[q];
                v[2 * q] = silu(gu.x) * gu.z;
                v[2 * q + 1] = silu(gu.y) * gu.w;
            }
        } else {
            const float4 a = *reinterpret_cast<const float4*>(row + c * 8);
            const float4 b = *reinterpret_cast<const float4*>(row + c * 8 + 4);
            v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
            v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
        }
        if (IN == IN_RMS) {
            const float4 na = *reinterpret_cast<const float4*>(norm_w + c * 8);
            const float4 nb = *reinterpret_cast<const float4*>(norm_w + c * 8 + 4);
            const float n[8] = {na.x, na.y, na.z, na.w, nb.x, nb.y, nb.z, nb.w};
#pragma unroll
            for (int i = 0; i < 8; ++i) v[i] = n[i] * (v[i] * inv);
        }
        union {
            W h[8];
            uint4 u;
        } pack;
#pragma unroll
        for (int i = 0; i < 8; ++i) narrow(v[i], &pack.h[i]);
        // store_packed's stores, written out: through the function sm_80's to_half_glu spills.
        if (wg_order) {
            const int q = (c % 8) / 4, cc = c % 4;
            u32* d = reinterpret_cast<u32*>(dst + (c / 8) * 64 + 32 * q + 2 * cc);
            d[0] = pack.u.x;
            d[4] = pack.u.y;
            d[8] = pack.u.z;
            d[12] = pack.u.w;
        } else {
            *reinterpret_cast<uint4*>(dst + c * 8) = pack.u;
        }
    }
}

#define HALF_ENTRY(MODE, IN, DT, W)                                                         \
    extern "C" __global__ void __launch_bounds__(HALF_THREADS) to_half_##MODE##_##DT(       \
        const float* x, int x_stride, int t0, const int* rows, const float* norm_w, float eps,  \
        int K, int wg_order, W* out) {                                                         \
        to_half_body<W, IN>(x, x_stride, t0, rows, norm_w, eps, K, wg_order, out);             \
    }

HALF_ENTRY(rms, IN_RMS, bf16, __nv_bfloat16)
HALF_ENTRY(plain, IN_PLAIN, bf16, __nv_bfloat16)
HALF_ENTRY(glu, IN_GLU, bf16, __nv_bfloat16)
HALF_ENTRY(rms, IN_RMS, f16, __half)
HALF_ENTRY(plain, IN_PLAIN, f16, __half)
HALF_ENTRY(glu, IN_GLU, f16, __half)

// y[t0 + blockIdx.x, r] += bias[r].
extern "C" __global__ void add_bias(float* __restrict__ y, int y_stride, int t0,
                                    const float* __restrict__ bias, int R) {
    pdl_enter();
    float* row = y + (size_t)(t0 + blockIdx.x) * y_stride;
    for (int r = threadIdx.x; r < R; r += blockDim.x) row[r] += bias[r];
}

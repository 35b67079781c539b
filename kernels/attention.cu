// Causal grouped-query attention over the paged KV pool, split over the context.
//
// Split-KV with a fixed split size: the visible span of a query token is cut into tiles of
// ATTN_TILE positions; block (t, kv head, z) takes tiles z, z + Z, z + 2Z, ... in order and keeps
// an online softmax over them for every query head of its group; attn_combine merges the Z
// partials of a head in order z = 0..Z-1. The reduction order of an output depends only on the
// token's position (never on the batch or what else runs), so results are batch-invariant, and
// Z blocks per kv head fill the SMs at batch 1. Prefill tokens use the same kernel (each token
// sees its own causal span; tokens of the same step were appended by rope_append before).
#include "common.cuh"
#include "kv.cuh"

#define ATTN_THREADS 128
#define ATTN_TILE 64
#define ATTN_MAX_GROUP 8
#define ATTN_MAX_DIM 256
#define ATTN_WARPS (ATTN_THREADS / 32)
// Value rows each warp has in flight.
#define ATTN_VLOADS 8
// Partials per head (must equal the host's ATTN_SPLITS).
#define ATTN_SPLITS 16
#define ATTN_MAX_EPL (ATTN_MAX_DIM / 32)

// `epl` consecutive elements of a KV row (epl = head_dim / 32: 2, 4 or 8) with one load.
template <typename KV>
__device__ __forceinline__ void load_lane(const KV* p, int epl, float v[ATTN_MAX_EPL]) {
    if (epl == 8) {
        widen8(*reinterpret_cast<const uint4*>(p), p, v);
    } else if (epl == 4) {
        const uint2 raw = *reinterpret_cast<const uint2*>(p);
        float w[8];
        widen8(make_uint4(raw.x, raw.y, 0, 0), p, w);
#pragma unroll
        for (int e = 0; e < 4; ++e) v[e] = w[e];
    } else {
        for (int e = 0; e < epl; ++e) v[e] = widen(p[e]);
    }
#pragma unroll
    for (int e = 0; e < ATTN_MAX_EPL; ++e)
        if (e >= epl) v[e] = 0.f;
}

template <typename KV>
__device__ __forceinline__ void attn_split_body(
    StepMeta meta, const float* __restrict__ q, const KV* __restrict__ kv,
    const int* __restrict__ tables, KvGeometry geo, int heads, int kv_heads, int head_dim,
    int window, float scale, float* __restrict__ part_o, float* __restrict__ part_ml) {
    __shared__ float qs[ATTN_MAX_GROUP][ATTN_MAX_DIM];
    __shared__ float sc[ATTN_MAX_GROUP][ATTN_TILE];
    __shared__ size_t vbase[ATTN_TILE];
    __shared__ float m_run[ATTN_MAX_GROUP], l_run[ATTN_MAX_GROUP], corr[ATTN_MAX_GROUP];
    __shared__ float red[ATTN_MAX_GROUP * ATTN_MAX_DIM];

    const int t = blockIdx.x, g = blockIdx.y, z = blockIdx.z, Z = gridDim.z;
    if (t >= meta.counts[0]) return;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int G = heads / kv_heads, D = head_dim;
    const int pos = meta.position[t];
    const int slot = meta.seq_slot[meta.token_seq[t]];
    const int* table = tables + (size_t)slot * geo.max_pages;
    const int first = window > 0 ? max(0, pos + 1 - window) : 0;
    const int span = pos + 1 - first;

    for (int i = tid; i < G * D; i += ATTN_THREADS)
        qs[i / D][i % D] = q[(size_t)t * heads * D + (g * G + i / D) * D + i % D];
    if (tid < G) {
        m_run[tid] = -INFINITY;
        l_run[tid] = 0.f;
    }
    // Head dims per lane in the value pass (D <= 32: one per lane, lanes >= D idle).
    const int epl = D >= 32 ? D / 32 : 1;
    const bool lane_active = lane * epl < D;
    float acc[ATTN_MAX_GROUP][ATTN_MAX_EPL];
#pragma unroll
    for (int a = 0; a < ATTN_MAX_GROUP; ++a)
#pragma unroll
        for (int e = 0; e < ATTN_MAX_EPL; ++e) acc[a][e] = 0.f;
    __syncthreads();

    for (int s = z; s * ATTN_TILE < span; s += Z) {
        const int base = first + s * ATTN_TILE;
        const int n = min(ATTN_TILE, span - s * ATTN_TILE);
        // Scores: one position per thread, all heads of the group.
        if (tid < n) {
            const int j = base + tid;
            const int page = table[j / geo.page_tokens];
            const KV* krow = kv + kv_offset(geo, page, 0, j) + g * D;
            vbase[tid] = kv_offset(geo, page, 1, j) + g * D;
            float dot[ATTN_MAX_GROUP];
#pragma unroll
            for (int a = 0; a < ATTN_MAX_GROUP; ++a) dot[a] = 0.f;
            // The row's loads go out in batches of 8 (16 bytes each) before the arithmetic.
            for (int c0 = 0; c0 < D / 8; c0 += 8) {
                uint4 raw[8];
#pragma unroll
                for (int u = 0; u < 8; ++u)
                    raw[u] = c0 + u < D / 8 ? *reinterpret_cast<const uint4*>(krow + (c0 + u) * 8)
                                            : make_uint4(0, 0, 0, 0);
#pragma unroll
                for (int u = 0; u < 8; ++u) {
                    if (c0 + u >= D / 8) break;
                    float k8[8];
                    widen8(raw[u], krow, k8);
#pragma unroll
                    for (int a = 0; a < ATTN_MAX_GROUP; ++a) {
                        if (a >= G) break;
#pragma unroll
                        for (int e = 0; e < 8; ++e)
                            dot[a] = fmaf(qs[a][(c0 + u) * 8 + e], k8[e], dot[a]);
                    }
                }
            }
#pragma unroll
            for (int a = 0; a < ATTN_MAX_GROUP; ++a)
                if (a < G) sc[a][tid] = dot[a] * scale;
        }
        __syncthreads();
        // Online softmax per head: one warp per head.
        for (int a = warp; a < G; a += ATTN_THREADS / 32) {
            float mx = -INFINITY;
            for (int i = lane; i < n; i += 32) mx = fmaxf(mx, sc[a][i]);
            mx = warp_max(mx);
            const float m_new = fmaxf(m_run[a], mx);
            float sum = 0.f;
            for (int i = lane; i < n; i += 32) {
                const float p = expf(sc[a][i] - m_new);
                sc[a][i] = p;
                sum += p;
            }
            sum = warp_sum(sum);
            if (lane == 0) {
                const float c = m_run[a] == -INFINITY ? 0.f : expf(m_run[a] - m_new);
                corr[a] = c;
                l_run[a] = l_run[a] * c + sum;
                m_run[a] = m_new;
            }
        }
        __syncthreads();
#pragma unroll
        for (int a = 0; a < ATTN_MAX_GROUP; ++a) {
            if (a >= G) break;
            const float c = corr[a];
#pragma unroll
            for (int e = 0; e < ATTN_MAX_EPL; ++e) acc[a][e] *= c;
        }
        // Values: one warp per position (ATTN_VLOADS positions in flight per warp), lanes over the head
        // dimension; every warp keeps its own accumulators, merged once at the end.
        for (int i0 = warp; i0 < n; i0 += ATTN_VLOADS * ATTN_WARPS) {
            float v[ATTN_VLOADS][ATTN_MAX_EPL];
#pragma unroll
            for (int u = 0; u < ATTN_VLOADS; ++u) {
                const int i = i0 + u * ATTN_WARPS;
                if (i < n && lane_active) load_lane(kv + vbase[i] + lane * epl, epl, v[u]);
                else
#pragma unroll
                    for (int e = 0; e < ATTN_MAX_EPL; ++e) v[u][e] = 0.f;
            }
#pragma unroll
            for (int u = 0; u < ATTN_VLOADS; ++u) {
                const int i = i0 + u * ATTN_WARPS;
                if (i >= n) break;
#pragma unroll
                for (int a = 0; a < ATTN_MAX_GROUP; ++a) {
                    if (a >= G) break;
                    const float p = sc[a][i];
#pragma unroll
                    for (int e = 0; e < ATTN_MAX_EPL; ++e) acc[a][e] = fmaf(p, v[u][e], acc[a][e]);
                }
            }
        }
        __syncthreads();
    }

    // Merge the warps' accumulators in warp order (a fixed order), then write the partial.
    for (int w = 0; w < ATTN_WARPS; ++w) {
        if (warp == w && lane_active) {
            for (int a = 0; a < G; ++a)
                for (int e = 0; e < epl; ++e) {
                    float* r = &red[a * D + lane * epl + e];
                    *r = (w == 0 ? 0.f : *r) + acc[a][e];
                }
        }
        __syncthreads();
    }
    for (int a = 0; a < G; ++a) {
        const size_t p = ((size_t)t * heads + g * G + a) * Z + z;
        for (int d = tid; d < D; d += ATTN_THREADS) part_o[p * D + d] = red[a * D + d];
        if (tid == 0) {
            part_ml[p * 2] = m_run[a];
            part_ml[p * 2 + 1] = l_run[a];
        }
    }
}

#define ATTN_ENTRY(DT, KV)                                                                      \
    extern "C" __global__ void __launch_bounds__(ATTN_THREADS) attn_split_##DT(                 \
        StepMeta meta, const float* q, const KV* kv, const int* tables, KvGeometry geo,         \
        int heads, int kv_heads, int head_dim, int window, float scale, float* part_o,          \
        float* part_ml) {                                                                       \
        attn_split_body(meta, q, kv, tables, geo, heads, kv_heads, head_dim, window, scale,     \
                        part_o, part_ml);                                                       \
    }

ATTN_ENTRY(bf16, __nv_bfloat16)
ATTN_ENTRY(f16, __half)

// out[t, h*D + d] = sum_z e^(m_z - M) o_z[d] / sum_z e^(m_z - M) l_z, z in order.
extern "C" __global__ void attn_combine(StepMeta meta, const float* __restrict__ part_o,
                                        const float* __restrict__ part_ml, int heads,
                                        int head_dim, int splits, float* __restrict__ out) {
    const int t = blockIdx.x, h = blockIdx.y;
    if (t >= meta.counts[0]) return;
    const size_t p0 = ((size_t)t * heads + h) * ATTN_SPLITS;
    float m[ATTN_SPLITS], l[ATTN_SPLITS];
#pragma unroll
    for (int z = 0; z < ATTN_SPLITS; ++z) {
        m[z] = part_ml[(p0 + z) * 2];
        l[z] = part_ml[(p0 + z) * 2 + 1];
    }
    float M = -INFINITY;
#pragma unroll
    for (int z = 0; z < ATTN_SPLITS; ++z) M = fmaxf(M, m[z]);
    float L = 0.f, wz[ATTN_SPLITS];
#pragma unroll
    for (int z = 0; z < ATTN_SPLITS; ++z) {
        wz[z] = m[z] == -INFINITY ? 0.f : expf(m[z] - M);
        L += l[z] * wz[z];
    }
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
        float o = 0.f;
#pragma unroll
        for (int z = 0; z < ATTN_SPLITS; ++z)
            if (wz[z] != 0.f) o += part_o[(p0 + z) * head_dim + d] * wz[z];
        out[(size_t)t * heads * head_dim + h * head_dim + d] = o / L;
    }
}

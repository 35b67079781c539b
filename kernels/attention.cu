// Causal grouped-query attention over the paged KV pool, split over the context.
//
// Split-KV with a fixed split size: the visible span of a query token is cut into tiles of
// ATTN_TILE positions; block (t, kv head, z) takes tiles z, z + Z, z + 2Z, ... in order and keeps
// an online softmax over them for every query head of its group; the Z partials of a head are
// then merged in order z = 0..Z-1. The reduction order of an output depends only on the token's
// position (never on the batch, the step's other tokens or which kernel runs it), so results are
// batch-invariant, and Z blocks per kv head fill the SMs at batch 1.
//
// Two entry points share that arithmetic:
//   attn_split + attn_combine – steps with prefill tokens: rope_append has already written the
//     step's keys and values (a prefill token attends to the step's earlier tokens);
//   attn_decode – steps of one token per sequence: each block rotates its group's queries
//     itself, the block whose tiles cover the new position writes the new key and value to the
//     pool (and reads them back), and the last block of a (token, kv head) to finish merges the
//     partials. One kernel instead of three, and no round trips between them.
#include "common.cuh"
#include "kv.cuh"
#include "rope.cuh"

#define ATTN_THREADS 256
#define ATTN_WARPS (ATTN_THREADS / 32)
#define ATTN_TILE 32
// Threads per position in the score pass (each takes every eighth 16-byte chunk of the key).
#define ATTN_PER_POS (ATTN_THREADS / ATTN_TILE)
#define ATTN_MAX_GROUP 8
#define ATTN_MAX_DIM 256
// Value rows each warp has in flight: the whole tile in one pass.
#define ATTN_VLOADS (ATTN_TILE / ATTN_WARPS)
// Partials per head (must equal the host's ATTN_SPLITS).
#define ATTN_SPLITS 16

// Shared memory of one block, for head dimensions up to MAXD.
template <int MAXD>
struct AttnShared {
    float qs[ATTN_MAX_GROUP][MAXD];
    float sc[ATTN_MAX_GROUP][ATTN_TILE];
    float m_run[ATTN_MAX_GROUP], l_run[ATTN_MAX_GROUP], corr[ATTN_MAX_GROUP];
    // The warps' value accumulators, merged in two levels (warps w and w + 4 into row w, then
    // rows 0..3 in order).
    float red[4][ATTN_MAX_GROUP * MAXD];
    // Per head of the merge: the splits' weights and the normalizer.
    float wz[ATTN_MAX_GROUP][ATTN_SPLITS];
    float norm[ATTN_MAX_GROUP];
    // attn_decode: the new position's key and value as stored in the pool (16-bit raw), so the
    // block that owns the position reads the same bits without a round trip through memory.
    alignas(16) unsigned short fresh[2][MAXD];
};

// `EPL` consecutive elements of a KV row with one load (EPL = 1, 2, 4 or 8).
template <int EPL, typename KV>
__device__ __forceinline__ void load_lane(const KV* p, float v[EPL]) {
    if (EPL == 8) {
        widen8(*reinterpret_cast<const uint4*>(p), p, v);
    } else if (EPL == 4) {
        const uint2 raw = *reinterpret_cast<const uint2*>(p);
        float w[8];
        widen8(make_uint4(raw.x, raw.y, 0, 0), p, w);
#pragma unroll
        for (int e = 0; e < EPL; ++e) v[e] = w[e];
    } else {
#pragma unroll
        for (int e = 0; e < EPL; ++e) v[e] = widen(p[e]);
    }
}

// One tile's keys and values in registers: thread (p, q) holds key chunks q, q + 8, ... of
// position p; warp w holds the value rows of positions w, w + 8, ... (lane's EPL elements).
template <typename KV, int DIM>
struct AttnTile {
    static constexpr int MAXD = DIM ? DIM : ATTN_MAX_DIM;
    // Head dims per lane in the value pass (D <= 32: one per lane, lanes >= D idle).
    static constexpr int MAX_EPL = MAXD >= 32 ? MAXD / 32 : 1;
    // 16-byte key chunks per thread in the score pass.
    static constexpr int MAX_KCH = MAXD / 8 / ATTN_PER_POS > 0 ? MAXD / 8 / ATTN_PER_POS : 1;
    uint4 raw[MAX_KCH];
    float v[ATTN_VLOADS][MAX_EPL];

    // Every load of positions [base, base + n) goes out before any arithmetic: the key chunks of
    // this thread's position (eight adjacent threads per position) and the value rows of this
    // warp's positions (warp + 8 u), both addressed through the block table.
    __device__ __forceinline__ void load(const KV* kv, const int* __restrict__ table,
                                         const KvGeometry& geo, int g, int D, int epl, int base,
                                         int n) {
        const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
        const int p = tid / ATTN_PER_POS, q = tid % ATTN_PER_POS;
        const int kch = D / 8;
#pragma unroll
        for (int u = 0; u < MAX_KCH; ++u) raw[u] = make_uint4(0, 0, 0, 0);
        if (p < n) {
            const int j = base + p;
            const KV* krow = kv + kv_offset(geo, table[j / geo.page_tokens], 0, j) + g * D;
#pragma unroll
            for (int u = 0; u < MAX_KCH; ++u) {
                const int c = q + u * ATTN_PER_POS;
                if (c < kch) raw[u] = *reinterpret_cast<const uint4*>(krow + c * 8);
            }
        }
        const bool lane_active = lane * epl < D;
#pragma unroll
        for (int u = 0; u < ATTN_VLOADS; ++u) {
            const int i = warp + u * ATTN_WARPS;
            if (i < n && lane_active) {
                const int j = base + i;
                const KV* vrow = kv + kv_offset(geo, table[j / geo.page_tokens], 1, j) + g * D;
                load_values(vrow, epl, v[u]);
            } else {
#pragma unroll
                for (int e = 0; e < MAX_EPL; ++e) v[u][e] = 0.f;
            }
        }
    }

    // Position base + i's key and value taken from `fresh` (the bits the pool holds for it)
    // instead of what `load` read: attn_decode writes that position in the same kernel.
    __device__ __forceinline__ void patch(const unsigned short (&fresh)[2][MAXD], int D, int epl,
                                          int i) {
        const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
        const int p = tid / ATTN_PER_POS, q = tid % ATTN_PER_POS;
        if (p == i) {
#pragma unroll
            for (int u = 0; u < MAX_KCH; ++u) {
                const int c = q + u * ATTN_PER_POS;
                if (c < D / 8) raw[u] = *reinterpret_cast<const uint4*>(&fresh[0][c * 8]);
            }
        }
        if (i % ATTN_WARPS == warp && lane * epl < D)
            load_values(reinterpret_cast<const KV*>(&fresh[1][0]), epl, v[i / ATTN_WARPS]);
    }

    // This lane's elements of one value row.
    __device__ __forceinline__ void load_values(const KV* row, int epl, float out[MAX_EPL]) {
        const int lane = threadIdx.x & 31;
        if (DIM) {
            load_lane<MAX_EPL>(row + lane * MAX_EPL, out);
        } else {
            for (int e = 0; e < MAX_EPL; ++e) out[e] = e < epl ? widen(row[lane * epl + e]) : 0.f;
        }
    }
};

// One head's online-softmax step over a tile, by one warp (lane i: position i): the tile's n
// scores in `sc` become their weights e^(x - m), and the running max m, sum l and the factor
// `corr` that rescales the head's accumulators are updated. Every attention kernel takes this
// step, so their partials have the same bits.
__device__ __forceinline__ void softmax_step(float* sc, int n, float& m_run, float& l_run,
                                             float& corr) {
    const int lane = threadIdx.x & 31;
    const float x = lane < n ? sc[lane] : -INFINITY;
    const float mx = warp_max(x);
    const float m_new = fmaxf(m_run, mx);
    const float pr = lane < n ? expf(x - m_new) : 0.f;
    if (lane < n) sc[lane] = pr;
    const float sum = warp_sum(pr);
    if (lane == 0) {
        const float c = m_run == -INFINITY ? 0.f : expf(m_run - m_new);
        corr = c;
        l_run = l_run * c + sum;
        m_run = m_new;
    }
}

// Partial attention of token t's query heads g*G .. g*G+G-1 (in sh.qs) over split z of the span
// [first, first + span), written to part_o / part_ml. DIM is the head dimension when known at
// compile time (64, 128, 256), else 0 and `head_dim` (≤ 32 and a multiple of 8, or a multiple
// of 32 up to 256) is used. `kv` is not __restrict__: attn_decode writes the new position's key
// and value in the same kernel. With PRELOADED, `tile` already holds the split's first tile
// (attn_decode issues those loads before it rotates the queries). With KEEP the partial stays in
// shared memory (o in sh.red[0], m and l in sh.m_run / sh.l_run) for a cluster merge instead.
template <typename KV, int DIM, bool PRELOADED, bool KEEP = false>
__device__ __forceinline__ void attn_partial(AttnShared<DIM ? DIM : ATTN_MAX_DIM>& sh,
                                             AttnTile<KV, DIM>& tile, const KV* kv,
                                             const int* __restrict__ table, KvGeometry geo,
                                             int t, int g, int z, int Z, int heads, int G,
                                             int head_dim, int first, int span, float scale,
                                             float* __restrict__ part_o,
                                             float* __restrict__ part_ml) {
    constexpr int MAX_EPL = AttnTile<KV, DIM>::MAX_EPL;
    constexpr int MAX_KCH = AttnTile<KV, DIM>::MAX_KCH;
    const int D = DIM ? DIM : head_dim;
    const int epl = DIM ? MAX_EPL : (D >= 32 ? D / 32 : 1);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    if (tid < G) {
        sh.m_run[tid] = -INFINITY;
        sh.l_run[tid] = 0.f;
    }
    const bool lane_active = lane * epl < D;
    float acc[ATTN_MAX_GROUP][MAX_EPL];
#pragma unroll
    for (int a = 0; a < ATTN_MAX_GROUP; ++a)
#pragma unroll
        for (int e = 0; e < MAX_EPL; ++e) acc[a][e] = 0.f;
    const int p = tid / ATTN_PER_POS, q = tid % ATTN_PER_POS;
    const int kch = D / 8;
    __syncthreads();

    for (int s = z; s * ATTN_TILE < span; s += Z) {
        const int base = first + s * ATTN_TILE;
        const int n = min(ATTN_TILE, span - s * ATTN_TILE);
        if (!PRELOADED || s != z) tile.load(kv, table, geo, g, D, epl, base, n);
        const uint4* raw = tile.raw;
        const KV* krow = kv;  // only its type matters to widen8
        float(&v)[ATTN_VLOADS][MAX_EPL] = tile.v;
        // Scores: all heads of the group.
        float dot[ATTN_MAX_GROUP];
#pragma unroll
        for (int a = 0; a < ATTN_MAX_GROUP; ++a) dot[a] = 0.f;
        if (p < n) {
#pragma unroll
            for (int u = 0; u < MAX_KCH; ++u) {
                const int c = q + u * ATTN_PER_POS;
                if (c >= kch) break;
                float k8[8];
                widen8(raw[u], krow, k8);
#pragma unroll
                for (int a = 0; a < ATTN_MAX_GROUP; ++a) {
                    if (a >= G) break;
#pragma unroll
                    for (int e = 0; e < 8; ++e) dot[a] = fmaf(sh.qs[a][c * 8 + e], k8[e], dot[a]);
                }
            }
        }
        // A fixed tree over the position's eight threads.
#pragma unroll
        for (int a = 0; a < ATTN_MAX_GROUP; ++a) {
            dot[a] += __shfl_xor_sync(0xffffffffu, dot[a], 1);
            dot[a] += __shfl_xor_sync(0xffffffffu, dot[a], 2);
            dot[a] += __shfl_xor_sync(0xffffffffu, dot[a], 4);
        }
        if (p < n && q == 0) {
#pragma unroll
            for (int a = 0; a < ATTN_MAX_GROUP; ++a)
                if (a < G) sh.sc[a][p] = dot[a] * scale;
        }
        __syncthreads();
        // Online softmax per head: one warp per head, one lane per position.
        for (int a = warp; a < G; a += ATTN_WARPS)
            softmax_step(sh.sc[a], n, sh.m_run[a], sh.l_run[a], sh.corr[a]);
        __syncthreads();
        // Values: every warp keeps its own accumulators, merged once at the end.
#pragma unroll
        for (int a = 0; a < ATTN_MAX_GROUP; ++a) {
            if (a >= G) break;
            const float c = sh.corr[a];
#pragma unroll
            for (int e = 0; e < MAX_EPL; ++e) acc[a][e] *= c;
        }
#pragma unroll
        for (int u = 0; u < ATTN_VLOADS; ++u) {
            const int i = warp + u * ATTN_WARPS;
            if (i >= n) break;
#pragma unroll
            for (int a = 0; a < ATTN_MAX_GROUP; ++a) {
                if (a >= G) break;
                const float pr = sh.sc[a][i];
#pragma unroll
                for (int e = 0; e < MAX_EPL; ++e) acc[a][e] = fmaf(pr, v[u][e], acc[a][e]);
            }
        }
        __syncthreads();
    }

    // Merge the warps' accumulators in a fixed order — (w0 + w4) + (w1 + w5) + (w2 + w6) +
    // (w3 + w7) — then write the partial.
    static_assert(ATTN_WARPS == 8, "the merge pairs warps w and w + 4");
    for (int half = 0; half < 2; ++half) {
        if ((warp >> 2) == half && lane_active) {
            float* r = sh.red[warp & 3];
            for (int a = 0; a < G; ++a)
#pragma unroll
                for (int e = 0; e < MAX_EPL; ++e)
                    if (e < epl) {
                        const int i = a * D + lane * epl + e;
                        r[i] = half == 0 ? acc[a][e] : r[i] + acc[a][e];
                    }
        }
        __syncthreads();
    }
    for (int i = tid; i < G * D; i += ATTN_THREADS) {
        const float o = ((sh.red[0][i] + sh.red[1][i]) + sh.red[2][i]) + sh.red[3][i];
        if (KEEP) {
            sh.red[0][i] = o;  // element i is this thread's alone
        } else {
            const int a = i / D, d = i % D;
            const size_t pi = ((size_t)t * heads + g * G + a) * Z + z;
            part_o[pi * D + d] = o;
        }
    }
    if (!KEEP && tid < G) {
        const size_t pi = ((size_t)t * heads + g * G + tid) * Z + z;
        part_ml[pi * 2] = sh.m_run[tid];
        part_ml[pi * 2 + 1] = sh.l_run[tid];
    }
}

// The Z partials of a group of G heads as attn_split / attn_decode leave them in global memory:
// o of (token t, head h0 + a, split z) at part_o[((t * heads + h0 + a) * Z + z) * head_dim + d],
// m and l at part_ml[... * 2 + {0, 1}]. Read past L1 (__ldcg): in attn_decode other blocks wrote
// them during this kernel.
struct GlobalPartials {
    const float* part_o;
    const float* part_ml;
    size_t t;
    int heads, h0, head_dim;
    __device__ __forceinline__ size_t at(int z, int a) const {
        return ((t * heads + h0 + a) * ATTN_SPLITS + z);
    }
    __device__ __forceinline__ float o(int z, int a, int d) const {
        return __ldcg(part_o + at(z, a) * head_dim + d);
    }
    __device__ __forceinline__ float m(int z, int a) const {
        return __ldcg(part_ml + at(z, a) * 2);
    }
    __device__ __forceinline__ float l(int z, int a) const {
        return __ldcg(part_ml + at(z, a) * 2 + 1);
    }
};

// out[i] for i in [e0, e1) of the group (i = a * head_dim + d: head h0 + a, dimension d), with
// out[a][d] = sum_z e^(m_z - M) o_z[d] / sum_z e^(m_z - M) l_z over the splits z in order, by the
// whole block: the heads' weights first (one round trip), then every output element with all its
// split values loaded at once. Only splits z < nz are read: the others hold no tile (tile i goes
// to split i mod Z, so the empty splits are the last ones), and an empty split adds exactly
// nothing (weight 0, l 0) — merging nz or all Z gives the same bits.
template <int MAXD, typename Partials>
__device__ __forceinline__ void merge_splits(AttnShared<MAXD>& sh, const Partials& p, int G,
                                             int head_dim, int e0, int e1,
                                             float* __restrict__ out, int nz) {
    const int tid = threadIdx.x;
    // The partial values of this thread's first MERGE_PRE elements load together with the
    // weights' inputs: one round trip for both.
    constexpr int MERGE_PRE = 2;
    float pre[MERGE_PRE][ATTN_SPLITS];
#pragma unroll
    for (int r = 0; r < MERGE_PRE; ++r) {
        const int i = e0 + tid + r * blockDim.x;
        if (i < e1) {
#pragma unroll
            for (int z = 0; z < ATTN_SPLITS; ++z)
                pre[r][z] = z < nz ? p.o(z, i / head_dim, i % head_dim) : 0.f;
        }
    }
    if (tid < G) {
        float m[ATTN_SPLITS], l[ATTN_SPLITS];
#pragma unroll
        for (int z = 0; z < ATTN_SPLITS; ++z) {
            m[z] = z < nz ? p.m(z, tid) : -INFINITY;
            l[z] = z < nz ? p.l(z, tid) : 0.f;
        }
        float M = -INFINITY;
#pragma unroll
        for (int z = 0; z < ATTN_SPLITS; ++z) M = fmaxf(M, m[z]);
        float L = 0.f;
#pragma unroll
        for (int z = 0; z < ATTN_SPLITS; ++z) {
            const float w = m[z] == -INFINITY ? 0.f : expf(m[z] - M);
            sh.wz[tid][z] = w;
            L += l[z] * w;
        }
        sh.norm[tid] = L;
    }
    __syncthreads();
    // One output element from its Z split values, z in order; an empty split wrote zeros and
    // has weight zero, which the sum skips.
    auto merge = [&](const float (&oz)[ATTN_SPLITS], int i) {
        const int a = i / head_dim;
        float o = 0.f;
#pragma unroll
        for (int z = 0; z < ATTN_SPLITS; ++z)
            if (sh.wz[a][z] != 0.f) o += oz[z] * sh.wz[a][z];
        out[i] = o / sh.norm[a];
    };
#pragma unroll
    for (int r = 0; r < MERGE_PRE; ++r) {
        const int i = e0 + tid + r * blockDim.x;
        if (i < e1) merge(pre[r], i);
    }
    for (int i = e0 + tid + MERGE_PRE * blockDim.x; i < e1; i += blockDim.x) {
        float oz[ATTN_SPLITS];
#pragma unroll
        for (int z = 0; z < ATTN_SPLITS; ++z)
            oz[z] = z < nz ? p.o(z, i / head_dim, i % head_dim) : 0.f;
        merge(oz, i);
    }
}

// Every output element of heads h0 .. h0 + G - 1 of token t from the partials in global memory.
template <int MAXD>
__device__ __forceinline__ void combine_heads(AttnShared<MAXD>& sh, const float* part_o,
                                              const float* part_ml, size_t t, int heads, int h0,
                                              int G, int head_dim, float* __restrict__ out,
                                              int nz = ATTN_SPLITS) {
    const GlobalPartials p{part_o, part_ml, t, heads, h0, head_dim};
    merge_splits(sh, p, G, head_dim, 0, G * head_dim, out, nz);
}

// Thread-block clusters (sm_90+): the blocks of a cluster run at once on one GPC and read each
// other's shared memory.
__device__ __forceinline__ void cluster_sync() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile(
        "barrier.cluster.arrive.release.aligned;\n"
        "barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
#endif
}

// The address of `p` (in this block's shared memory) in the shared memory of cluster block `rank`.
__device__ __forceinline__ u32 cluster_map(const void* p, u32 rank) {
    u32 out = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    const u32 local = (u32)__cvta_generic_to_shared(p);
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(out) : "r"(local), "r"(rank));
#endif
    return out;
}

__device__ __forceinline__ float cluster_load(u32 addr) {
    float v = 0.f;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(addr) : "memory");
#endif
    return v;
}

// The partials of attn_decode_cluster: split z's stayed in the shared memory of cluster block z
// (attn_partial with KEEP): o in red[0], m and l in m_run / l_run.
template <int MAXD>
struct ClusterPartials {
    const AttnShared<MAXD>* sh;
    int head_dim;
    __device__ __forceinline__ float o(int z, int a, int d) const {
        return cluster_load(cluster_map(&sh->red[0][a * head_dim + d], z));
    }
    __device__ __forceinline__ float m(int z, int a) const {
        return cluster_load(cluster_map(&sh->m_run[a], z));
    }
    __device__ __forceinline__ float l(int z, int a) const {
        return cluster_load(cluster_map(&sh->l_run[a], z));
    }
};

// Where token t's attention looks: its block-table row and visible span.
struct TokenSpan {
    int pos, first, span;
    const int* table;
};

__device__ __forceinline__ TokenSpan token_span(StepMeta meta, const int* tables,
                                                KvGeometry geo, int t, int window) {
    TokenSpan s;
    s.pos = meta.position[t];
    s.table = tables + (size_t)meta.token_slot[t] * geo.max_pages;
    s.first = window > 0 ? max(0, s.pos + 1 - window) : 0;
    s.span = s.pos + 1 - s.first;
    return s;
}

template <typename KV, int DIM>
__device__ __forceinline__ void attn_split_body(
    StepMeta meta, const float* __restrict__ q, const KV* kv, const int* __restrict__ tables,
    KvGeometry geo, int heads, int kv_heads, int head_dim, int window, float scale,
    float* __restrict__ part_o, float* __restrict__ part_ml) {
    __shared__ AttnShared<DIM ? DIM : ATTN_MAX_DIM> sh;
    // rope_append wrote the step's keys and values just before: nothing is read before it ends.
    pdl_enter();
    const int t = blockIdx.x, g = blockIdx.y, z = blockIdx.z;
    if (t >= meta.counts[0]) return;
    const int G = heads / kv_heads, D = DIM ? DIM : head_dim;
    const TokenSpan s = token_span(meta, tables, geo, t, window);
    // No tile in this split: attn_combine reads only the splits that hold one.
    if (z * ATTN_TILE >= s.span) return;
    for (int i = threadIdx.x; i < G * D; i += ATTN_THREADS)
        sh.qs[i / D][i % D] = q[(size_t)t * heads * D + (g * G + i / D) * D + i % D];
    AttnTile<KV, DIM> tile;
    attn_partial<KV, DIM, false>(sh, tile, kv, s.table, geo, t, g, z, gridDim.z, heads, G, D,
                                 s.first, s.span, scale, part_o, part_ml);
}

// attn_split for many query tokens of one sequence (prompt chunks): block (token group, kv head
// g, split z) takes up to `qt` consecutive tokens, and when they share a block table and a first
// visible position (one sequence, no sliding window) each KV tile of split z is staged in shared
// memory once (cp.async, double-buffered) for all of them instead of once per token. Its rows are
// the (token, query head) pairs, up to ATTN_ROWS; every row goes through attn_partial's exact
// operations: the same tiles in the same order (a row skips the tiles past its token's span,
// which attn_partial never visits), the same per-position dot products and shuffle tree, the same
// online softmax by one warp and the same per-warp value sums merged (w0 + w4) + ... + (w3 + w7).
// So every partial has attn_split's bits, and attn_combine merges them as before. Tokens that do
// not share a table or a first position run one after another, each alone.
#define ATTN_ROWS 16
#define ATTN_QT_MAX 16

template <typename KV, int DIM>
struct PrefillShared {
    static constexpr int CH = DIM / 8;  // 16-byte chunks per key or value row
    float qs[ATTN_ROWS][DIM];
    float sc[ATTN_ROWS][ATTN_TILE];
    float m_run[ATTN_ROWS], l_run[ATTN_ROWS], corr[ATTN_ROWS];
    int span[ATTN_QT_MAX], first[ATTN_QT_MAX];
    const int* table[ATTN_QT_MAX];
    union {
        // Two stages of a tile: keys then values, [position][chunk].
        uint4 kv[2][2][ATTN_TILE][CH];
        // The warps' value accumulators at the end (as AttnShared::red).
        float red[4][ATTN_ROWS * DIM];
    } u;
};

// Stage the keys and values of positions [base, base + n) of kv head g (rows of `table`) into
// stage `st`; positions past n are left as they are (no row reads them).
template <typename KV, int DIM>
__device__ __forceinline__ void prefill_stage(PrefillShared<KV, DIM>& sh, int st, const KV* kv,
                                              const int* table, const KvGeometry& geo, int g,
                                              int base, int n) {
    constexpr int CH = PrefillShared<KV, DIM>::CH;
    for (int i = threadIdx.x; i < 2 * ATTN_TILE * CH; i += ATTN_THREADS) {
        const int kind = i / (ATTN_TILE * CH), p = (i / CH) % ATTN_TILE, c = i % CH;
        if (p >= n) continue;
        const int j = base + p;
        const KV* src = kv + kv_offset(geo, table[j / geo.page_tokens], kind, j) + g * DIM + c * 8;
        cp_async16((u32)__cvta_generic_to_shared(&sh.u.kv[st][kind][p][c]), src, true);
    }
}

// GQ: query heads per kv head, compiled in (row r is token r / GQ, head r % GQ); a block takes
// ATTN_ROWS / GQ tokens.
template <typename KV, int DIM, int GQ>
__device__ __forceinline__ void attn_prefill_body(
    StepMeta meta, const float* __restrict__ q, const KV* kv, const int* __restrict__ tables,
    KvGeometry geo, int heads, int window, float scale, float* __restrict__ part_o,
    float* __restrict__ part_ml) {
    static_assert(DIM == 64 || DIM == 128, "attn_prefill serves head dims 64 and 128");
    static_assert(GQ >= 1 && ATTN_ROWS % GQ == 0, "whole tokens per block");
    constexpr int G = GQ, qt = ATTN_ROWS / GQ;
    typedef PrefillShared<KV, DIM> S;
    constexpr int EPL = DIM / 32;              // value elements per lane
    constexpr int KCH = DIM / 8 / ATTN_PER_POS;  // key chunks per thread in the score pass
    __shared__ S sh;
    pdl_enter();
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = blockIdx.y, z = blockIdx.z, Z = gridDim.z;
    const int t0 = blockIdx.x * qt, nt = min(qt, meta.counts[0] - t0);
    if (nt <= 0) return;
    if (tid < nt) {
        const TokenSpan s = token_span(meta, tables, geo, t0 + tid, window);
        sh.span[tid] = s.span;
        sh.first[tid] = s.first;
        sh.table[tid] = s.table;
    }
    __syncthreads();
    bool shared = true;
    for (int j = 1; j < nt; ++j)
        shared = shared && sh.table[j] == sh.table[0] && sh.first[j] == sh.first[0];
    const int passes = shared ? 1 : nt;
    const int p = tid / ATTN_PER_POS, qq = tid % ATTN_PER_POS;
    const KV* ktype = kv;  // only its type matters to widen8

    for (int pass = 0; pass < passes; ++pass) {
        // Tokens j0 .. j0 + tn - 1 of the group; rows r = (j - j0) * G + a.
        const int j0 = shared ? 0 : pass, tn = shared ? nt : 1, R = tn * G;
        int span_max = 0;
        for (int j = 0; j < tn; ++j) span_max = max(span_max, sh.span[j0 + j]);
        // No tile of this split for any of the pass's tokens: attn_combine reads only the
        // splits that hold one.
        if (z * ATTN_TILE >= span_max) continue;
        const int* table = sh.table[j0];
        const int first = sh.first[j0];
        for (int i = tid; i < R * DIM; i += ATTN_THREADS) {
            const int r = i / DIM, d = i % DIM, j = r / G, a = r % G;
            sh.qs[r][d] = q[(size_t)(t0 + j0 + j) * heads * DIM + (g * G + a) * DIM + d];
        }
        if (tid < R) {
            sh.m_run[tid] = -INFINITY;
            sh.l_run[tid] = 0.f;
        }
        float acc[ATTN_ROWS][EPL];
#pragma unroll
        for (int r = 0; r < ATTN_ROWS; ++r)
#pragma unroll
            for (int e = 0; e < EPL; ++e) acc[r][e] = 0.f;
        // Tile z + k Z is the k-th of this split; stage 0 takes the first.
        if (z * ATTN_TILE < span_max)
            prefill_stage<KV, DIM>(sh, 0, kv, table, geo, g, first + z * ATTN_TILE,
                                   min(ATTN_TILE, span_max - z * ATTN_TILE));
        cp_async_commit();
        int k = 0;
        for (int s = z; s * ATTN_TILE < span_max; s += Z, ++k) {
            const int next = s + Z;
            if (next * ATTN_TILE < span_max)
                prefill_stage<KV, DIM>(sh, (k + 1) & 1, kv, table, geo, g,
                                       first + next * ATTN_TILE,
                                       min(ATTN_TILE, span_max - next * ATTN_TILE));
            cp_async_commit();
            cp_async_wait<1>();
            __syncthreads();
            const int st = k & 1;
            // Valid positions of this tile for row r's token (≤ 0: the token's span ends before).
            auto rows_n = [&](int r) {
                return min(ATTN_TILE, sh.span[j0 + r / G] - s * ATTN_TILE);
            };
            // Scores: position p, its chunks qq, qq + 8, ...; every row of the group.
            float dot[ATTN_ROWS];
#pragma unroll
            for (int r = 0; r < ATTN_ROWS; ++r) dot[r] = 0.f;
#pragma unroll
            for (int u = 0; u < KCH; ++u) {
                const int c = qq + u * ATTN_PER_POS;
                float k8[8];
                widen8(sh.u.kv[st][0][p][c], ktype, k8);
#pragma unroll
                for (int r = 0; r < ATTN_ROWS; ++r) {
                    if (r >= R) break;
                    if (p < rows_n(r)) {
#pragma unroll
                        for (int e = 0; e < 8; ++e) dot[r] = fmaf(sh.qs[r][c * 8 + e], k8[e], dot[r]);
                    }
                }
            }
#pragma unroll
            for (int r = 0; r < ATTN_ROWS; ++r) {
                dot[r] += __shfl_xor_sync(0xffffffffu, dot[r], 1);
                dot[r] += __shfl_xor_sync(0xffffffffu, dot[r], 2);
                dot[r] += __shfl_xor_sync(0xffffffffu, dot[r], 4);
            }
            if (qq == 0) {
#pragma unroll
                for (int r = 0; r < ATTN_ROWS; ++r)
                    if (r < R && p < rows_n(r)) sh.sc[r][p] = dot[r] * scale;
            }
            __syncthreads();
            // Online softmax per row: one warp per row, one lane per position.
            for (int r = warp; r < R; r += ATTN_WARPS) {
                const int n = rows_n(r);
                if (n > 0) softmax_step(sh.sc[r], n, sh.m_run[r], sh.l_run[r], sh.corr[r]);
            }
            __syncthreads();
            // Values: warp w takes positions w, w + 8, ... of the tile, lane its EPL elements.
            float v[ATTN_VLOADS][EPL];
#pragma unroll
            for (int uu = 0; uu < ATTN_VLOADS; ++uu) {
                const int i = warp + uu * ATTN_WARPS;
                load_lane<EPL>(reinterpret_cast<const KV*>(&sh.u.kv[st][1][i][0]) + lane * EPL,
                               v[uu]);
            }
#pragma unroll
            for (int r = 0; r < ATTN_ROWS; ++r) {
                if (r >= R) break;
                const int n = rows_n(r);
                if (n <= 0) continue;
                const float c = sh.corr[r];
#pragma unroll
                for (int e = 0; e < EPL; ++e) acc[r][e] *= c;
#pragma unroll
                for (int uu = 0; uu < ATTN_VLOADS; ++uu) {
                    const int i = warp + uu * ATTN_WARPS;
                    if (i >= n) break;
                    const float pr = sh.sc[r][i];
#pragma unroll
                    for (int e = 0; e < EPL; ++e) acc[r][e] = fmaf(pr, v[uu][e], acc[r][e]);
                }
            }
            // Every read of this stage and of sc is done before either is written again.
            __syncthreads();
        }
        cp_async_wait<0>();
        __syncthreads();

        // Merge the warps' accumulators as attn_partial does, then write the partials.
        for (int half = 0; half < 2; ++half) {
            if ((warp >> 2) == half) {
                float* red = sh.u.red[warp & 3];
#pragma unroll
                for (int r = 0; r < ATTN_ROWS; ++r) {
                    if (r >= R) break;
#pragma unroll
                    for (int e = 0; e < EPL; ++e) {
                        const int i = r * DIM + lane * EPL + e;
                        red[i] = half == 0 ? acc[r][e] : red[i] + acc[r][e];
                    }
                }
            }
            __syncthreads();
        }
        for (int i = tid; i < R * DIM; i += ATTN_THREADS) {
            const float o = ((sh.u.red[0][i] + sh.u.red[1][i]) + sh.u.red[2][i]) + sh.u.red[3][i];
            const int r = i / DIM, d = i % DIM, j = r / G, a = r % G;
            const size_t pi = ((size_t)(t0 + j0 + j) * heads + g * G + a) * Z + z;
            part_o[pi * DIM + d] = o;
        }
        if (tid < R) {
            const int j = tid / G, a = tid % G;
            const size_t pi = ((size_t)(t0 + j0 + j) * heads + g * G + a) * Z + z;
            part_ml[pi * 2] = sh.m_run[tid];
            part_ml[pi * 2 + 1] = sh.l_run[tid];
        }
        // The next pass rewrites qs, m_run, l_run and the stages.
        __syncthreads();
    }
}

// The new position's key (QK-norm, rotated) and value of kv head g, computed from the q|k|v row
// into `fresh` (as the pool stores them) and then written to the pool, by the warps past the
// query heads (or warps 0 and 1 when the group fills all eight). The caller's next barrier orders
// the pool writes before any read of them in the block.
template <typename KV, int MAXD>
__device__ __forceinline__ void write_new_kv(AttnShared<MAXD>& sh, KV* kv, const float* row,
                                             const TokenSpan& s, KvGeometry geo, int g, int G,
                                             int D, int q_dim, int kv_dim,
                                             const float* __restrict__ k_norm, float eps,
                                             const float* cs, const float* sn) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int page = s.table[s.pos / geo.page_tokens];
    const int kw = G < ATTN_WARPS ? G : 0, vw = G + 1 < ATTN_WARPS ? G + 1 : 1;
    const int kind = warp == kw ? 0 : warp == vw ? 1 : -1;
    if (kind < 0) return;
    KV* fresh = reinterpret_cast<KV*>(sh.fresh[kind]);
    if (kind == 0)
        rope_head<KV>(row + q_dim + g * D, k_norm, eps, cs, sn, D, lane, nullptr, fresh);
    else
        copy_head<KV>(row + q_dim + kv_dim + g * D, D, lane, fresh);
    __syncwarp();
    KV* dst = kv + kv_offset(geo, page, kind, s.pos) + g * D;
    for (int i = lane * 8; i < D; i += 32 * 8)
        *reinterpret_cast<uint4*>(dst + i) = *reinterpret_cast<const uint4*>(fresh + i);
}

// What attn_decode and attn_decode_cluster share: block (t, g, z) reads the step's metadata,
// its block table and its split's first KV tile (before pdl_enter: all written by earlier work,
// so these loads overlap the q|k|v projection's drain), rotates its group's queries exactly as
// rope_append does, writes the new position's key and value when its split owns that position
// (the only block that reads it), and computes split z's partial — to part_o / part_ml, or kept
// in shared memory (KEEP). False for a padding token: the block has nothing to do.
template <typename KV, int DIM, bool KEEP>
__device__ __forceinline__ bool decode_split_partial(
    AttnShared<DIM ? DIM : ATTN_MAX_DIM>& sh, StepMeta meta, const float* __restrict__ qkv,
    KV* kv, const int* __restrict__ tables, KvGeometry geo, int heads, int kv_heads,
    int head_dim, int window, float scale, const float* __restrict__ q_norm,
    const float* __restrict__ k_norm, float eps, const float* __restrict__ cos_t,
    const float* __restrict__ sin_t, float* part_o, float* part_ml, const L2Prefetch& pf) {
    const int t = blockIdx.x, g = blockIdx.y, z = blockIdx.z, Z = gridDim.z;
    // The step's metadata is read before the padding check so the loads go out together
    // (padding entries hold valid indices).
    const int tokens = meta.counts[0];
    const TokenSpan s = token_span(meta, tables, geo, t, window);
    if (t >= tokens) return false;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int G = heads / kv_heads, D = DIM ? DIM : head_dim;
    const int q_dim = heads * D, kv_dim = kv_heads * D;
    const float* row = qkv + (size_t)t * (q_dim + 2 * kv_dim);
    const float* cs = cos_t + (size_t)s.pos * (D / 2);
    const float* sn = sin_t + (size_t)s.pos * (D / 2);
    AttnTile<KV, DIM> tile;
    const int epl = DIM ? AttnTile<KV, DIM>::MAX_EPL : (D >= 32 ? D / 32 : 1);
    const int first_n = min(ATTN_TILE, s.span - z * ATTN_TILE);
    if (first_n > 0) tile.load(kv, s.table, geo, g, D, epl, s.first + z * ATTN_TILE, first_n);
    pdl_enter();
    // Token 0's blocks ask L2 for the next projections' weights (once the q|k|v projection has
    // stopped reading: asked earlier, they only compete with its drain).
    if (t == 0)
        l2_prefetch(pf, threadIdx.x * gridDim.y * Z + g * Z + z, gridDim.y * Z * ATTN_THREADS);
    for (int a = warp; a < G; a += ATTN_WARPS)
        rope_head<KV>(row + (g * G + a) * D, q_norm, eps, cs, sn, D, lane, sh.qs[a], nullptr);
    const int new_tile = (s.pos - s.first) / ATTN_TILE;
    if (new_tile % Z == z) {
        write_new_kv<KV>(sh, kv, row, s, geo, g, G, D, q_dim, kv_dim, k_norm, eps, cs, sn);
        // The preloaded tile read the position before it was written: take it from `fresh`.
        // (A later tile is loaded after attn_partial's first barrier, which orders the pool
        // writes above before its reads.)
        __syncthreads();
        if (new_tile == z) tile.patch(sh.fresh, D, epl, s.pos - s.first - z * ATTN_TILE);
    }
    attn_partial<KV, DIM, true, KEEP>(sh, tile, kv, s.table, geo, t, g, z, Z, heads, G, D,
                                      s.first, s.span, scale, part_o, part_ml);
    return true;
}

template <typename KV, int DIM>
__device__ __forceinline__ void attn_decode_body(
    StepMeta meta, const float* __restrict__ qkv, KV* kv, const int* __restrict__ tables,
    KvGeometry geo, int heads, int kv_heads, int head_dim, int window, float scale,
    const float* __restrict__ q_norm, const float* __restrict__ k_norm, float eps,
    const float* __restrict__ cos_t, const float* __restrict__ sin_t, float* part_o,
    float* part_ml, int* __restrict__ done, float* __restrict__ out, const L2Prefetch& pf) {
    __shared__ AttnShared<DIM ? DIM : ATTN_MAX_DIM> sh;
    __shared__ int last;
    if (!decode_split_partial<KV, DIM, false>(sh, meta, qkv, kv, tables, geo, heads, kv_heads,
                                              head_dim, window, scale, q_norm, k_norm, eps,
                                              cos_t, sin_t, part_o, part_ml, pf))
        return;
    const int t = blockIdx.x, g = blockIdx.y, Z = gridDim.z;
    const int G = heads / kv_heads, D = DIM ? DIM : head_dim;
    // The last of the Z blocks of (t, g) to finish merges the partials. The barrier gathers the
    // block's partial writes; thread 0's fence (cumulative over them) publishes them before it
    // counts the block done, and the last block's fence after the count orders its reads.
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        last = atomicAdd(&done[t * kv_heads + g], 1) == Z - 1;
        if (last) __threadfence();
    }
    __syncthreads();
    if (!last) return;
    combine_heads(sh, part_o, part_ml, t, heads, g * G, G, D,
                  out + (size_t)t * heads * D + g * G * D);
    // Ready for the next step (and the next layer) that uses this counter.
    if (threadIdx.x == 0) done[t * kv_heads + g] = 0;
}

// attn_decode for large batches: one block per (token, kv head) computes the partials of the
// splits that hold a tile, z = 0, 1, ... in turn, and merges them itself. Each split's partial is
// attn_decode's (the same tiles in the same order, the same arithmetic), and so is the merge, so
// the two kernels give the same bits; this one needs no counter, fence or second block, and
// its blocks stream many tiles each (split z + 1's first tile loads while split z is computed)
// where attn_decode would launch Z blocks of a tile or two per token.
template <typename KV, int DIM>
__device__ __forceinline__ void attn_decode_serial_body(
    StepMeta meta, const float* __restrict__ qkv, KV* kv, const int* __restrict__ tables,
    KvGeometry geo, int heads, int kv_heads, int head_dim, int window, float scale,
    const float* __restrict__ q_norm, const float* __restrict__ k_norm, float eps,
    const float* __restrict__ cos_t, const float* __restrict__ sin_t, float* part_o,
    float* part_ml, float* __restrict__ out, const L2Prefetch& pf) {
    __shared__ AttnShared<DIM ? DIM : ATTN_MAX_DIM> sh;
    const int t = blockIdx.x, g = blockIdx.y;
    const int tokens = meta.counts[0];
    const TokenSpan s = token_span(meta, tables, geo, t, window);
    if (t >= tokens) return;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int G = heads / kv_heads, D = DIM ? DIM : head_dim;
    const int q_dim = heads * D, kv_dim = kv_heads * D;
    const float* row = qkv + (size_t)t * (q_dim + 2 * kv_dim);
    const float* cs = cos_t + (size_t)s.pos * (D / 2);
    const float* sn = sin_t + (size_t)s.pos * (D / 2);
    AttnTile<KV, DIM> tile, next;
    const int epl = DIM ? AttnTile<KV, DIM>::MAX_EPL : (D >= 32 ? D / 32 : 1);
    tile.load(kv, s.table, geo, g, D, epl, s.first, min(ATTN_TILE, s.span));
    // As in attn_decode: metadata, block table and older KV only, until the projection is done.
    pdl_enter();
    if (t == 0) l2_prefetch(pf, threadIdx.x * gridDim.y + g, gridDim.y * ATTN_THREADS);
    for (int a = warp; a < G; a += ATTN_WARPS)
        rope_head<KV>(row + (g * G + a) * D, q_norm, eps, cs, sn, D, lane, sh.qs[a], nullptr);
    write_new_kv<KV>(sh, kv, row, s, geo, g, G, D, q_dim, kv_dim, k_norm, eps, cs, sn);
    __syncthreads();
    // Split 0's first tile was read before the new position was written; every later load
    // comes after the barrier above and reads it from the pool.
    const int new_tile = (s.pos - s.first) / ATTN_TILE;
    if (new_tile == 0) tile.patch(sh.fresh, D, epl, s.pos - s.first);
    const int nz = min(ATTN_SPLITS, (s.span + ATTN_TILE - 1) / ATTN_TILE);
    for (int z = 0; z < nz; ++z) {
        if (z + 1 < nz) {
            const int base = (z + 1) * ATTN_TILE;
            next.load(kv, s.table, geo, g, D, epl, s.first + base, min(ATTN_TILE, s.span - base));
        }
        attn_partial<KV, DIM, true>(sh, tile, kv, s.table, geo, t, g, z, ATTN_SPLITS, heads, G,
                                    D, s.first, s.span, scale, part_o, part_ml);
        tile = next;
    }
    // The block's own partial writes, visible to all its threads after the barrier.
    __syncthreads();
    combine_heads(sh, part_o, part_ml, t, heads, g * G, G, D, out + (size_t)t * q_dim + g * G * D,
                  nz);
}

// attn_decode with the Z split blocks of a (token, kv head) launched as one thread-block cluster
// (sm_90+): each split's partial stays in its block's shared memory, and after a cluster barrier
// every block merges a slice of the group's outputs from the others' shared memory. The same
// partials and the same merge as attn_decode (same bits), without the partials' trip through
// global memory, the fences and the counter.
template <typename KV, int DIM>
__device__ __forceinline__ void attn_decode_cluster_body(
    StepMeta meta, const float* __restrict__ qkv, KV* kv, const int* __restrict__ tables,
    KvGeometry geo, int heads, int kv_heads, int head_dim, int window, float scale,
    const float* __restrict__ q_norm, const float* __restrict__ k_norm, float eps,
    const float* __restrict__ cos_t, const float* __restrict__ sin_t, float* __restrict__ out,
    const L2Prefetch& pf) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    __shared__ AttnShared<DIM ? DIM : ATTN_MAX_DIM> sh;
    // The cluster spans z: one (token, kv head), so a padding token leaves the whole cluster.
    if (!decode_split_partial<KV, DIM, true>(sh, meta, qkv, kv, tables, geo, heads, kv_heads,
                                             head_dim, window, scale, q_norm, k_norm, eps,
                                             cos_t, sin_t, nullptr, nullptr, pf))
        return;
    const int t = blockIdx.x, g = blockIdx.y, z = blockIdx.z, Z = gridDim.z;
    const int G = heads / kv_heads, D = DIM ? DIM : head_dim;
    // Every split's partial is complete and visible cluster-wide (release/acquire barrier).
    cluster_sync();
    const int E = G * D, per = (E + Z - 1) / Z;
    const ClusterPartials<DIM ? DIM : ATTN_MAX_DIM> p{&sh, D};
    merge_splits(sh, p, G, D, min(E, z * per), min(E, (z + 1) * per),
                 out + (size_t)t * heads * D + g * G * D, Z);
    // No block may leave while another still reads its shared memory.
    cluster_sync();
#else
    __trap();  // launched only on sm_90+ (the host checks)
#endif
}

// The split path's merge: one block per (token, kv head), the same arithmetic as attn_decode's,
// over the splits that hold a tile of the token's span (attn_split and attn_prefill write no
// others).
template <typename KV, int DIM>
__device__ __forceinline__ void attn_combine_body(StepMeta meta, const float* __restrict__ part_o,
                                                  const float* __restrict__ part_ml, int heads,
                                                  int kv_heads, int head_dim, int window,
                                                  float* __restrict__ out) {
    __shared__ AttnShared<DIM ? DIM : ATTN_MAX_DIM> sh;
    pdl_enter();
    const int t = blockIdx.x, g = blockIdx.y;
    if (t >= meta.counts[0]) return;
    const int G = heads / kv_heads, D = DIM ? DIM : head_dim;
    const int pos = meta.position[t];
    const int span = window > 0 ? min(pos + 1, window) : pos + 1;
    const int nz = min(ATTN_SPLITS, (span + ATTN_TILE - 1) / ATTN_TILE);
    combine_heads(sh, part_o, part_ml, t, heads, g * G, G, D,
                  out + (size_t)t * heads * D + g * G * D, nz);
}

#define ATTN_ENTRY(DT, KV, DIM, SUFFIX)                                                         \
    extern "C" __global__ void __launch_bounds__(ATTN_THREADS) attn_split_##DT##SUFFIX(         \
        StepMeta meta, const float* q, const KV* kv, const int* tables, KvGeometry geo,         \
        int heads, int kv_heads, int head_dim, int window, float scale, float* part_o,          \
        float* part_ml) {                                                                       \
        attn_split_body<KV, DIM>(meta, q, kv, tables, geo, heads, kv_heads, head_dim, window,   \
                                 scale, part_o, part_ml);                                       \
    }                                                                                           \
    extern "C" __global__ void __launch_bounds__(ATTN_THREADS) attn_combine_##DT##SUFFIX(       \
        StepMeta meta, const float* part_o, const float* part_ml, int heads, int kv_heads,      \
        int head_dim, int window, float* out) {                                                 \
        attn_combine_body<KV, DIM>(meta, part_o, part_ml, heads, kv_heads, head_dim, window,    \
                                   out);                                                        \
    }                                                                                           \
    extern "C" __global__ void __launch_bounds__(ATTN_THREADS) attn_decode_##DT##SUFFIX(        \
        StepMeta meta, const float* qkv, KV* kv, const int* tables, KvGeometry geo, int heads,  \
        int kv_heads, int head_dim, int window, float scale, const float* q_norm,               \
        const float* k_norm, float eps, const float* cos_t, const float* sin_t, float* part_o,  \
        float* part_ml, int* done, float* out, L2Prefetch pf) {                                 \
        attn_decode_body<KV, DIM>(meta, qkv, kv, tables, geo, heads, kv_heads, head_dim,        \
                                  window, scale, q_norm, k_norm, eps, cos_t, sin_t, part_o,     \
                                  part_ml, done, out, pf);                                      \
    }                                                                                           \
    extern "C" __global__ void __launch_bounds__(ATTN_THREADS) attn_decode_cluster_##DT##SUFFIX( \
        StepMeta meta, const float* qkv, KV* kv, const int* tables, KvGeometry geo, int heads,  \
        int kv_heads, int head_dim, int window, float scale, const float* q_norm,               \
        const float* k_norm, float eps, const float* cos_t, const float* sin_t, float* out,     \
        L2Prefetch pf) {                                                                        \
        attn_decode_cluster_body<KV, DIM>(meta, qkv, kv, tables, geo, heads, kv_heads,          \
                                          head_dim, window, scale, q_norm, k_norm, eps, cos_t,  \
                                          sin_t, out, pf);                                      \
    }                                                                                           \
    extern "C" __global__ void __launch_bounds__(ATTN_THREADS) attn_decode_serial_##DT##SUFFIX( \
        StepMeta meta, const float* qkv, KV* kv, const int* tables, KvGeometry geo, int heads,  \
        int kv_heads, int head_dim, int window, float scale, const float* q_norm,               \
        const float* k_norm, float eps, const float* cos_t, const float* sin_t, float* part_o,  \
        float* part_ml, float* out, L2Prefetch pf) {                                            \
        attn_decode_serial_body<KV, DIM>(meta, qkv, kv, tables, geo, heads, kv_heads, head_dim, \
                                         window, scale, q_norm, k_norm, eps, cos_t, sin_t,      \
                                         part_o, part_ml, out, pf);                             \
    }

// attn_prefill for the head dimensions and group sizes it serves (the host falls back to
// attn_split elsewhere). Two blocks per SM: the rows' accumulators stay in registers.
#define ATTN_PREFILL_ENTRY(DT, KV, DIM, GQ)                                                     \
    extern "C" __global__ void __launch_bounds__(ATTN_THREADS, 2)                               \
        attn_prefill_##DT##_d##DIM##_g##GQ(StepMeta meta, const float* q, const KV* kv,         \
                                          const int* tables, KvGeometry geo, int heads,         \
                                          int window, float scale, float* part_o,               \
                                          float* part_ml) {                                     \
        attn_prefill_body<KV, DIM, GQ>(meta, q, kv, tables, geo, heads, window, scale, part_o,  \
                                       part_ml);                                                \
    }
#define ATTN_PREFILL_GROUPS(DT, KV, DIM) \
    ATTN_PREFILL_ENTRY(DT, KV, DIM, 1)   \
    ATTN_PREFILL_ENTRY(DT, KV, DIM, 2)   \
    ATTN_PREFILL_ENTRY(DT, KV, DIM, 4)   \
    ATTN_PREFILL_ENTRY(DT, KV, DIM, 8)
ATTN_PREFILL_GROUPS(bf16, __nv_bfloat16, 64)
ATTN_PREFILL_GROUPS(bf16, __nv_bfloat16, 128)
ATTN_PREFILL_GROUPS(f16, __half, 64)
ATTN_PREFILL_GROUPS(f16, __half, 128)

// Head dimensions compiled as constants (every loop unrolled, registers sized exactly), and a
// general version for the others.
#define ATTN_DTYPE(DT, KV)             \
    ATTN_ENTRY(DT, KV, 64, _d64)       \
    ATTN_ENTRY(DT, KV, 128, _d128)     \
    ATTN_ENTRY(DT, KV, 256, _d256)     \
    ATTN_ENTRY(DT, KV, 0, )

ATTN_DTYPE(bf16, __nv_bfloat16)
ATTN_DTYPE(f16, __half)

// Causal grouped-query attention over the paged KV pool, split over the context, on the tensor
// cores (attn_mma.cuh holds the arithmetic).
//
// Split-KV with a fixed split size: the visible span of a query token is cut into tiles of
// ATTN_TILE positions; split z takes tiles z, z + Z, z + 2Z, ... in order and keeps an online
// softmax over them for every query head of its group; the Z partials of a head are then merged
// in order z = 0..Z-1. The reduction order of an output depends only on the token's position
// (never on the batch, the step's other tokens or which kernel runs it), so results are
// batch-invariant, and Z blocks per kv head fill the SMs at batch 1.
//
// Entry points, all with the same partials and the same merge:
//   attn_split + attn_combine – steps with prefill tokens: rope_append has already written the
//     step's keys and values (a prefill token attends to the step's earlier tokens);
//   attn_prefill – attn_split for prompt chunks: a block's tokens share each staged KV tile;
//   attn_decode – steps of one token per sequence: each block rotates its group's queries
//     itself, the block whose tiles cover the new position writes the new key and value to the
//     pool (and reads them back), and the last block of a (token, kv head) to finish merges the
//     partials. One kernel instead of three, and no round trips between them;
//   attn_decode_serial / attn_decode_cluster – attn_decode with one block computing every split,
//     or with the split blocks merging through each other's shared memory.
#include "common.cuh"
#include "kv.cuh"
#include "rope.cuh"
#include "attn_mma.cuh"
#include "mbarrier.cuh"
#include "wgmma.cuh"

#define ATTN_THREADS 256
#define ATTN_WARPS (ATTN_THREADS / 32)
// Threads per position when a tile is loaded (each takes every eighth 16-byte chunk).
#define ATTN_PER_POS (ATTN_THREADS / ATTN_TILE)
#define ATTN_MAX_GROUP 8
// The general kernels (head dims not compiled in): multiples of 16 up to this.
#define ATTN_GENERAL_DIM 128
#define ATTN_MAXD(DIM) ((DIM) ? (DIM) : ATTN_GENERAL_DIM)
// Partials per head (must equal the host's ATTN_SPLITS).
#define ATTN_SPLITS 16

// Shared memory of one block, for head dimensions up to MAXD. Query and tile rows are
// ATTN_ROW(D) elements apart for the runtime D (the arrays are sized for MAXD). AttnHeads is what
// every kernel uses (the queries, the merge, the new position); AttnShared adds the staged tile,
// which attn_decode_serial keeps in dynamic shared memory instead (17 KiB it would not use).
template <int MAXD>
struct AttnHeads {
    // The group's rotated queries in the KV type; rows G..15 (the warp's other mma rows) zero.
    alignas(16) unsigned short qh[16 * ATTN_ROW(MAXD)];
    // attn_decode_cluster: the split's (m, l) of each head.
    float ml[ATTN_MAX_GROUP][2];
    // Per head of the merge: each split's factors in the fold (SplitFold: wa scales the fold
    // so far, wb the split's values; wb < 0: the split adds nothing) and the normalizer.
    float wa[ATTN_MAX_GROUP][ATTN_SPLITS];
    float wb[ATTN_MAX_GROUP][ATTN_SPLITS];
    float norm[ATTN_MAX_GROUP];
    // attn_decode: the new position's key and value as stored in the pool (16-bit raw), so the
    // block that owns the position reads the same bits without a round trip through memory.
    alignas(16) unsigned short fresh[2][MAXD];
};

template <int MAXD>
struct AttnShared : AttnHeads<MAXD> {
    union {
        // The tile being computed: keys, then values.
        alignas(16) unsigned short kv[2][ATTN_TILE * ATTN_ROW(MAXD)];
        // attn_decode_cluster: the split's partial o of each head (i = a * D + d), kept for the
        // merge once the last tile is done.
        float red[ATTN_MAX_GROUP * MAXD];
    } u;
};

__device__ __forceinline__ u32 smem_addr(const unsigned short* p) {
    return (u32)__cvta_generic_to_shared(p);
}

// One tile's keys and values in registers between its loads and its store to shared memory:
// thread (p, q) holds 16-byte chunks q, q + 8, ... of position p's key and value rows, zeros past
// the tile's valid positions.
template <typename KV, int DIM>
struct AttnTile {
    static constexpr int MAXD = ATTN_MAXD(DIM);
    static constexpr int CH = (MAXD / 8 + ATTN_PER_POS - 1) / ATTN_PER_POS;
    uint4 k[CH], v[CH];

    // Every load of positions [base, base + n) goes out before any use, addressed through the
    // block table.
    __device__ __forceinline__ void load(const KV* kv, const int* __restrict__ table,
                                         const KvGeometry& geo, int g, int D, int base, int n) {
        const int p = threadIdx.x / ATTN_PER_POS, q = threadIdx.x % ATTN_PER_POS;
#pragma unroll
        for (int u = 0; u < CH; ++u) k[u] = v[u] = make_uint4(0, 0, 0, 0);
        if (p >= n) return;
        const int j = base + p;
        const int page = table[j / geo.page_tokens];
        const KV* krow = kv + kv_offset(geo, page, 0, j) + g * D;
        const KV* vrow = kv + kv_offset(geo, page, 1, j) + g * D;
#pragma unroll
        for (int u = 0; u < CH; ++u) {
            const int c = q + u * ATTN_PER_POS;
            if (c < D / 8) {
                k[u] = *reinterpret_cast<const uint4*>(krow + c * 8);
                v[u] = *reinterpret_cast<const uint4*>(vrow + c * 8);
            }
        }
    }

    // Position i of the tile taken from `fresh` (the bits the pool holds for it) instead of what
    // `load` read: attn_decode writes that position in the same kernel.
    __device__ __forceinline__ void patch(const unsigned short (&fresh)[2][MAXD], int D, int i) {
        const int p = threadIdx.x / ATTN_PER_POS, q = threadIdx.x % ATTN_PER_POS;
        if (p != i) return;
#pragma unroll
        for (int u = 0; u < CH; ++u) {
            const int c = q + u * ATTN_PER_POS;
            if (c < D / 8) {
                k[u] = *reinterpret_cast<const uint4*>(&fresh[0][c * 8]);
                v[u] = *reinterpret_cast<const uint4*>(&fresh[1][c * 8]);
            }
        }
    }

    __device__ __forceinline__ void store(AttnShared<MAXD>& sh, int D) const {
        const int p = threadIdx.x / ATTN_PER_POS, q = threadIdx.x % ATTN_PER_POS;
#pragma unroll
        for (int u = 0; u < CH; ++u) {
            const int c = q + u * ATTN_PER_POS;
            if (c < D / 8) {
                const int at = p * ATTN_ROW(D) + c * 8;
                *reinterpret_cast<uint4*>(&sh.u.kv[0][at]) = k[u];
                *reinterpret_cast<uint4*>(&sh.u.kv[1][at]) = v[u];
            }
        }
    }
};

// Rows G..15 of the block's query tile zeroed (the mma rows past the group).
template <int MAXD>
__device__ __forceinline__ void zero_pad_rows(AttnHeads<MAXD>& sh, int G, int D) {
    for (int i = threadIdx.x; i < (16 - G) * D; i += blockDim.x)
        sh.qh[(G + i / D) * ATTN_ROW(D) + i % D] = 0;
}

// The partials of token t's query heads g*G .. g*G+G-1 (rows 0..G-1 of sh.qh) for splits
// z0 .. z1-1 in turn, each over tiles z, z + Z, ... of the span [first, first + span), computed by
// warp 0 while the other threads load the next tile. Split z's partial goes to part_o / part_ml
// (entry (t, head, z) of Z per head), or with KEEP stays in shared memory (o in sh.u.red, m and l
// in sh.ml) for a cluster merge. `tile` holds split z0's first tile on entry. A split with no tile
// writes the empty partial (o 0, m -inf, l 0), which the merges weigh 0. `kv` is not
// __restrict__: attn_decode writes the new position's key and value in the same kernel.
template <typename KV, int DIM, bool KEEP = false>
__device__ __forceinline__ void attn_partials(AttnShared<ATTN_MAXD(DIM)>& sh,
                                              AttnTile<KV, DIM>& tile, const KV* kv,
                                              const int* __restrict__ table, KvGeometry geo,
                                              int t, int g, int z0, int z1, int Z, int heads,
                                              int G, int D, int first, int span, float scale,
                                              float* __restrict__ part_o,
                                              float* __restrict__ part_ml) {
    constexpr int MAXD = ATTN_MAXD(DIM);
    const int warp = threadIdx.x >> 5;
    AttnRows<KV, MAXD> rows;
    rows.init();
    auto write = [&](int z) {
        const size_t head0 = (size_t)t * heads + g * G;
        rows.store(
            D, [&](int r) { return r < G; },
            [&](int r) { return KEEP ? &sh.u.red[r * D] : part_o + ((head0 + r) * Z + z) * D; },
            [&](int r) { return KEEP ? sh.ml[r] : part_ml + ((head0 + r) * Z + z) * 2; });
    };
    if (z0 * ATTN_TILE >= span) {
        if (warp == 0) write(z0);
        return;
    }
    const u32 q = smem_addr(sh.qh), k = smem_addr(sh.u.kv[0]),
              v = smem_addr(sh.u.kv[1]);
    for (int z = z0, s = z0;;) {
        tile.store(sh, D);
        __syncthreads();
        // The next tile of this split, else the first of the next split.
        int nz = z, ns = s + Z;
        if (ns * ATTN_TILE >= span) nz = ns = z + 1;
        const bool more = nz < z1 && ns * ATTN_TILE < span;
        if (more)
            tile.load(kv, table, geo, g, D, first + ns * ATTN_TILE,
                      min(ATTN_TILE, span - ns * ATTN_TILE));
        if (warp == 0) {
            const int n = min(ATTN_TILE, span - s * ATTN_TILE);
            rows.tile(q, k, v, D, n, n, scale);
            if (nz != z) {
                write(z);
                rows.init();
            }
        }
        // Every read of the tile is done before the next store.
        __syncthreads();
        if (!more) break;
        z = nz;
        s = ns;
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

// attn_decode_serial's partials where the host gave its blocks room for them after the KV rings
// (`parts_smem`): o of (head a, split z) at o[(a * ATTN_SPLITS + z) * head_dim + d], m and l at
// ml[(a * ATTN_SPLITS + z) * 2 + {0, 1}]. The block wrote them itself, so its merge reads them
// without GlobalPartials' trips through L2 (one for the factors, one more for the values past a
// thread's first MERGE_PRE). The same values, so the same bits.
struct SharedPartials {
    const float* po;
    const float* pml;
    int head_dim;
    __device__ __forceinline__ float o(int z, int a, int d) const {
        return po[(a * ATTN_SPLITS + z) * head_dim + d];
    }
    __device__ __forceinline__ float m(int z, int a) const {
        return pml[(a * ATTN_SPLITS + z) * 2];
    }
    __device__ __forceinline__ float l(int z, int a) const {
        return pml[(a * ATTN_SPLITS + z) * 2 + 1];
    }
};

// Where a merge writes its outputs rounded to the KV type instead of f32: the o projection's
// input as to_half would prepare it (row: the token's row of the prepared inputs, null for none:
// then f32 to `out`; col0: the group's first column; wg: the wgmma GEMM's order, xhat_at), so
// that launch needs no to_half and reads nothing else (the host's `prepared_order`).
template <typename KV>
struct HalfRow {
    KV* row;
    int col0, wg;
    __device__ __forceinline__ void put(int i, float v) const {
        if (row) narrow(v, row + xhat_at(col0 + i, wg));
    }
    // Elements i and i + 1 (col0 + i even): adjacent in either order (xhat_at keeps pairs), so
    // one 4-byte store.
    __device__ __forceinline__ void put2(int i, float v0, float v1) const {
        *reinterpret_cast<u32*>(row + xhat_at(col0 + i, wg)) = pack2<KV>(v0, v1);
    }
};

// How every attention kernel merges a row's split partials (m_z, l_z, o_z; m in base 2, as
// attn_mma.cuh keeps it): a fold over the splits z in order,
//     M' = max(M, m_z), a = 2^(M - M'), b = 2^(m_z - M'), L = L a + l_z b, O = O a + o_z b,
// from (M, L, O) = (-inf, 0, 0), and out = O / L. A split with no position (m_z = -inf) leaves
// the fold as it is. In order, the fold lets attn_prefill take each split in as it finishes,
// without its partial's trip through memory, and every kernel that merges (attn_decode, the
// serial and cluster forms, attn_combine, attn_prefill's fold) does the same operations in the
// same order: the same bits.
struct SplitFold {
    float m, l;
    __device__ __forceinline__ void init() {
        m = -INFINITY;
        l = 0.f;
    }
    // Takes split (mz, lz) in; false (a, b untouched) for a split with no position. Else a and
    // b are the factors for the values (fold_value).
    __device__ __forceinline__ bool add(float mz, float lz, float& a, float& b) {
        if (mz == -INFINITY) return false;
        const float mn = fmaxf(m, mz);
        a = m == -INFINITY ? 0.f : m == mn ? 1.f : attn_exp2(__fsub_rn(m, mn));
        b = mz == mn ? 1.f : attn_exp2(__fsub_rn(mz, mn));
        l = __fmaf_rn(lz, b, __fmul_rn(l, a));
        m = mn;
        return true;
    }
};
__device__ __forceinline__ float fold_value(float o, float oz, float a, float b) {
    return __fmaf_rn(oz, b, __fmul_rn(o, a));
}

// out[i] for i in [e0, e1) of the group (i = a * head_dim + d: head h0 + a, dimension d): the
// splits' fold (SplitFold), by the whole block: the heads' factors first (one round trip), then
// every output element with all its split values loaded at once. Only splits z < nz are read:
// the others hold no tile (tile i goes to split i mod Z, so the empty splits are the last ones).
// `half`: out[i] rounded for the o projection instead, where it reads that (HalfRow).
template <int MAXD, typename Partials, typename KV>
__device__ __forceinline__ void merge_splits(AttnHeads<MAXD>& sh, const Partials& p, int G,
                                             int head_dim, int e0, int e1,
                                             float* __restrict__ out, int nz,
                                             const HalfRow<KV>& half) {
    const int tid = threadIdx.x;
    // The partial values of this thread's first MERGE_PRE elements load together with the
    // factors' inputs: one round trip for both.
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
        SplitFold f;
        f.init();
#pragma unroll
        for (int z = 0; z < ATTN_SPLITS; ++z) {
            float a = 1.f, b = -1.f;
            if (!f.add(m[z], l[z], a, b)) b = -1.f;
            sh.wa[tid][z] = a;
            sh.wb[tid][z] = b;
        }
        sh.norm[tid] = f.l;
    }
    __syncthreads();
    // One output element from its split values, z in order.
    auto merge = [&](const float (&oz)[ATTN_SPLITS], int i) {
        const int a = i / head_dim;
        float o = 0.f;
#pragma unroll
        for (int z = 0; z < ATTN_SPLITS; ++z)
            if (sh.wb[a][z] >= 0.f) o = fold_value(o, oz[z], sh.wa[a][z], sh.wb[a][z]);
        const float v = __fdiv_rn(o, sh.norm[a]);
        if (half.row)
            half.put(i, v);
        else
            out[i] = v;
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
template <int MAXD, typename KV>
__device__ __forceinline__ void combine_heads(AttnHeads<MAXD>& sh, const float* part_o,
                                              const float* part_ml, size_t t, int heads, int h0,
                                              int G, int head_dim, float* __restrict__ out,
                                              int nz, const HalfRow<KV>& half) {
    const GlobalPartials p{part_o, part_ml, t, heads, h0, head_dim};
    merge_splits(sh, p, G, head_dim, 0, G * head_dim, out, nz, half);
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
// (attn_partials with KEEP): o in u.red, m and l in ml.
template <int MAXD>
struct ClusterPartials {
    const AttnShared<MAXD>* sh;
    int head_dim;
    __device__ __forceinline__ float o(int z, int a, int d) const {
        return cluster_load(cluster_map(&sh->u.red[a * head_dim + d], z));
    }
    __device__ __forceinline__ float m(int z, int a) const {
        return cluster_load(cluster_map(&sh->ml[a][0], z));
    }
    __device__ __forceinline__ float l(int z, int a) const {
        return cluster_load(cluster_map(&sh->ml[a][1], z));
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
    __shared__ AttnShared<ATTN_MAXD(DIM)> sh;
    // rope_append wrote the step's keys and values just before: nothing is read before it ends.
    pdl_enter();
    const int t = blockIdx.x, g = blockIdx.y, z = blockIdx.z;
    if (t >= meta.counts[0]) return;
    const int G = heads / kv_heads, D = DIM ? DIM : head_dim;
    const TokenSpan s = token_span(meta, tables, geo, t, window);
    // No tile in this split: attn_combine reads only the splits that hold one.
    if (z * ATTN_TILE >= s.span) return;
    KV* qh = reinterpret_cast<KV*>(sh.qh);
    for (int i = threadIdx.x; i < 16 * D; i += ATTN_THREADS) {
        const int r = i / D, d = i % D;
        if (r < G)
            narrow(q[(size_t)t * heads * D + (g * G + r) * D + d], qh + r * ATTN_ROW(D) + d);
        else
            sh.qh[r * ATTN_ROW(D) + d] = 0;
    }
    AttnTile<KV, DIM> tile;
    tile.load(kv, s.table, geo, g, D, s.first + z * ATTN_TILE,
              min(ATTN_TILE, s.span - z * ATTN_TILE));
    attn_partials<KV, DIM>(sh, tile, kv, s.table, geo, t, g, z, z + 1, gridDim.z, heads, G, D,
                           s.first, s.span, scale, part_o, part_ml);
}

// attn_split for many query tokens (prompt chunks): block (token group, kv head g, zb) takes
// ATTN_PREFILL_ROWS (token, query head) rows, 16 per warp (row r: token r / GQ, head r % GQ), and
// computes their partials of splits zb, zb + ZB, ... (ZB = gridDim.z, the host's choice: every
// split's arithmetic is the same whichever block runs it), staging each KV tile in shared memory
// once (cp.async, double-buffered across splits) for all the rows whose token reads it.
// Consecutive tokens with the same block table and first visible position (one sequence, no
// sliding window) form a run: the run's tiles go to every warp with a row in it, and the warp's
// rows of other runs see no valid position in them (no change, see attn_mma.cuh). Every row thus
// goes through exactly the tiles, order and arithmetic of attn_split, so every partial has its
// bits, and attn_combine merges them as before. Token groups run last first: causal attention
// gives the later tokens the most tiles.
#define ATTN_PREFILL_ROWS (16 * ATTN_WARPS)
// KV tiles an attn_prefill block computes per barrier (PREFILL_TPI(FOLD)), and stages at once:
// those and the next as many, on their way.
#define PREFILL_TPI(FOLD) ((FOLD) ? 2 : 1)

// Positions [base, base + n) of one kv head (`rows`) staged at `dst` by `threads` threads
// (this one `tid`): keys, then values, ATTN_TILE rows of ATTN_ROW(D) elements each; positions
// past n zero-filled. LP = max(2, threads / ATTN_TILE) threads share a position, each looking its
// page up once and copying the position's chunks tid % LP, + LP, ... of key and value: a warp
// stages a tile in two passes of 16 positions, a block of 256 threads in one pass. (One thread
// per chunk column looked a page up and computed a 64-bit address for every 16-byte copy: ncu
// found most of attn_decode_serial's instructions there, and instruction issue its limit.)
// Adjacent threads read a position's adjacent chunks (whole 32-byte sectors), and the rows'
// 16-byte padding (or the swizzle) spreads a pass's writes over every bank. attn_prefill stages
// with the block (attn_decode_serial stages each half of a tile on its own: SerialStager). L: the
// tile's layout (TilePadded; TileSwizzled for the wgmma operands, dst 1 KiB aligned), the values
// L::bytes(D) after the keys.
template <typename KV, typename L = TilePadded>
__device__ __forceinline__ void stage_tile(u32 dst, const KV* kv, const KvRows& rows, int D,
                                           int base, int n, int tid, int threads) {
    const int lp = max(2, threads / ATTN_TILE), per = threads / lp, ch = D / 8;
    if (tid >= per * lp) return;
    const size_t to_v = (size_t)rows.page_tokens * rows.kv_dim;  // key row → value row
    const u32 dst_v = dst + L::bytes(D);
#pragma unroll
    for (int p = tid / lp; p < ATTN_TILE; p += per) {
        const bool ok = p < n;
        const KV* src = ok ? kv + rows.key_row(base + p) : kv;
#pragma unroll 4
        for (int c = tid % lp; c < ch; c += lp) {
            cp_async16(L::at(dst, p, c * 8, D), ok ? src + c * 8 : kv, ok);
            cp_async16(L::at(dst_v, p, c * 8, D), ok ? src + to_v + c * 8 : kv, ok);
        }
    }
}

// attn_prefill_wg's mma (sm_90a): the scores of N staged tiles (keys at st[t], TileSwizzled, head
// dim 128) for the warpgroup's 64 rows, each one chain of eight k16 steps from zero over the head
// dims in order, as raw_scores' mma.sync chains (n-tile j of sc[t] is accumulator j of the
// m64 × n32 step: the same fragment); q: the warpgroup's 64 query rows, TileSwizzled in blocks of
// 64 dims `q_block` bytes apart (the same values raw_scores' ldmatrix gives the warps).
template <typename KV, int N>
__device__ __forceinline__ void wg_scores(u32 q, u32 q_block, const u32 (&st)[2],
                                          float (&sc)[2][4][4]) {
#pragma unroll
    for (int t = 0; t < 2; ++t)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) sc[t][j][e] = 0.f;
    // A step's descriptors are the base's plus its offset in 16-byte units (the start address
    // field; shared addresses stay below 2^18 bytes, so no carry leaves it).
    const u64 qd = wgmma_desc_sw128(q);
    u64 kd[N];
#pragma unroll
    for (int t = 0; t < N; ++t) kd[t] = wgmma_desc_sw128(st[t]);
    wgmma_fence();
#pragma unroll
    for (int t = 0; t < N; ++t)
#pragma unroll
        for (int kk = 0; kk < 8; ++kk)
            wgmma_ss_n32(reinterpret_cast<float(&)[16]>(sc[t]),
                         qd + (((kk >> 2) * q_block + (kk & 3) * 32) >> 4),
                         kd[t] + (((kk >> 2) * (ATTN_TILE * 128) + (kk & 3) * 32) >> 4),
                         (const KV*)nullptr);
    wgmma_commit();
    wgmma_wait<0>();
#pragma unroll
    for (int t = 0; t < N; ++t) wgmma_hold(reinterpret_cast<float(&)[16]>(sc[t]));
}

// o += P · V for one staged tile (values at v, TileSwizzled: N-major, 64-dim blocks
// ATTN_TILE * 128 bytes apart, 8-position groups 1 KiB apart): for each half of the head dims an
// m64 × n64 step over positions 0-15, then 16-31, as AttnRows::values' chains (n-tile n of o is
// accumulators 4 (n % 8) .. + 3 of half n / 8's steps). Halves, not one n128 step: ptxas finds
// registers for 32 accumulators in flight beside the fold's where it did not for 64.
template <typename KV>
__device__ __forceinline__ void wg_values(float (&o)[16][4], const u32 (&pa)[2][4], u32 v) {
    float(&d)[2][32] = reinterpret_cast<float(&)[2][32]>(o);
    const u64 vd = wgmma_desc_sw128_nmajor(v, ATTN_TILE * 128, 1024);
    wgmma_fence();
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int kk = 0; kk < 2; ++kk)
            wgmma_n64_nmajor(d[h], pa[kk], vd + ((h * (ATTN_TILE * 128) + kk * 2048) >> 4),
                             (const KV*)nullptr);
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_hold(d[0]);
    wgmma_hold(d[1]);
}

// A tile count as a type (attn_prefill_body's generic lambdas take it).
template <int N>
struct Tiles {
    static constexpr int n = N;
};

// T where B, else F (NVRTC has no <type_traits>).
template <bool B, typename T, typename F>
struct Pick {
    using type = T;
};
template <typename T, typename F>
struct Pick<false, T, F> {
    using type = F;
};

//
// FOLD (attn_prefill_fold): one block takes every split of its rows, in order, and folds each
// split's partial into the rows' merge as the split finishes (SplitFold: the merge's own
// operations in its order), then writes the rows' outputs as attn_combine would (out, and
// rounded for the o projection where xh is given). No partial goes through memory (at 2,048
// tokens they were 537 MB per layer written and read back) and no attn_combine launch follows;
// the fold's accumulators take a second set of registers, so one block per SM.
//
// WG (attn_prefill_wg, FOLD on sm_90a, head dim 128): each warpgroup's four warps (64 rows) run
// their mma on wgmma instead of mma.sync: scores against a tile's keys as one m64 × n32 chain over
// the head dims (A: the rows' queries, held in registers for the whole block), and o += P · V as
// m64 × n128 steps over positions 0-15 then 16-31 (A: P in registers, B: the values N-major). The
// tiles are staged with the 128-byte swizzle (TileSwizzled) that the descriptors read; the same
// operand fragments, chains and accumulators as the warps' mma.sync, step for step (wgmma.cuh),
// and the softmax, fold and stores are the same code: the same bits. A warpgroup reads each staged
// tile once for its 64 rows where four warps read it once each. Measured no faster than the
// mma.sync fold (the products are not what binds it: BENCHMARKS.md, twenty-fifth session), so
// off by default (`KernelTuning::prefill_wgmma`).
template <typename KV, int DIM, int GQ, bool FOLD, bool WG = false>
__device__ __forceinline__ void attn_prefill_body(
    StepMeta meta, const float* __restrict__ q, const KV* kv, const int* __restrict__ tables,
    KvGeometry geo, int heads, int window, float scale, float* __restrict__ part_o,
    float* __restrict__ part_ml, float* __restrict__ out, KV* __restrict__ xh, int xh_wg) {
    static_assert(DIM == 64 || DIM == 128, "attn_prefill serves head dims 64 and 128");
    static_assert(GQ >= 1 && 16 % GQ == 0, "whole tokens per warp");
    static_assert(!WG || (FOLD && DIM == 128), "the wgmma fold serves head dim 128");
    using Layout = typename Pick<WG, TileSwizzled, TilePadded>::type;
    constexpr int QT = ATTN_PREFILL_ROWS / GQ, ROW = ATTN_ROW(DIM), Z = ATTN_SPLITS;
    constexpr int STAGE_BYTES = 2 * ATTN_TILE * (WG ? DIM : ROW) * 2;
    // Dynamic: the rows' queries in the KV type, then 2 PREFILL_TPI stages (the host's
    // attn_prefill_shared).
    extern __shared__ uint4 dyn[];
    __shared__ int span[QT], first[QT];
    __shared__ const int* table[QT];
    pdl_enter();
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    // The fold needs every split in order from one block.
    const int g = blockIdx.y, zb = FOLD ? 0 : blockIdx.z, ZB = FOLD ? 1 : gridDim.z;
    const int t0 = (gridDim.x - 1 - blockIdx.x) * QT, nt = min(QT, meta.counts[0] - t0);
    if (nt <= 0) return;
    if (tid < nt) {
        const TokenSpan s = token_span(meta, tables, geo, t0 + tid, window);
        span[tid] = s.span;
        first[tid] = s.first;
        table[tid] = s.table;
    }
    // WG: the queries and the stages from the first 1 KiB boundary (the swizzle's period; the
    // host's attn_prefill_shared leaves the room), the queries as the wgmma's A operand: rows of
    // 64 dims (128 bytes, TileSwizzled), the block's rows of dims 0-63, then of 64-127.
    const u32 dyn_base = (u32)__cvta_generic_to_shared(dyn);
    const u32 q_base = WG ? (dyn_base + 1023) & ~1023u : dyn_base;
    KV* qh = reinterpret_cast<KV*>(reinterpret_cast<char*>(dyn) + (q_base - dyn_base));
    constexpr u32 Q_BLOCK = ATTN_PREFILL_ROWS * 128;  // WG: bytes of one 64-dim block
    const u32 stage0 = q_base + ATTN_PREFILL_ROWS * (WG ? DIM : ROW) * 2;
    // The queries: four 16-byte loads in flight per thread, then rounded to the KV type.
    constexpr int Q4 = ATTN_PREFILL_ROWS * DIM / 4, QUNROLL = 4;
    static_assert(Q4 % (ATTN_THREADS * QUNROLL) == 0, "whole passes");
    for (int i0 = tid; i0 < Q4; i0 += ATTN_THREADS * QUNROLL) {
        float4 x[QUNROLL];
#pragma unroll
        for (int u = 0; u < QUNROLL; ++u) {
            const int i = i0 + u * ATTN_THREADS;
            const int r = i / (DIM / 4), d = (i % (DIM / 4)) * 4, j = r / GQ;
            x[u] = j < nt ? *reinterpret_cast<const float4*>(
                                q + ((size_t)(t0 + j) * heads + g * GQ + r % GQ) * DIM + d)
                          : make_float4(0.f, 0.f, 0.f, 0.f);
        }
#pragma unroll
        for (int u = 0; u < QUNROLL; ++u) {
            const int i = i0 + u * ATTN_THREADS;
            const int r = i / (DIM / 4), d = (i % (DIM / 4)) * 4;
            uint2 packed;
            packed.x = pack2<KV>(x[u].x, x[u].y);
            packed.y = pack2<KV>(x[u].z, x[u].w);
            // WG: chunk d / 8 of row r in its 64-dim block, swizzled; d % 8 is 0 or 4.
            const int at = WG ? (d >> 6) * (Q_BLOCK / 2) + r * 64 + ((((d >> 3) & 7) ^ (r & 7)) << 3) +
                                    (d & 7)
                              : r * ROW + d;
            *reinterpret_cast<uint2*>(qh + at) = packed;
        }
    }
    // WG: the queries are read by the tensor cores (the async proxy).
    if (WG) asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
    AttnRows<KV, DIM> rows;
    // FOLD: the fold of the lane's two rows (h = 0, 1) so far, values laid out as rows.o.
    constexpr int NT = AttnRows<KV, DIM>::NT;
    float fo[FOLD ? NT : 1][4];
    SplitFold fold[2];
    if constexpr (FOLD) {
#pragma unroll
        for (int n = 0; n < NT; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) fo[n][e] = 0.f;
        fold[0].init();
        fold[1].init();
    }
    // The warp's rows and the tokens of the lane's two rows.
    const int wr = warp * 16;
    const int ja = (wr + (lane >> 2)) / GQ, jb = (wr + (lane >> 2) + 8) / GQ;
    // The first row of the warp's warpgroup.
    const int wg0 = (warp >> 2) * 64;
    for (int r0 = 0; r0 < nt;) {
        int r1 = r0 + 1, smax = span[r0];
        while (r1 < nt && table[r1] == table[r0] && first[r1] == first[r0])
            smax = max(smax, span[r1++]);
        const bool mine = wr / GQ < r1 && (wr + 15) / GQ >= r0;
        const int* tab = table[r0];
        const int fst = first[r0];
        // The run's tiles in order: split z = zb, zb + ZB, ... (those with a tile), tiles z,
        // z + Z, ... of it. A tile is (split, tile index); split Z: past the last.
        struct Tile {
            int z, s;
        };
        auto next = [&](Tile t) {
            Tile n{t.z, t.s + Z};
            if (n.s * ATTN_TILE >= smax) n.z = n.s = t.z + ZB;
            if (n.z >= Z || n.s * ATTN_TILE >= smax) n.z = Z;
            return n;
        };
        const KvRows pages(geo, tab, g, DIM);
        auto stage = [&](Tile t, int slot) {
            if (t.z < Z)
                stage_tile<KV, Layout>(stage0 + slot * STAGE_BYTES, kv, pages, DIM,
                               fst + t.s * ATTN_TILE, min(ATTN_TILE, smax - t.s * ATTN_TILE),
                               tid, ATTN_THREADS);
        };
        // Tiles `ts` into the group of stages from `slot0` (PREFILL_TPI slots).
        auto stage_group = [&](const Tile* ts, int slot0) {
#pragma unroll
            for (int i = 0; i < PREFILL_TPI(FOLD); ++i) stage(ts[i], slot0 + i);
            cp_async_commit();
        };
        const u32 q_rows = q_base + wr * ROW * 2;
        // A split's tile done, `after` the one that follows it (z = Z: none): where it ends the
        // split, into the fold of each of the lane's rows it reached (FOLD; a row of another
        // run, or whose span ends before the split, has no position in it: m = -inf, left out
        // as the merge leaves it out), else the partials of the run's rows whose token has a
        // tile in it (attn_combine reads no others); the rows start the next split afresh.
        auto split_end = [&](Tile t, Tile after) {
            if (after.z == t.z) return;
            if constexpr (FOLD) {
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    float a, b;
                    if (!fold[h].add(rows.m[h], rows.l[h], a, b)) continue;
#pragma unroll
                    for (int n = 0; n < NT; ++n) {
                        fo[n][2 * h] = fold_value(fo[n][2 * h], rows.o[n][2 * h], a, b);
                        fo[n][2 * h + 1] = fold_value(fo[n][2 * h + 1], rows.o[n][2 * h + 1], a, b);
                    }
                }
            } else {
                const int z = t.z;
                auto entry = [&](int r) {
                    const int j = (wr + r) / GQ;
                    return ((size_t)(t0 + j) * heads + g * GQ + (wr + r) % GQ) * Z + z;
                };
                rows.store(
                    DIM,
                    [&](int r) {
                        const int j = (wr + r) / GQ;
                        return j >= r0 && j < r1 && z * ATTN_TILE < span[j];
                    },
                    [&](int r) { return part_o + entry(r) * DIM; },
                    [&](int r) { return part_ml + entry(r) * 2; });
            }
            rows.init();
        };
        // Tile t's valid positions for the lane's two rows.
        auto valid = [&](Tile t, int (&n)[2]) {
            const int js[2] = {ja, jb};
#pragma unroll
            for (int h = 0; h < 2; ++h)
                n[h] = js[h] >= r0 && js[h] < r1 ? span[js[h]] - t.s * ATTN_TILE : 0;
        };
        // Where the values of the tile staged in `slot` lie.
        // o += P · V for the tile staged in `slot` (WG: on wgmma).
        auto values = [&](int slot, const u32 (&pa)[2][4]) {
            const u32 v = stage0 + slot * STAGE_BYTES + Layout::bytes(DIM);
            if constexpr (WG)
                wg_values<KV>(rows.o, pa, v);
            else
                rows.values(v, DIM, pa);
        };
        // The raw scores of the N tiles staged in `st` (Tiles<N>), for the warp's rows (WG: the
        // warpgroup's), into sc[0 .. N-1].
        auto scores = [&](auto tiles, const u32 (&st)[2], float (&sc)[2][4][4]) {
            constexpr int N = decltype(tiles)::n;
            if constexpr (WG) {
                wg_scores<KV, N>(q_base + wg0 * 128, Q_BLOCK, st, sc);
            } else if constexpr (N == 1) {
                const u32 k1[1] = {st[0]};
                rows.template raw_scores<1>(q_rows, k1, DIM,
                                            reinterpret_cast<float(&)[1][4][4]>(sc[0]));
            } else {
                rows.template raw_scores<2>(q_rows, st, DIM, sc);
            }
        };
        // Tile t (staged in `slot`) from its raw scores: softmax, values, and the split's end.
        auto finish = [&](Tile t, float (&sc)[1][4][4], int slot, Tile after) {
            int n[1][2];
            valid(t, n[0]);
            u32 pa[1][2][4];
            float corr[1][2];
            bool rescale[1];
            rows.template update<1>(sc, n, scale, pa, corr, rescale);
            rows.rescale_o(corr[0], rescale[0]);
            values(slot, pa[0]);
            split_end(t, after);
        };
        // The run's tiles TPI at a time (a group), each group staged while the one before
        // computes. FOLD (one block per SM, registers to spare) takes two: their scores' mma
        // chains side by side, and where both are of one split, their softmax too (the same
        // operations in the same order as one after the other: the same bits).
        constexpr int TPI = PREFILL_TPI(FOLD);
        Tile cur[TPI];
        cur[0] = Tile{zb, zb};
        if (zb * ATTN_TILE >= smax) cur[0].z = Z;
#pragma unroll
        for (int i = 1; i < TPI; ++i) cur[i] = cur[i - 1].z < Z ? next(cur[i - 1]) : cur[i - 1];
        if (cur[0].z < Z) {
            rows.init();
            stage_group(cur, 0);
            for (int k = 0;; ++k) {
                const int base = (k & 1) * TPI;  // this group's first slot
                Tile nxt[TPI];
                nxt[0] = cur[TPI - 1].z < Z ? next(cur[TPI - 1]) : Tile{Z, 0};
#pragma unroll
                for (int i = 1; i < TPI; ++i)
                    nxt[i] = nxt[i - 1].z < Z ? next(nxt[i - 1]) : nxt[i - 1];
                if constexpr (WG) {
                    // This group landed and is shown to the tensor cores (the async proxy),
                    // then the next group is staged (into the stages the group before this one
                    // left at the last barrier): the proxy fence waits for every copy the thread
                    // has in flight, so the next group's go out after it, during this group's
                    // mma, not before.
                    cp_async_wait<0>();
                    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
                    __syncthreads();
                    stage_group(nxt, TPI - base);
                } else {
                    stage_group(nxt, TPI - base);
                    // This group landed (only the next group's copies may still be on their
                    // way).
                    cp_async_wait<1>();
                    __syncthreads();
                }
                // WG: every warpgroup computes every tile (no branch around the wgmma, which
                // ptxas would serialize on): a row outside the run sees no valid position in it,
                // and its state does not change.
                if (WG || mine) {
                    if constexpr (TPI == 2) {
                        const Tile a = cur[0], b = cur[1];
                        const u32 st[2] = {stage0 + base * STAGE_BYTES,
                                           stage0 + (base + 1) * STAGE_BYTES};
                        float sc[2][4][4];
                        auto one = [&](int i) -> float(&)[1][4][4] {
                            return reinterpret_cast<float(&)[1][4][4]>(sc[i]);
                        };
                        if (b.z >= Z) {
                            scores(Tiles<1>{}, st, sc);
                            finish(a, one(0), base, b);
                        } else if (a.z != b.z) {
                            // Two splits: the scores side by side, then one after the other.
                            scores(Tiles<2>{}, st, sc);
                            finish(a, one(0), base, b);
                            finish(b, one(1), base + 1, nxt[0]);
                        } else {
                            scores(Tiles<2>{}, st, sc);
                            int n[2][2];
                            valid(a, n[0]);
                            valid(b, n[1]);
                            u32 pa[2][2][4];
                            float corr[2][2];
                            bool rescale[2];
                            rows.template update<2>(sc, n, scale, pa, corr, rescale);
#pragma unroll
                            for (int i = 0; i < 2; ++i) {
                                rows.rescale_o(corr[i], rescale[i]);
                                values(base + i, pa[i]);
                            }
                            split_end(b, nxt[0]);
                        }
                    } else {
                        float sc[1][4][4];
                        const u32 k1[1] = {stage0 + base * STAGE_BYTES};
                        rows.template raw_scores<1>(q_rows, k1, DIM, sc);
                        finish(cur[0], sc, base, nxt[0]);
                    }
                }
                // Every read of this group's stages is done before the group after the next
                // is staged there.
                __syncthreads();
                if (nxt[0].z >= Z) break;
#pragma unroll
                for (int i = 0; i < TPI; ++i) cur[i] = nxt[i];
            }
            cp_async_wait<0>();
        }
        r0 = r1;
    }
    if constexpr (FOLD) {
        // The lane's rows' outputs, as attn_combine writes them.
        const int c2 = (lane & 3) * 2;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int r = wr + (lane >> 2) + 8 * h, j = r / GQ;
            if (j >= nt) continue;
            const size_t t = (size_t)(t0 + j);
            const int col0 = (g * GQ + r % GQ) * DIM;
            float* dst = out + t * heads * DIM + col0;
            const HalfRow<KV> half{xh ? xh + t * heads * DIM : nullptr, col0, xh_wg};
#pragma unroll
            for (int n = 0; n < NT; ++n) {
                const int d = n * 8 + c2;
                const float v0 = __fdiv_rn(fo[n][2 * h], fold[h].l);
                const float v1 = __fdiv_rn(fo[n][2 * h + 1], fold[h].l);
                if (half.row) {
                    half.put2(d, v0, v1);
                } else {
                    *reinterpret_cast<float2*>(dst + d) = make_float2(v0, v1);
                }
            }
        }
    }
}

// The new position's key (QK-norm, rotated) and value of kv head g, computed from the q|k|v row
// into `fresh` (as the pool stores them) and then written to the pool, by the warps past the
// query heads (or warps 0 and 1 when the group fills all eight). The caller's next barrier orders
// the pool writes before any read of them in the block.
template <typename KV, int MAXD>
__device__ __forceinline__ void write_new_kv(AttnHeads<MAXD>& sh, KV* kv, const float* row,
                                             const TokenSpan& s, KvGeometry geo, int g, int G,
                                             int D, int q_dim, int kv_dim,
                                             const float* __restrict__ k_norm, float eps,
                                             const float* cs, const float* sn) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int page = s.table[s.pos / geo.page_tokens];
    const int warps = blockDim.x >> 5;
    const int kw = G < warps ? G : 0, vw = G + 1 < warps ? G + 1 : 1;
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
    AttnShared<ATTN_MAXD(DIM)>& sh, StepMeta meta, const float* __restrict__ qkv,
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
    const int first_n = min(ATTN_TILE, s.span - z * ATTN_TILE);
    if (first_n > 0) tile.load(kv, s.table, geo, g, D, s.first + z * ATTN_TILE, first_n);
    pdl_enter();
    // Token 0's blocks ask L2 for the next projections' weights (once the q|k|v projection has
    // stopped reading: asked earlier, they only compete with its drain).
    if (t == 0)
        l2_prefetch(pf, threadIdx.x * gridDim.y * Z + g * Z + z, gridDim.y * Z * ATTN_THREADS);
    for (int a = warp; a < G; a += ATTN_WARPS)
        rope_head<KV>(row + (g * G + a) * D, q_norm, eps, cs, sn, D, lane, nullptr,
                      reinterpret_cast<KV*>(sh.qh) + a * ATTN_ROW(D));
    zero_pad_rows(sh, G, D);
    const int new_tile = (s.pos - s.first) / ATTN_TILE;
    if (new_tile % Z == z) {
        write_new_kv<KV>(sh, kv, row, s, geo, g, G, D, q_dim, kv_dim, k_norm, eps, cs, sn);
        // The preloaded tile read the position before it was written: take it from `fresh`.
        // (A later tile is loaded after attn_partials' first barrier, which orders the pool
        // writes above before its reads.)
        __syncthreads();
        if (new_tile == z) tile.patch(sh.fresh, D, s.pos - s.first - z * ATTN_TILE);
    }
    attn_partials<KV, DIM, KEEP>(sh, tile, kv, s.table, geo, t, g, z, z + 1, Z, heads, G, D,
                                 s.first, s.span, scale, part_o, part_ml);
    return true;
}

template <typename KV, int DIM>
__device__ __forceinline__ void attn_decode_body(
    StepMeta meta, const float* __restrict__ qkv, KV* kv, const int* __restrict__ tables,
    KvGeometry geo, int heads, int kv_heads, int head_dim, int window, float scale,
    const float* __restrict__ q_norm, const float* __restrict__ k_norm, float eps,
    const float* __restrict__ cos_t, const float* __restrict__ sin_t, float* part_o,
    float* part_ml, int* __restrict__ done, float* __restrict__ out, const L2Prefetch& pf,
    KV* __restrict__ xh, int xh_wg) {
    __shared__ AttnShared<ATTN_MAXD(DIM)> sh;
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
    const HalfRow<KV> half{xh ? xh + (size_t)t * heads * D : nullptr, g * G * D, xh_wg};
    combine_heads(sh, part_o, part_ml, t, heads, g * G, G, D,
                  out + (size_t)t * heads * D + g * G * D, ATTN_SPLITS, half);
    // Ready for the next step (and the next layer) that uses this counter.
    if (threadIdx.x == 0) done[t * kv_heads + g] = 0;
}

// attn_decode_serial's warps that compute: all of the block's up to head dim 128, half past it,
// each with one tile of its own in dynamic shared memory (keys, then values: the host's
// attn_serial_shared). Two block shapes: 8 warps, one block per SM (attn_decode_serial_*), and
// 4 warps, two blocks per SM (attn_decode_serial_pair_*), where one block's prologue (the
// queries' norm and rotation) and merge overlap the other's tiles, for launches of more blocks
// than SMs (fewer leave SMs idle, and each block would have half the warps).
#define ATTN_SERIAL_PAIR_THREADS 128
#define ATTN_SERIAL_WARPS(DIM, THREADS) (ATTN_MAXD(DIM) <= 128 ? (THREADS) / 32 : (THREADS) / 64)
// Tensor copies of KV pages (sm_90, where the host encoded the pool's map); this define turns
// them off to run the cp.async path on sm_90.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && !defined(ATTN_SERIAL_CP_ASYNC)
#define ATTN_SERIAL_TMA 1
#else
#define ATTN_SERIAL_TMA 0
#endif

// How attn_decode_serial's warps stage one half (keys: kind 0, values: kind 1) of a tile,
// positions [base, base + n) of kv head g, at `dst`.
//
// With tensor copies (`tma`: the pool's map, a span starting on a page, tiles of whole pages,
// head dims of whole 64-dim boxes), lane 0 copies each page's rows of the head as boxes of
// page_tokens rows × 64 dims with the 128-byte swizzle (TileSwizzled): D / 64 copies per page
// instead of a warp's 16-byte copies and their per-chunk address arithmetic (ncu: most of the
// kernel's instructions when each lane copied its own bytes). `bar` counts the bytes; rows past
// n hold whatever their page holds and are zeroed once the copies have landed.
// Else (TilePadded) two lanes share a position, copy 16 bytes at a time (zero-filling past n)
// and the copies form one commit group.
template <typename KV>
struct SerialStager {
    const TmaMap* map;
    const KV* kv;
    const int* table;
    KvGeometry geo;
    int g, D, first, span;
    bool tma;

    __device__ __forceinline__ int rows(int tl) const {
        return min(ATTN_TILE, span - tl * ATTN_TILE);
    }

    __device__ __forceinline__ void stage(u32 dst, u32 bar, int tl, int kind, int lane) const {
        const int base = first + tl * ATTN_TILE, n = rows(tl);
#if ATTN_SERIAL_TMA
        if (tma) {
            // This lane's earlier writes to the buffer (zeroed rows, the new position's row)
            // are ordered before the copies'.
            asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
            __syncwarp();
            if (lane == 0) {
                const int pt = geo.page_tokens, pages = (n + pt - 1) / pt, boxes = D / 64;
                mbar_arrive_expect_tx(bar, (u32)(pages * boxes * pt * 128));
                for (int i = 0; i < pages; ++i) {
                    const int page = table[(base + i * pt) / pt];
                    const int row = ((page * geo.layers + geo.layer) * 2 + kind) * pt;
                    for (int h = 0; h < boxes; ++h)
                        tma_load_2d(dst + h * (ATTN_TILE * 128) + i * pt * 128, map, bar,
                                    g * D + 64 * h, row);
                }
            }
            return;
        }
#endif
        (void)bar;
#pragma unroll
        for (int p = lane / 2; p < ATTN_TILE; p += 16) {
            const bool ok = p < n;
            const KV* src = kv;
            if (ok) {
                const int j = base + p;
                src = kv + kv_offset(geo, table[j / geo.page_tokens], kind, j) + g * D;
            }
            const u32 at = dst + p * ATTN_ROW(D) * 2;
#pragma unroll 4
            for (int c = lane % 2; c < D / 8; c += 2)
                cp_async16(at + c * 16, ok ? src + c * 8 : kv, ok);
        }
        cp_async_commit();
    }

    // Until the half staged at `dst` for its `use`-th time (tile tl) has landed, visible to the
    // whole warp. (cp.async: the warp's groups alternate keys and values, so the one before
    // the latest.)
    __device__ __forceinline__ void wait(u32 dst, u32 bar, int use, int tl, int lane) const {
#if ATTN_SERIAL_TMA
        if (tma) {
            mbar_wait(bar, (u32)(use & 1));
            if (lane >= rows(tl))
                for (int d = 0; d < D; d += 8)
                    asm volatile("st.shared.v4.u32 [%0], {%1,%1,%1,%1};\n" ::"r"(
                                     TileSwizzled::at(dst, lane, d, D)),
                                 "r"(0)
                                 : "memory");
            __syncwarp();
            return;
        }
#endif
        (void)dst;
        (void)bar;
        (void)use;
        (void)tl;
        (void)lane;
        cp_async_wait<1>();
        __syncwarp();
    }

    // A half that will not be staged again: the cp.async path keeps one group per half.
    __device__ __forceinline__ void skip() const {
        if (!tma) cp_async_commit();
    }
};

// attn_decode for large batches: one block per (token, kv head) computes the partials of the
// splits that hold a tile and merges them itself. Every warp computes: it takes split w first,
// then the next unclaimed split (a shared counter: splits come longest first, so the block's
// tiles spread evenly over its warps), and walks each split's tiles in order through one tile
// buffer. The keys and values of a tile are staged as two halves: the next tile's keys go out as
// soon as this tile's scores are done, its values once this tile's values are, so a warp always
// has one half in flight. Each split's partial is attn_decode's (the same tiles in the same
// order, the same arithmetic), and so is the merge, so the two kernels give the same bits; this
// one needs no counter, fence or second block where attn_decode would launch Z blocks of a tile
// or two per token. (The previous version gave half of the warps two stages each and left the
// other half idle: one computing warp per scheduler, issuing 0.2 instructions per cycle, most of
// them the staging's address arithmetic.)
template <typename KV, int DIM, int THREADS>
__device__ __forceinline__ void attn_decode_serial_body(
    StepMeta meta, const float* __restrict__ qkv, KV* kv, const int* __restrict__ tables,
    KvGeometry geo, int heads, int kv_heads, int head_dim, int window, float scale,
    const float* __restrict__ q_norm, const float* __restrict__ k_norm, float eps,
    const float* __restrict__ cos_t, const float* __restrict__ sin_t, float* part_o,
    float* part_ml, float* __restrict__ out, const L2Prefetch& pf, const TmaMap* kv_map,
    int kv_tma, KV* __restrict__ xh, int xh_wg, int parts_smem) {
    __shared__ AttnHeads<ATTN_MAXD(DIM)> sh;
    // Per warp: the keys' and the values' barrier (tensor copies).
    __shared__ __align__(8) unsigned long long bars[2 * (THREADS / 32)];
    __shared__ int claimed;
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
    constexpr int MAXD = ATTN_MAXD(DIM), W = ATTN_SERIAL_WARPS(DIM, THREADS);
    // Bytes of the keys (or values) of a tile, either layout, rounded to the swizzle's 1,024.
    constexpr int HALF = (ATTN_TILE * ATTN_ROW(MAXD) * 2 + 1023) / 1024 * 1024;
    // Dynamic: one tile per computing warp from the first 1,024-byte boundary (the swizzle's
    // period; the host's attn_serial_shared adds the slack).
    extern __shared__ uint4 dyn[];
    const u32 dyn0 = ((u32)__cvta_generic_to_shared(dyn) + 1023) & ~1023u;
    const u32 keys = dyn0 + warp * 2 * HALF, vals = keys + HALF;
    // The splits' partials: after the W warps' tiles where the host made room (`parts_smem`:
    // G × ATTN_SPLITS rows of o, then of (m, l)), else in global memory as attn_decode's.
    float* const sp_o =
        parts_smem ? reinterpret_cast<float*>(reinterpret_cast<unsigned char*>(dyn) +
                                              (dyn0 - (u32)__cvta_generic_to_shared(dyn)) +
                                              W * 2 * HALF)
                   : nullptr;
    float* const sp_ml = sp_o + G * ATTN_SPLITS * D;  // read only where sp_o is not null
    const u32 kbar = (u32)__cvta_generic_to_shared(&bars[2 * warp]), vbar = kbar + 8;
    const int nz = min(ATTN_SPLITS, (s.span + ATTN_TILE - 1) / ATTN_TILE);
    const bool computes = warp < W && warp < nz;
    const SerialStager<KV> st{
        kv_map, kv, s.table, geo, g, D, s.first, s.span,
        ATTN_SERIAL_TMA && kv_tma && D % 64 == 0 && D <= 128 && s.first % geo.page_tokens == 0};
#if ATTN_SERIAL_TMA
    if (st.tma && computes && lane == 0) {
        mbar_init(kbar, 1);
        mbar_init(vbar, 1);
        // The barriers' initialization is visible to the tensor copies' completions.
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
#endif
    if (threadIdx.x == 0) claimed = W;
    // The warp's first tile reads older KV only: it loads while the projection drains.
    if (computes) {
        st.stage(keys, kbar, warp, 0, lane);
        st.stage(vals, vbar, warp, 1, lane);
    }
    // As in attn_decode: metadata, block table and older KV only, until the projection is done.
    pdl_enter();
    if (t == 0) l2_prefetch(pf, threadIdx.x * gridDim.y + g, gridDim.y * THREADS);
    for (int a = warp; a < G; a += THREADS / 32)
        rope_head<KV>(row + (g * G + a) * D, q_norm, eps, cs, sn, D, lane, nullptr,
                      reinterpret_cast<KV*>(sh.qh) + a * ATTN_ROW(D));
    zero_pad_rows(sh, G, D);
    write_new_kv<KV>(sh, kv, row, s, geo, g, G, D, q_dim, kv_dim, k_norm, eps, cs, sn);
    __syncthreads();
    const int new_at = s.pos - s.first;  // the new position within the span
    // The warp's splits over the tiles in layout L.
    auto compute = [&](auto layout) {
        using L = decltype(layout);
        // A tile staged before the new position was written (or racing that write) takes the
        // position's row of `half` from `fresh`, the bits the pool holds for it.
        auto patch = [&](u32 half, int tl, int kind) {
            if (new_at / ATTN_TILE != tl) return;
            const int i = new_at - tl * ATTN_TILE;
            for (int c = lane; c < D / 8; c += 32) {
                const uint4 x = *reinterpret_cast<const uint4*>(&sh.fresh[kind][c * 8]);
                asm volatile("st.shared.v4.u32 [%0], {%1,%2,%3,%4};\n" ::"r"(
                                 L::at(half, i, c * 8, D)),
                             "r"(x.x), "r"(x.y), "r"(x.z), "r"(x.w)
                             : "memory");
            }
            __syncwarp();
        };
        AttnRows<KV, MAXD> rows;
        rows.init();
        const u32 q = smem_addr(sh.qh);
        for (int z = warp, tl = warp, k = 0; z < nz; ++k) {
            // The tile after this one: the split's next, else the first of the next unclaimed
            // split.
            int nzz = z, ntl = tl + ATTN_SPLITS;
            if (ntl * ATTN_TILE >= s.span) {
                int c = 0;
                if (lane == 0) c = atomicAdd(&claimed, 1);
                nzz = ntl = __shfl_sync(0xffffffffu, c, 0);
            }
            const bool more = nzz < nz;
            const int n = st.rows(tl);
            u32 pa[2][4];
            st.wait(keys, kbar, k, tl, lane);
            patch(keys, tl, 0);
            rows.template scores<L>(q, keys, D, n, n, scale, pa);
            // Every lane's reads of the keys are done before they are staged again.
            __syncwarp();
            if (more) st.stage(keys, kbar, ntl, 0, lane);
            else st.skip();
            st.wait(vals, vbar, k, tl, lane);
            patch(vals, tl, 1);
            rows.template values<L>(vals, D, pa);
            __syncwarp();
            if (more) st.stage(vals, vbar, ntl, 1, lane);
            else st.skip();
            if (nzz != z) {
                const size_t head0 = (size_t)t * heads + g * G;
                rows.store(
                    D, [&](int r) { return r < G; },
                    [&](int r) {
                        return sp_o ? sp_o + (r * ATTN_SPLITS + z) * D
                                    : part_o + ((head0 + r) * ATTN_SPLITS + z) * D;
                    },
                    [&](int r) {
                        return sp_o ? sp_ml + (r * ATTN_SPLITS + z) * 2
                                    : part_ml + ((head0 + r) * ATTN_SPLITS + z) * 2;
                    });
                rows.init();
            }
            z = nzz;
            tl = ntl;
        }
    };
    if (computes) {
#if ATTN_SERIAL_TMA
        if (st.tma) compute(TileSwizzled{});
        else
#endif
        {
            compute(TilePadded{});
            cp_async_wait<0>();
        }
    }
    // Every split's partial written (visible to the block after the barrier).
    __syncthreads();
    const HalfRow<KV> half{xh ? xh + (size_t)t * q_dim : nullptr, g * G * D, xh_wg};
    float* const o_out = out + (size_t)t * q_dim + g * G * D;
    if (sp_o)
        merge_splits(sh, SharedPartials{sp_o, sp_ml, D}, G, D, 0, G * D, o_out, nz, half);
    else
        combine_heads(sh, part_o, part_ml, t, heads, g * G, G, D, o_out, nz, half);
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
    const L2Prefetch& pf, KV* __restrict__ xh, int xh_wg) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    __shared__ AttnShared<ATTN_MAXD(DIM)> sh;
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
    const ClusterPartials<ATTN_MAXD(DIM)> p{&sh, D};
    const HalfRow<KV> half{xh ? xh + (size_t)t * heads * D : nullptr, g * G * D, xh_wg};
    merge_splits(sh, p, G, D, min(E, z * per), min(E, (z + 1) * per),
                 out + (size_t)t * heads * D + g * G * D, Z, half);
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
                                                  float* __restrict__ out, KV* __restrict__ xh,
                                                  int xh_wg) {
    __shared__ AttnShared<ATTN_MAXD(DIM)> sh;
    pdl_enter();
    const int t = blockIdx.x, g = blockIdx.y;
    if (t >= meta.counts[0]) return;
    const int G = heads / kv_heads, D = DIM ? DIM : head_dim;
    const int pos = meta.position[t];
    const int span = window > 0 ? min(pos + 1, window) : pos + 1;
    const int nz = min(ATTN_SPLITS, (span + ATTN_TILE - 1) / ATTN_TILE);
    const HalfRow<KV> half{xh ? xh + (size_t)t * heads * D : nullptr, g * G * D, xh_wg};
    combine_heads(sh, part_o, part_ml, t, heads, g * G, G, D,
                  out + (size_t)t * heads * D + g * G * D, nz, half);
}

// attn_decode_serial in one block shape: THREADS per block, BLOCKS per SM.
#define ATTN_SERIAL_ENTRY(DT, KV, DIM, SUFFIX, SHAPE, THREADS, BLOCKS)                          \
    extern "C" __global__ void __launch_bounds__(THREADS, BLOCKS)                               \
        attn_decode_serial##SHAPE##_##DT##SUFFIX(                                               \
            StepMeta meta, const float* qkv, KV* kv, const int* tables, KvGeometry geo,         \
            int heads, int kv_heads, int head_dim, int window, float scale,                     \
            const float* q_norm, const float* k_norm, float eps, const float* cos_t,            \
            const float* sin_t, float* part_o, float* part_ml, float* out, L2Prefetch pf,       \
            const __grid_constant__ TmaMap kv_map, int kv_tma, KV* xh, int xh_wg,               \
            int parts_smem) {                                                                   \
        attn_decode_serial_body<KV, DIM, THREADS>(meta, qkv, kv, tables, geo, heads, kv_heads,  \
                                                  head_dim, window, scale, q_norm, k_norm, eps, \
                                                  cos_t, sin_t, part_o, part_ml, out, pf,       \
                                                  &kv_map, kv_tma, xh, xh_wg, parts_smem);      \
    }

// attn_decode's launch bounds. ATTN_DECODE_MIN_BLOCKS (a kernel define, unset by default) caps
// its registers for that many blocks per SM: at 2 (128 registers, a 204-byte spill at head dim
// 128 on sm_90), one block of o's deep projection (n1d, 128 registers) fits beside each attention
// block and loads its first weights while attention runs; at its 190 registers it does not.
// Measured slower (BENCHMARKS.md, 2026-11-28 thirty-fourth session: qwen3-8b's batch-1 step
// +2.2% on an H200): kept only for register experiments.
#ifdef ATTN_DECODE_MIN_BLOCKS
#define ATTN_DECODE_BOUNDS __launch_bounds__(ATTN_THREADS, ATTN_DECODE_MIN_BLOCKS)
#else
#define ATTN_DECODE_BOUNDS __launch_bounds__(ATTN_THREADS)
#endif

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
        int head_dim, int window, float* out, KV* xh, int xh_wg) {                              \
        attn_combine_body<KV, DIM>(meta, part_o, part_ml, heads, kv_heads, head_dim, window,    \
                                   out, xh, xh_wg);                                             \
    }                                                                                           \
    extern "C" __global__ void ATTN_DECODE_BOUNDS attn_decode_##DT##SUFFIX(                    \
        StepMeta meta, const float* qkv, KV* kv, const int* tables, KvGeometry geo, int heads,  \
        int kv_heads, int head_dim, int window, float scale, const float* q_norm,               \
        const float* k_norm, float eps, const float* cos_t, const float* sin_t, float* part_o,  \
        float* part_ml, int* done, float* out, L2Prefetch pf, KV* xh, int xh_wg) {              \
        attn_decode_body<KV, DIM>(meta, qkv, kv, tables, geo, heads, kv_heads, head_dim,        \
                                  window, scale, q_norm, k_norm, eps, cos_t, sin_t, part_o,     \
                                  part_ml, done, out, pf, xh, xh_wg);                           \
    }                                                                                           \
    extern "C" __global__ void __launch_bounds__(ATTN_THREADS) attn_decode_cluster_##DT##SUFFIX( \
        StepMeta meta, const float* qkv, KV* kv, const int* tables, KvGeometry geo, int heads,  \
        int kv_heads, int head_dim, int window, float scale, const float* q_norm,               \
        const float* k_norm, float eps, const float* cos_t, const float* sin_t, float* out,     \
        L2Prefetch pf, KV* xh, int xh_wg) {                                                     \
        attn_decode_cluster_body<KV, DIM>(meta, qkv, kv, tables, geo, heads, kv_heads,          \
                                          head_dim, window, scale, q_norm, k_norm, eps, cos_t,  \
                                          sin_t, out, pf, xh, xh_wg);                           \
    }                                                                                           \
    ATTN_SERIAL_ENTRY(DT, KV, DIM, SUFFIX, , ATTN_THREADS, 1)                                     \
    ATTN_SERIAL_ENTRY(DT, KV, DIM, SUFFIX, _pair, ATTN_SERIAL_PAIR_THREADS, 2)

// attn_prefill for the head dimensions and group sizes it serves (the host falls back to
// attn_split elsewhere). Two blocks per SM: the rows' accumulators stay in registers.
// attn_prefill_fold: one block per SM (the fold's registers), no partials.
#define ATTN_PREFILL_ENTRY(DT, KV, DIM, GQ)                                                     \
    extern "C" __global__ void __launch_bounds__(ATTN_THREADS, 2)                               \
        attn_prefill_##DT##_d##DIM##_g##GQ(StepMeta meta, const float* q, const KV* kv,         \
                                          const int* tables, KvGeometry geo, int heads,         \
                                          int window, float scale, float* part_o,               \
                                          float* part_ml) {                                     \
        attn_prefill_body<KV, DIM, GQ, false>(meta, q, kv, tables, geo, heads, window, scale,   \
                                              part_o, part_ml, nullptr, nullptr, 0);            \
    }                                                                                           \
    extern "C" __global__ void __launch_bounds__(ATTN_THREADS, 1)                               \
        attn_prefill_fold_##DT##_d##DIM##_g##GQ(StepMeta meta, const float* q, const KV* kv,    \
                                               const int* tables, KvGeometry geo, int heads,    \
                                               int window, float scale, float* out, KV* xh,     \
                                               int xh_wg) {                                     \
        attn_prefill_body<KV, DIM, GQ, true>(meta, q, kv, tables, geo, heads, window, scale,    \
                                             nullptr, nullptr, out, xh, xh_wg);                 \
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

// attn_prefill_wg: attn_prefill_fold on wgmma, head dim 128, sm_90a only (elsewhere the entry is
// empty and the host never launches it).
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define ATTN_PREFILL_WG_BODY(KV, GQ)                                                          \
    attn_prefill_body<KV, 128, GQ, true, true>(meta, q, kv, tables, geo, heads, window, scale, \
                                               nullptr, nullptr, out, xh, xh_wg);
#else
#define ATTN_PREFILL_WG_BODY(KV, GQ)
#endif
#define ATTN_PREFILL_WG_ENTRY(DT, KV, GQ)                                                       \
    extern "C" __global__ void __launch_bounds__(ATTN_THREADS, 1)                               \
        attn_prefill_wg_##DT##_d128_g##GQ(StepMeta meta, const float* q, const KV* kv,          \
                                          const int* tables, KvGeometry geo, int heads,         \
                                          int window, float scale, float* out, KV* xh,          \
                                          int xh_wg) {                                          \
        ATTN_PREFILL_WG_BODY(KV, GQ)                                                            \
    }
#define ATTN_PREFILL_WG_GROUPS(DT, KV)    \
    ATTN_PREFILL_WG_ENTRY(DT, KV, 1)      \
    ATTN_PREFILL_WG_ENTRY(DT, KV, 2)      \
    ATTN_PREFILL_WG_ENTRY(DT, KV, 4)      \
    ATTN_PREFILL_WG_ENTRY(DT, KV, 8)
ATTN_PREFILL_WG_GROUPS(bf16, __nv_bfloat16)
ATTN_PREFILL_WG_GROUPS(f16, __half)

// Head dimensions compiled as constants (every loop unrolled, registers sized exactly), and a
// general version for the others.
#define ATTN_DTYPE(DT, KV)             \
    ATTN_ENTRY(DT, KV, 64, _d64)       \
    ATTN_ENTRY(DT, KV, 128, _d128)     \
    ATTN_ENTRY(DT, KV, 256, _d256)     \
    ATTN_ENTRY(DT, KV, 0, )

ATTN_DTYPE(bf16, __nv_bfloat16)
ATTN_DTYPE(f16, __half)

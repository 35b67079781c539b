// The arithmetic of every attention kernel, on the tensor cores: one warp runs the online softmax
// of 16 (token, query head) rows over one tile of ATTN_TILE key/value positions, with mma.sync
// m16n8k16 (16-bit operands, f32 accumulators).
//
// Per tile, for each row (q: the row's rotated query rounded to the KV type):
//   s_j = (q · k_j as one mma chain over the head dims, 16 at a time in order) * scale log2(e),
//         for the row's valid positions j (the others are -inf and weigh exactly 0);
//   m'  = max(m, max_j s_j);  p_j = 2^(s_j - m');  corr = 2^(m - m') (0 while m is -inf, 1
//         where m' = m);
// (scores in base 2: 2^x is one ex2.approx instruction, e^x about eight; m and the merge's
// weights stay in base 2 throughout);
//   l   = l * corr + sum_j p_j, the sum in one fixed order: each lane of a quad adds its eight
//         values (n-tile 0..3, column pair in order), then the quad adds xor 1 and xor 2;
//   o   = o * corr + P · V, P = p rounded to the KV type, one mma chain over positions 0-15
//         then 16-31.
// Each product and difference is rounded on its own (__fmul_rn, __fsub_rn, __fadd_rn; fmaf where
// the order says fma), so no kernel's compiler may fuse them differently.
// Every output element of an mma depends only on its own row of A, column of B and accumulator,
// so none of these bits depends on which warp computes a row, on the other rows of the warp or on
// where the operands came from: the decode kernels (one token's query heads in a warp, most rows
// padding) and attn_prefill (16 rows of a prompt chunk per warp) give the same bits, and so the
// KV a prefill writes is the KV decode would have written. A tile with no valid position for a
// row leaves the row's state exactly as it was (corr 1, p 0), so a row may take part in tiles
// past its own span: attn_prefill's rows share tiles with later tokens' rows.
//
// Tiles live in shared memory as rows of ATTN_ROW(D) elements (D + 8: the 16 bytes of padding put
// ldmatrix's eight rows in different banks); positions past the tile's last valid one must hold
// finite values (the loaders zero them), since 0 · NaN would poison the sum.
#pragma once
#include "common.cuh"
#include "tensor_core.cuh"

// 2^x for the softmax (ex2.approx, results below 2^-126 flushed to 0: weights that small add
// nothing); the same instruction in every kernel, so the same bits.
__device__ __forceinline__ float attn_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}
// log2(e), which takes the scores' scale into base 2.
#define ATTN_LOG2E 1.4426950408889634f

#define ATTN_TILE 32
#define ATTN_ROW(D) ((D) + 8)

// Where a tile's row r, dims d .. d + 7 (d a multiple of 8) lie in shared memory, in bytes from
// the tile's base. TilePadded: rows of ATTN_ROW(D) elements, as the kernels stage by hand.
struct TilePadded {
    static __device__ __forceinline__ u32 at(u32 base, int r, int d, int D) {
        return base + (u32)(r * ATTN_ROW(D) + d) * 2;
    }
    // Bytes of a tile's keys (its values follow them where a stage holds both).
    static __device__ __forceinline__ u32 bytes(int D) { return ATTN_TILE * ATTN_ROW(D) * 2; }
};
// TileSwizzled: as tensor copies land boxes of 64 dims with the 128-byte swizzle: dims
// [64h, 64h + 64) of the tile's ATTN_TILE rows at base + h * ATTN_TILE * 128, row r's 16-byte
// chunk c at chunk c ^ (r % 8) of its 128 bytes (base 1024-byte aligned). Eight consecutive rows
// of one chunk hit eight different bank groups, as the padding does.
struct TileSwizzled {
    static __device__ __forceinline__ u32 at(u32 base, int r, int d, int) {
        return base + (u32)((d >> 6) * (ATTN_TILE * 128) + r * 128 +
                            ((((d >> 3) & 7) ^ (r & 7)) << 4));
    }
    static __device__ __forceinline__ u32 bytes(int D) { return ATTN_TILE * D * 2; }
};

// The running state of one split for the 16 rows of a warp. MAXD: the largest head dimension
// (a multiple of 16); the runtime D (a multiple of 16, ≤ MAXD) bounds every loop.
template <typename KV, int MAXD>
struct AttnRows {
    static_assert(MAXD % 16 == 0, "head dims in steps of 16");
    static constexpr int NT = MAXD / 8;
    // o[n][2h + e]: row lane / 4 + 8h, head dim 8n + 2 (lane % 4) + e.
    float o[NT][4];
    // Rows lane / 4 and lane / 4 + 8 (each quad holds the same values).
    float m[2], l[2];

    __device__ __forceinline__ void init() {
#pragma unroll
        for (int n = 0; n < NT; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) o[n][e] = 0.f;
        m[0] = m[1] = -INFINITY;
        l[0] = l[1] = 0.f;
    }

    // One tile. q: shared address of the warp's 16 query rows; k, v: of the tile's ATTN_TILE key
    // and value rows (all rows ATTN_ROW(D) elements apart); n0, n1: the tile's valid positions
    // for rows lane / 4 and lane / 4 + 8 (≤ 0: none).
    __device__ __forceinline__ void tile(u32 q, u32 k, u32 v, int D, int n0, int n1,
                                         float scale) {
        u32 pa[2][4];
        scores(q, k, D, n0, n1, scale, pa);
        values(v, D, pa);
    }

    // The online-softmax update of the lane's two rows (h = 0, 1) by N consecutive tiles of one
    // split, in order, with scores s[t] (n-tile j, element 2h + e: position 8j + 2 (lane % 4)
    // + e), the first n[t][h] positions valid (MASK; else all): each s[t] becomes P, m and l
    // move on, corr[t] gets o's correction before tile t's values, and rescale[t] whether it
    // is needed in this lane. Each row's and each tile's operations and their order are those of
    // N updates one after another; only independent work goes side by side (the rows', and the
    // tiles' scaling, maxima, exponentials and sums: their shuffles in flight together).
    template <bool MASK, int N>
    __device__ __forceinline__ void online(float (&s)[N][4][4], const int (&n)[N][2],
                                           float scale, float (&corr)[N][2],
                                           bool (&rescale)[N]) {
        const int c2 = (threadIdx.x & 3) * 2;
        const float scale2 = __fmul_rn(scale, ATTN_LOG2E);
        float mx[N][2];
#pragma unroll
        for (int t = 0; t < N; ++t)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                mx[t][h] = -INFINITY;
#pragma unroll
                for (int j = 0; j < 4; ++j)
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        const bool ok = !MASK || 8 * j + c2 + e < n[t][h];
                        float& x = s[t][j][2 * h + e];
                        x = ok ? __fmul_rn(x, scale2) : -INFINITY;
                        mx[t][h] = fmaxf(mx[t][h], x);
                    }
            }
#pragma unroll
        for (int x = 1; x <= 2; x *= 2) {
            float o[N][2];
#pragma unroll
            for (int t = 0; t < N; ++t)
#pragma unroll
                for (int h = 0; h < 2; ++h) o[t][h] = __shfl_xor_sync(0xffffffffu, mx[t][h], x);
#pragma unroll
            for (int t = 0; t < N; ++t)
#pragma unroll
                for (int h = 0; h < 2; ++h) mx[t][h] = fmaxf(mx[t][h], o[t][h]);
        }
        // Each tile's new maximum (tile t's from tile t - 1's), then its weights and their sum.
        float mn[N][2], sum[N][2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            float prev = m[h];
#pragma unroll
            for (int t = 0; t < N; ++t) prev = mn[t][h] = fmaxf(prev, mx[t][h]);
        }
#pragma unroll
        for (int t = 0; t < N; ++t)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                sum[t][h] = 0.f;
#pragma unroll
                for (int j = 0; j < 4; ++j)
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        const bool ok = !MASK || 8 * j + c2 + e < n[t][h];
                        float& x = s[t][j][2 * h + e];
                        x = ok ? attn_exp2(__fsub_rn(x, mn[t][h])) : 0.f;
                        sum[t][h] = __fadd_rn(sum[t][h], x);
                    }
            }
#pragma unroll
        for (int x = 1; x <= 2; x *= 2) {
            float o[N][2];
#pragma unroll
            for (int t = 0; t < N; ++t)
#pragma unroll
                for (int h = 0; h < 2; ++h) o[t][h] = __shfl_xor_sync(0xffffffffu, sum[t][h], x);
#pragma unroll
            for (int t = 0; t < N; ++t)
#pragma unroll
                for (int h = 0; h < 2; ++h) sum[t][h] = __fadd_rn(sum[t][h], o[t][h]);
        }
#pragma unroll
        for (int t = 0; t < N; ++t) {
            rescale[t] = false;
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                // While m is -inf, o is exactly 0 (every P so far 0), so o · 0 = o: only a
                // maximum that moved from a finite value needs o rescaled.
                corr[t][h] = m[h] == -INFINITY  ? 0.f
                             : m[h] == mn[t][h] ? 1.f
                                                : attn_exp2(__fsub_rn(m[h], mn[t][h]));
                rescale[t] |= m[h] != -INFINITY && m[h] != mn[t][h];
                l[h] = fmaf(l[h], corr[t][h], sum[t][h]);
                m[h] = mn[t][h];
            }
        }
    }

    // The scores of N tiles against the keys, unscaled: s[t] (n-tile j, positions 8j .. 8j + 7;
    // every position of the tile, valid or not), the tiles' mma chains side by side. L: the
    // keys' layout (the queries are padded).
    template <int N, typename L = TilePadded>
    __device__ __forceinline__ void raw_scores(u32 q, const u32 (&k)[N], int D,
                                               float (&s)[N][4][4]) const {
        const int lane = threadIdx.x & 31, mi = lane >> 3, rr = lane & 7;
        const int stride = ATTN_ROW(D) * 2;  // bytes
        const KV* type = nullptr;
#pragma unroll
        for (int t = 0; t < N; ++t)
#pragma unroll
            for (int j = 0; j < 4; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) s[t][j][e] = 0.f;
#pragma unroll
        for (int kk = 0; kk < MAXD / 16; ++kk) {
            if (kk * 16 >= D) break;
            u32 a[4];
            ldsm_x4<false>(q + (lane & 15) * stride + (kk * 16 + (lane >> 4) * 8) * 2, a);
#pragma unroll
            for (int t = 0; t < N; ++t)
#pragma unroll
                for (int jp = 0; jp < 2; ++jp) {
                    // Matrix mi: positions of n-tile 2jp + mi / 2, dims kk*16 + 8 (mi % 2).
                    u32 b[4];
                    ldsm_x4<false>(
                        L::at(k[t], (2 * jp + (mi >> 1)) * 8 + rr, kk * 16 + (mi & 1) * 8, D), b);
                    mma_16816(s[t][2 * jp], a, b[0], b[1], type);
                    mma_16816(s[t][2 * jp + 1], a, b[2], b[3], type);
                }
        }
    }

    // The online-softmax update by N consecutive tiles' raw scores of one split (n[t]: valid
    // positions of the lane's rows, ≤ 0 none), leaving each tile's P in pa[t] and o's
    // correction before its values in corr[t] (rescale_o, then values, tile by tile).
    template <int N>
    __device__ __forceinline__ void update(float (&s)[N][4][4], const int (&n)[N][2],
                                           float scale, u32 (&pa)[N][2][4], float (&corr)[N][2],
                                           bool (&rescale)[N]) {
        // Where every position of every row of the warp is valid (all tiles but a span's last)
        // without the masks: the same operations on the same values. (A choice the whole warp
        // makes: online() shuffles.)
        bool full = true;
#pragma unroll
        for (int t = 0; t < N; ++t) full = full && n[t][0] >= ATTN_TILE && n[t][1] >= ATTN_TILE;
        if (__all_sync(0xffffffffu, full))
            online<false, N>(s, n, scale, corr, rescale);
        else
            online<true, N>(s, n, scale, corr, rescale);
        // P as A fragments: k-step kk covers positions 16kk .. 16kk + 15 (n-tiles 2kk, 2kk + 1).
#pragma unroll
        for (int t = 0; t < N; ++t)
#pragma unroll
            for (int kk = 0; kk < 2; ++kk) {
                pa[t][kk][0] = pack2<KV>(s[t][2 * kk][0], s[t][2 * kk][1]);
                pa[t][kk][1] = pack2<KV>(s[t][2 * kk][2], s[t][2 * kk][3]);
                pa[t][kk][2] = pack2<KV>(s[t][2 * kk + 1][0], s[t][2 * kk + 1][1]);
                pa[t][kk][3] = pack2<KV>(s[t][2 * kk + 1][2], s[t][2 * kk + 1][3]);
            }
    }

    // o scaled by a tile's correction, unless no row's maximum moved from a finite value in any
    // lane (corr 1, and x · 1 = x; or o still 0): past a span's first tiles the usual case.
    __device__ __forceinline__ void rescale_o(const float (&corr)[2], bool rescale) {
        if (__any_sync(0xffffffffu, rescale)) {
#pragma unroll
            for (int nn = 0; nn < NT; ++nn) {
                o[nn][0] = __fmul_rn(o[nn][0], corr[0]);
                o[nn][1] = __fmul_rn(o[nn][1], corr[0]);
                o[nn][2] = __fmul_rn(o[nn][2], corr[1]);
                o[nn][3] = __fmul_rn(o[nn][3], corr[1]);
            }
        }
    }

    // The tile's first half: the scores against the keys and the online-softmax update (o
    // rescaled), leaving P in `pa` for values(). Split so a caller can reuse the keys' buffer
    // while the values are still on their way. L: the keys' layout (the queries are padded).
    template <typename L = TilePadded>
    __device__ __forceinline__ void scores(u32 q, u32 k, int D, int n0, int n1, float scale,
                                           u32 (&pa)[2][4]) {
        float s[1][4][4];
        const u32 keys[1] = {k};
        raw_scores<1, L>(q, keys, D, s);
        const int n[1][2] = {{n0, n1}};
        u32 p[1][2][4];
        float corr[1][2];
        bool rescale[1];
        update<1>(s, n, scale, p, corr, rescale);
        rescale_o(corr[0], rescale[0]);
#pragma unroll
        for (int kk = 0; kk < 2; ++kk)
#pragma unroll
            for (int i = 0; i < 4; ++i) pa[kk][i] = p[0][kk][i];
    }

    // The tile's second half: o += P · V. L: the values' layout.
    template <typename L = TilePadded>
    __device__ __forceinline__ void values(u32 v, int D, const u32 (&pa)[2][4]) {
        const int lane = threadIdx.x & 31, mi = lane >> 3, rr = lane & 7;
        const KV* type = nullptr;
#pragma unroll
        for (int kk = 0; kk < 2; ++kk)
#pragma unroll
            for (int np = 0; np < NT / 2; ++np) {
                if (np * 16 >= D) break;
                // Matrix mi (transposed): positions 16kk + 8 (mi % 2), dims 16np + 8 (mi / 2).
                u32 b[4];
                ldsm_x4<true>(L::at(v, 16 * kk + (mi & 1) * 8 + rr, 16 * np + (mi >> 1) * 8, D),
                              b);
                mma_16816(o[2 * np], pa[kk], b[0], b[1], type);
                mma_16816(o[2 * np + 1], pa[kk], b[2], b[3], type);
            }
    }

    // The rows' partials: row r (0..15 of the warp) where want(r), its D values to o_row(r) and
    // (m, l) to ml_row(r)[0..1]. For rows of another layout the caller reads o, m and l itself.
    template <typename Want, typename ORow, typename MlRow>
    __device__ __forceinline__ void store(int D, Want want, ORow o_row, MlRow ml_row) const {
        const int lane = threadIdx.x & 31, c2 = (lane & 3) * 2;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int r = (lane >> 2) + 8 * h;
            if (!want(r)) continue;
            float* dst = o_row(r);
#pragma unroll
            for (int nn = 0; nn < NT; ++nn) {
                if (nn * 8 >= D) break;
                *reinterpret_cast<float2*>(dst + nn * 8 + c2) =
                    make_float2(o[nn][2 * h], o[nn][2 * h + 1]);
            }
            if ((lane & 3) == 0) {
                float* ml = ml_row(r);
                ml[0] = m[h];
                ml[1] = l[h];
            }
        }
    }
};

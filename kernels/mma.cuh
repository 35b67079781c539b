// Projections on the tensor cores: y[t, r] (=|+=) sum_k x̂[t, k] * W[r, k] (+ bias[r]), where x̂
// is the projection's input rounded to the weights' 16-bit type (after the RMSNorm where there
// is one), accumulated in f32 by mma.sync m16n8k16 with the weights as the A operand (16 rows)
// and the tokens as B (8 per n-tile).
//
// Batch invariance by construction: every output element is reduced in one order that depends
// on nothing but K. The K axis is cut into groups of 64; warp w of a block (8 warps) takes groups
// w, w+8, w+16, ... in ascending order, one chain of four mma per group (fixed k permutation,
// below), and the warps' sums are added (w0 + w4) + (w1 + w5) + (w2 + w6) + (w3 + w7). How many
// tokens a launch carries (NT n-tiles, passes over T), how many 16-row tiles a warp holds (MT),
// and where x̂ comes from (rounded here from f32, or prepared by to_half) change no bit of any
// output: a sequence's logits are the same alone or in any batch. (An mma's result element
// depends only on its own row of A, column of B and accumulator.)
//
// The k permutation: in group kb, thread (g = lane / 4, c = lane % 4) holds 16 elements of a row:
// chunk A = kb + 8c .. +7 and chunk B = kb + 32 + 8c .. +7 (each warp-wide load reads 64
// contiguous bytes of 8 rows). mma j (0..3) takes elements 4j .. 4j+3 of that list, which the
// fragment layout places at logical k 2c, 2c+1 (a0 a1 / b0 b1) and 2c+8, 2c+9 (a4 a5 / b2 b3);
// the tokens' x̂ is loaded with the same permutation, so the sum is over the right pairs.
//
// Weight layout: row-major (mma.cu), or tiled (mma_tiled.cu, MMA_TILED: the default of the
// tensor-core mode; nervad/src/backend/cuda/weight_tiles.rs): the 2 KiB of a (16-row tile,
// group) stored together in load order, so each warp-wide load reads 512 contiguous bytes
// instead of 64 bytes from each of 8 rows. Every thread loads the same 16 bytes either way, so
// the layout changes no bit of any output.
//
// Token tiles: a launch may split its tokens over `token_tiles` blocks per row tile (block b takes
// row tile b / token_tiles and token tiles b % token_tiles, b % token_tiles + token_tiles, ...),
// so that projections with few rows still give every SM blocks; the blocks of a row tile are
// adjacent, run together and read its weights once from memory between them (L2). 1: one block
// walks all of a row tile's tokens. Which block computes an output changes none of its bits.
//
// yh (GLU only; null: none): the output rounded to W at xhat_at(column, yh_wg) of its row, the
// next projection's input as to_half prepares it (the same value rounded the same way), instead
// of y: the launch that reads it reads nothing else (a 2,048-token prompt's gate|up wrote 100 MB
// of f32 per layer that nothing read).
//
// Prologue (IN): RMS – RMSNorm of f32 rows computed in the block (only for one n-tile, T ≤ 8;
// rows_rms_inv, as to_half, so a prepared x̂ has the same bits); PLAIN – f32
// rows rounded as they are; HALF – x̂ prepared by to_half (many tokens: read once as 16-bit).
// Epilogues as the GEMV's: STORE, ADD (residual), GLU (gate|up rows interleaved in pairs; writes
// silu(gate) * up); the GEMM's tiles also ROPE (the q|k|v projection of a step with prompt rows:
// rope_append's work on the finished tile, rope_store_tile).
#pragma once
#include "common.cuh"
#include "activation.cuh"
#include "norm.cuh"
#include "rope.cuh"
#include "tensor_core.cuh"
#include "wgmma.cuh"
#include "mbarrier.cuh"

#ifndef MMA_TILED
#define MMA_TILED 0
#endif

#define MMA_THREADS 256
#define MMA_WARPS 8
#define MMA_GROUP 64
// One n-tile (batch 1–8) must read at the bandwidth from only R / 16 blocks: two groups of
// weights in flight per warp and three blocks per SM (registers ≤ 85), so that e.g. qwen3-8b's
// 384 q|k|v blocks run in one wave. Measured on the H100: 22.7 µs for that projection, against
// 27.8 µs with three groups in flight and fewer blocks per SM.
#ifndef MMA_N1_DEPTH
#define MMA_N1_DEPTH 2
#endif
// More tokens: two blocks per SM (registers ≤ 128) so one block's loads overlap the other's mma.
#define MMA_MIN_BLOCKS(NT, MT, DEEP) ((NT) * (MT) == 1 && !(DEEP) ? 3 : 2)
// The deep one-n-tile variant (n1d): for projections with too few 16-row blocks to give every SM
// three (qwen3-8b o_proj and down_proj: 256 blocks, about 2 per SM, where ncu measured 24%
// achieved occupancy against the GEMV's 48%), four groups in flight per warp and two blocks per
// SM (registers ≤ 128) keep as many bytes in flight as three shallow blocks would. Same
// arithmetic as n1: only how far ahead the loads run differs.
#ifndef MMA_DEEP_DEPTH
#define MMA_DEEP_DEPTH 4
#endif
// The residual-add form (o and down) has the registers for five groups (122 at five, no spill,
// where the norm prologue's forms reach 128 and q|k|v's spill): five made qwen3-8b's batch-1
// step 2.6% faster on an H200 (4.488 -> 4.370 ms; batch 8 and qwen3-0.6b unchanged;
// BENCHMARKS.md, 2026-11-28 thirty-first and thirty-second sessions).
#ifndef MMA_DEEP_DEPTH_ADD
#define MMA_DEEP_DEPTH_ADD 5
#endif
// The weight ring (n1r, n1dr, n1hr: n1, n1d, n1h with `KernelTuning::weight_ring`): each
// warp's next MMA_RING groups of weights (MMA_RING_DEEP for n1dr) stream into shared memory by
// cp.async (2 KiB per warp and group, the launch's dynamic shared memory) instead of DEPTH
// groups waiting in registers. Copies need no registers, so more bytes can be in flight per SM,
// and a block asks for its first groups before it waits for the previous kernel, which keeps
// memory busy across the kernel boundary. Each lane copies and reads back only its own 16-byte
// chunks, the ones load_weights would give it: the same operands, the same bits. By default only
// n1dr, and only for launches of fewer blocks than SMs (`KernelTuning::weight_ring_deep`;
// measured: BENCHMARKS.md, 2026-11-28 twenty-sixth and twenty-seventh sessions). The depths
// here, as the ones above, can be set with -D for experiments (NERVA_KERNEL_DEFINES); the host's
// MMA_RING_SHARED and MMA_RING_DEEP_SHARED must then follow.
#ifndef MMA_RING
#define MMA_RING 3
#endif
#ifndef MMA_RING_DEEP
#define MMA_RING_DEEP 4
#endif

enum { MIN_RMS = 0, MIN_PLAIN = 1, MIN_HALF = 2 };
enum { MEPI_STORE = 0, MEPI_ADD = 1, MEPI_GLU = 2, MEPI_ROPE = 3 };

// The ROPE epilogue's step (the `mma_rope_*_wgt` entry's parameters after the GEMM's): the rows
// from `from` on are prompt rows, whose heads rope_append would rotate and append (rope_kv.cu);
// the rows before it (decode tokens of a mixed step, which the decode attention rotates itself)
// are stored to y as MEPI_STORE stores them.
template <typename KV>
struct RopeEpilogue {
    StepMeta meta;  // the whole step's, rows as the GEMM's tokens
    float* q_out;   // rotated queries, row t - from
    KV* kv;
    const int* tables;
    KvGeometry geo;
    int heads, kv_heads, head_dim, from;
    const float* q_norm;
    const float* k_norm;
    float eps;
    const float* cos_t;
    const float* sin_t;
};
static_assert(sizeof(RopeEpilogue<__half>) == 176, "the host's RopeEpilogueArg (cuda/mod.rs)");

// Eight f32 values rounded to W and packed in 16 bytes.
template <typename W>
__device__ __forceinline__ uint4 pack8(const float v[8]) {
    union {
        W h[8];
        uint4 u;
    } p;
#pragma unroll
    for (int i = 0; i < 8; ++i) narrow(v[i], &p.h[i]);
    return p.u;
}

// Chunk (8 elements at k) of a token as x̂: row `row` of x, or row `t` of the prepared xh (which
// to_half filled in launch order, gathered already); zeros past K.
template <typename W, int IN>
__device__ __forceinline__ uint4 load_xhat(const float* __restrict__ x, int x_stride,
                                           const W* __restrict__ xh, int row, int t, int k, int K,
                                           const float* __restrict__ norm_w, float inv) {
    if (k >= K) return make_uint4(0, 0, 0, 0);
    if (IN == MIN_HALF) return *reinterpret_cast<const uint4*>(xh + (size_t)t * K + k);
    const float* src = x + (size_t)row * x_stride + k;
    const float4 a = *reinterpret_cast<const float4*>(src);
    const float4 b = *reinterpret_cast<const float4*>(src + 4);
    float v[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
    if (IN == MIN_RMS) {
        const float4 na = *reinterpret_cast<const float4*>(norm_w + k);
        const float4 nb = *reinterpret_cast<const float4*>(norm_w + k + 4);
        const float n[8] = {na.x, na.y, na.z, na.w, nb.x, nb.y, nb.z, nb.w};
#pragma unroll
        for (int i = 0; i < 8; ++i) v[i] = n[i] * (v[i] * inv);
    }
    return pack8<W>(v);
}

// 16 bytes of shared memory at `addr`.
__device__ __forceinline__ uint4 lds128(u32 addr) {
    uint4 v;
    asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "r"(addr));
    return v;
}

// Where the 16 bytes of chunk q (A, B) of row g + 8 h of 16-row tile m of group kb lie for
// lane (g, c), and whether they exist (else: zeros). load_weights's addresses, for the ring
// (load_weights keeps its own form, so that the register kernels compile as they were measured).
template <typename W>
__device__ __forceinline__ const W* weight_chunk(const W* __restrict__ w, int row0, int R, int K,
                                                 int kb, int g, int c, int m, int h, int q,
                                                 bool& inside) {
#if MMA_TILED
    const int groups = (K + MMA_GROUP - 1) / MMA_GROUP;
    inside = row0 + 16 * m < R;
    return w + ((size_t)(row0 / 16 + m) * groups + kb / MMA_GROUP) * 4 * 256 + (g * 4 + c) * 8 +
           (h * 2 + q) * 256;
#else
    const int row = row0 + 16 * m + 8 * h + g, k = kb + 32 * q + 8 * c;
    inside = row < R && k < K;
    return w + (size_t)row * K + k;
#endif
}

// The weights of one group for MT 16-row tiles: [tile][0: row g, 1: row g + 8][chunk A, B].
template <typename W, int MT>
__device__ __forceinline__ void load_weights(const W* __restrict__ w, int row0, int R, int K,
                                             int kb, int g, int c, uint4 out[MT][2][2]) {
#if MMA_TILED
    // Tile (row0 / 16 + m), group kb / 64: chunks [h][q][lane] of 16 bytes; rows are padded to
    // 16 and columns to 64 with zeros, so only a tile past the matrix is skipped.
    const int groups = (K + MMA_GROUP - 1) / MMA_GROUP;
    const int lane = g * 4 + c;
#pragma unroll
    for (int m = 0; m < MT; ++m) {
        const bool inside = row0 + 16 * m < R;
        const W* tile = w + ((size_t)(row0 / 16 + m) * groups + kb / MMA_GROUP) * 4 * 256 + lane * 8;
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int q = 0; q < 2; ++q)
                out[m][h][q] = inside ? load_stream(tile + (h * 2 + q) * 256)
                                      : make_uint4(0, 0, 0, 0);
    }
#else
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int row = row0 + 16 * m + 8 * h + g;
#pragma unroll
            for (int q = 0; q < 2; ++q) {
                const int k = kb + 32 * q + 8 * c;
                out[m][h][q] = (row < R && k < K) ? load_stream(w + (size_t)row * K + k)
                                                  : make_uint4(0, 0, 0, 0);
            }
        }
#endif
}

template <typename W, int NT, int MT, int IN, int EPI, int DEEP, int SPLIT, int RING, int PERSIST>
__device__ __forceinline__ void mma_body(const W* __restrict__ w, const float* __restrict__ bias,
                                         const float* __restrict__ x, int x_stride,
                                         const W* __restrict__ xh, const int* __restrict__ x_rows,
                                         const float* __restrict__ norm_w, float eps, int K,
                                         int R, int T, float* __restrict__ y, int y_stride,
                                         int split_tiles, W* __restrict__ yh, int yh_wg,
                                         double* __restrict__ ssq) {
    constexpr int TT = 8 * NT;
    // Only the split variants (SPLIT) take token tiles from the launch: the others keep their
    // loop bounds compile-time (fewer registers).
    const int token_tiles = SPLIT ? split_tiles : 1;
    constexpr int ROWS = 16 * MT;
    // Groups of weights in flight per warp: deep where few accumulators leave registers free
    // (one n-tile: batch 1 must read at the bandwidth with only R / 16 blocks); with the ring,
    // only the group being multiplied.
    constexpr int DEEP_DEPTH = EPI == MEPI_ADD ? MMA_DEEP_DEPTH_ADD : MMA_DEEP_DEPTH;
    constexpr int DEPTH = RING              ? 1
                          : DEEP            ? DEEP_DEPTH
                          : MT * NT == 1    ? MMA_N1_DEPTH
                          : MT * NT <= 4    ? 2
                                            : 1;
    static_assert(IN != MIN_RMS || NT == 1, "the in-kernel norm serves one n-tile");
    static_assert(!PERSIST || (MT * NT == 1 && !SPLIT && !RING), "persistent: one n-tile");
    // Warp partials: warps w and w + 4 share row w (see the merge).
    __shared__ float red[MMA_WARPS / 2][ROWS][TT + 1];
    __shared__ double ss_red[4][IN == MIN_RMS ? TT : 1];
    __shared__ float inv_s[TT];
    __shared__ int rows_s[TT];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, c = lane & 3;
    const int row_first = (blockIdx.x / token_tiles) * ROWS;
    const int first = (blockIdx.x % token_tiles) * TT;
    const int groups = (K + MMA_GROUP - 1) / MMA_GROUP;
    // Persistent (PERSIST): the block walks the row tiles blockIdx.x, + gridDim.x, ... Where
    // every warp takes a multiple of DEPTH groups per tile (`chain`), the stream of a warp's
    // groups runs on across tiles: the refill of a slot past this tile's last group loads the
    // next tile's group that lands in that same slot, so the next tile's first weights are in
    // flight during this tile's last mma, merge and store. Otherwise each tile starts its own
    // loads as a new block would. The same sums per tile: the same bits. One token tile only
    // (T ≤ 8, as every one-n-tile launch): the walk does not restart for a second one (resetting
    // row0 per token tile costs gate|up's form a spill).
    const bool chain = PERSIST && groups % (MMA_WARPS * DEPTH) == 0;
    int row0 = row_first;
    // The weight ring (RING groups per warp, 0: none): this warp's slots [slot][h * 2 + q][lane]
    // of 16 bytes.
    static_assert(RING == 0 || (MT * NT == 1 && !SPLIT), "the ring serves one n-tile");
    extern __shared__ __align__(16) uint4 mma_ring[];
    if (RING) {
        u32 dyn;
        asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn));
        if (dyn < MMA_WARPS * RING * 2048) __trap();  // launched without its ring: a host bug
    }
    const u32 my_ring = (u32)__cvta_generic_to_shared(mma_ring) + (warp * RING * 128 + lane) * 16;
    // Ring slot `slot` ← group gi (zeros past the matrix), one commit group per weight group.
    auto ring_fill = [&](int slot, int gi) {
        if (gi < groups) {
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                bool inside;
                const W* src =
                    weight_chunk(w, row0, R, K, gi * MMA_GROUP, g, c, 0, j >> 1, j & 1, inside);
                cp_async16(my_ring + (slot * 4 + j) * 512, inside ? src : w, inside);
            }
        }
        cp_async_commit();
    };

    for (int t0 = first; t0 < T; t0 += TT * token_tiles) {
        // The first groups' weights do not depend on the previous kernel: their loads go out
        // before the prologue.
        uint4 wr[DEPTH][MT][2][2];
        if (RING) {
#pragma unroll
            for (int d = 0; d < RING; ++d) ring_fill(d, warp + d * MMA_WARPS);
        } else {
#pragma unroll
            for (int d = 0; d < DEPTH; ++d) {
                const int gi = warp + d * MMA_WARPS;
                if (gi < groups) load_weights<W, MT>(w, row0, R, K, gi * MMA_GROUP, g, c, wr[d]);
            }
        }
        // Weights only until the previous kernel is done: these loads overlap its drain.
        if (t0 == first) pdl_enter();
        __syncthreads();
        if (tid < TT) {
            const int t = t0 + tid < T ? t0 + tid : t0;
            rows_s[tid] = x_rows ? x_rows[t] : t;
        }
        __syncthreads();
        if (IN == MIN_RMS) {
            // The rows' chunk sums of squares where the residual add that wrote x left them
            // (ssq): the same inv in one round trip.
            if (ssq)
                rows_rms_inv_ssq<TT>(ssq, rows_s, T - t0, K, eps, &ss_red[0][0], inv_s);
            else
                rows_rms_inv<TT>(x, x_stride, rows_s, T - t0, K, eps, &ss_red[0][0], inv_s);
        }

        // This thread's token of each n-tile (g), or -1 past T.
        int tok[NT];
        float inv[NT];
#pragma unroll
        for (int n = 0; n < NT; ++n) {
            const int i = n * 8 + g;
            tok[n] = t0 + i < T ? rows_s[i] : -1;
            inv[n] = IN == MIN_RMS ? inv_s[i] : 1.f;
        }

        for (;;) {
            float acc[MT][NT][4];
#pragma unroll
            for (int m = 0; m < MT; ++m)
#pragma unroll
                for (int n = 0; n < NT; ++n)
#pragma unroll
                    for (int e = 0; e < 4; ++e) acc[m][n][e] = 0.f;
            // The block's next row tile (persistent), past R when none.
            const int next_row0 = PERSIST ? row0 + (int)gridDim.x * ROWS : R;

            // Groups warp, warp + 8, ... in order; slot d of the registers holds group gi + 8 d
            // and is refilled DEPTH groups ahead as soon as its mma are issued. With the ring (one
            // slot of registers), the group first waits in its ring slot until its copies landed
            // (RING - 1 younger commit groups may still be in flight) and is read back into the
            // registers, and the ring slot is refilled RING groups ahead once its mma have read
            // them.
            int slot = 0;
            for (int base = warp; base < groups; base += MMA_WARPS * DEPTH) {
#pragma unroll
                for (int d = 0; d < DEPTH; ++d) {
                    const int gi = base + d * MMA_WARPS;
                    if (gi >= groups) break;
                    const int kb = gi * MMA_GROUP;
                    if (RING) {
                        cp_async_wait<(RING > 0 ? RING - 1 : 0)>();
#pragma unroll
                        for (int j = 0; j < 4; ++j)
                            wr[d][0][j >> 1][j & 1] = lds128(my_ring + (slot * 4 + j) * 512);
                    }
#pragma unroll
                    for (int n = 0; n < NT; ++n) {
                        uint4 xb[2];
#pragma unroll
                        for (int q = 0; q < 2; ++q)
                            xb[q] = tok[n] >= 0
                                        ? load_xhat<W, IN>(x, x_stride, xh, tok[n], t0 + 8 * n + g,
                                                           kb + 32 * q + 8 * c, K, norm_w, inv[n])
                                        : make_uint4(0, 0, 0, 0);
                        const u32* bw = reinterpret_cast<const u32*>(xb);
#pragma unroll
                        for (int m = 0; m < MT; ++m) {
                            const u32* lo = reinterpret_cast<const u32*>(wr[d][m][0]);
                            const u32* hi = reinterpret_cast<const u32*>(wr[d][m][1]);
#pragma unroll
                            for (int j = 0; j < 4; ++j) {
                                // Elements 4j .. 4j+3 of the thread's 16: words 2j, 2j + 1.
                                const u32 a[4] = {lo[2 * j], hi[2 * j], lo[2 * j + 1],
                                                  hi[2 * j + 1]};
                                mma_16816(acc[m][n], a, bw[2 * j], bw[2 * j + 1], w);
                            }
                        }
                    }
                    if (RING) {
                        ring_fill(slot, gi + RING * MMA_WARPS);
                        slot = slot + 1 == RING ? 0 : slot + 1;
                    } else {
                        const int ahead = gi + DEPTH * MMA_WARPS;
                        if (ahead < groups)
                            load_weights<W, MT>(w, row0, R, K, ahead * MMA_GROUP, g, c, wr[d]);
                        else if (chain && next_row0 < R)
                            load_weights<W, MT>(w, next_row0, R, K, (ahead - groups) * MMA_GROUP, g,
                                                c, wr[d]);
                    }
                }
            }

            // Merge in a fixed order: (w0 + w4) + (w1 + w5) + (w2 + w6) + (w3 + w7). C fragment:
            // (row g, tokens 2c, 2c + 1) and (row g + 8, the same tokens).
#pragma unroll
            for (int half = 1; half >= 0; --half) {
                if ((warp >> 2) == half) {
                    float(&r)[ROWS][TT + 1] = red[warp & 3];
#pragma unroll
                    for (int m = 0; m < MT; ++m)
#pragma unroll
                        for (int n = 0; n < NT; ++n) {
                            const int ro = 16 * m + g, t = 8 * n + 2 * c;
#pragma unroll
                            for (int e = 0; e < 4; ++e) {
                                float& slot = r[ro + 8 * (e >> 1)][t + (e & 1)];
                                slot = half ? acc[m][n][e] : acc[m][n][e] + slot;
                            }
                        }
                }
                __syncthreads();
            }
            if (EPI == MEPI_GLU) {
                // Tile m's rows 4q + e (gate) and 4q + 2 + e (up) give output
                // 8 (row0 / 16 + m) + 2q + e.
                for (int i = tid; i < MT * 8 * TT; i += MMA_THREADS) {
                    const int t = i % TT, o = i / TT;
                    const int m = o / 8, q = (o % 8) / 2, e = o % 2;
                    const int rg = 16 * m + 4 * q + e, ru = rg + 2;
                    if (row0 + ru < R && t0 + t < T) {
                        float gs = red[0][rg][t], us = red[0][ru][t];
#pragma unroll
                        for (int wi = 1; wi < MMA_WARPS / 2; ++wi) {
                            gs += red[wi][rg][t];
                            us += red[wi][ru][t];
                        }
                        if (bias) {
                            gs += bias[row0 + rg];
                            us += bias[row0 + ru];
                        }
                        const int j = (row0 / 16 + m) * 8 + 2 * q + e;
                        const float v = silu(gs) * us;
                        // The next projection's input as to_half would prepare it (yh: the
                        // host's `Proj::half_out`), so that its launch needs no to_half; that
                        // launch then reads only yh, so the f32 output is not written at all.
                        if (yh)
                            narrow(v, yh + (size_t)(t0 + t) * y_stride + xhat_at(j, yh_wg));
                        else
                            y[(size_t)(t0 + t) * y_stride + j] = v;
                    }
                }
            } else {
                for (int i = tid; i < ROWS * TT; i += MMA_THREADS) {
                    const int t = i % TT, r = i / TT;
                    if (row0 + r < R && t0 + t < T) {
                        float sum = red[0][r][t];
#pragma unroll
                        for (int wi = 1; wi < MMA_WARPS / 2; ++wi) sum += red[wi][r][t];
                        if (bias) sum += bias[row0 + r];
                        float* out = y + (size_t)(t0 + t) * y_stride + row0 + r;
                        if (EPI == MEPI_ADD) sum += *out;
                        *out = sum;
                        // Only this thread reads red[..][r][t]: its slot in red[0] keeps the
                        // new value for the chunk sums below.
                        if (EPI == MEPI_ADD && ssq) red[0][r][t] = sum;
                    }
                }
            }
            __syncthreads();
            // ssq (residual add only): each whole 8-row chunk's sum of squares per token, the
            // next norm prologue's rows_rms_inv term (rows_rms_inv_ssq), so that it need not read
            // the rows back chunk by chunk. Chunks of x rows, ssq rows of R / 8.
            if (EPI == MEPI_ADD && ssq) {
                for (int i = tid; i < ROWS / 8 * TT; i += MMA_THREADS) {
                    const int t = i % TT, k = i / TT;
                    if (row0 + 8 * k + 8 <= R && t0 + t < T)
                        store_chunk_ssq(ssq, (size_t)(t0 + t), R / 8, row0 / 8 + k,
                                        &red[0][8 * k][t], TT + 1);
                }
                // The next row tile's merge overwrites red.
                if (PERSIST) __syncthreads();
            }
            if (!PERSIST || next_row0 >= R) break;
            row0 = next_row0;
            if (!chain) {
#pragma unroll
                for (int d = 0; d < DEPTH; ++d) {
                    const int gi = warp + d * MMA_WARPS;
                    if (gi < groups)
                        load_weights<W, MT>(w, row0, R, K, gi * MMA_GROUP, g, c, wr[d]);
                }
            }
        }
    }
}

// The fixed-order GEMM (many tokens: prompt chunks, large decode steps). The same sums as
// mma_body, bit for bit: an output element is the chains w = 0..7 (chain w: groups w, w + 8, ...
// ascending, four mma per group in the same k permutation, from a zero accumulator) merged as
// (((w0 + w4) + (w1 + w5)) + (w2 + w6)) + (w3 + w7), then the bias. mma_body gives each chain
// to a warp and takes the operands straight from memory into registers, so every block re-reads
// the tokens' inputs; here a block computes a 128-row × BN-token tile (BN = 128, or 64 where
// the wider tile would leave SMs idle: `gemm`, `gemm64`), runs the chains one after another (w0,
// w4, w1, w5, ...: each pair's sum is taken as soon as its second chain ends; the pair's first
// chain waits in shared memory, the running sum in registers) and stages each group's weights
// and inputs in shared memory (cp.async, GEMM_STAGES deep), where its 8 warps (32 rows × BN / 2
// tokens each) share them. Fragments are read from shared memory in the layout the tiled weights
// already have ([row tile][h][q][lane], 16 bytes each), so each thread still holds exactly
// mma_body's 16 bytes per operand; the tile width changes no bit.
//
// Chain splits: where the tiles are too few to give every SM a block (decode steps of tens of
// tokens, o and down over short prompt chunks), `splits` (4 or 8) blocks share a tile, block s
// running positions [8s / splits, 8(s + 1) / splits) of the chain order (4: the pair
// p_s = w_s + w_(s+4); 8: one chain alone). Each writes what it holds to `ws` and counts itself in
// `counters[tile]`; the last of the tile to arrive reads the others back and merges them as one
// block would ((p0 + p1) + p2) + p3 (with 8: p_i = w_i + w_(i+4) first), then runs the epilogue
// and resets the counter for the next launch. Same operations on the same values: same bits.
#define GEMM_BM 128
#define GEMM_STAGES 3
#define GEMM_A_BYTES (GEMM_BM / 16 * 2048)

// The shared memory layout of a BN-token tile: GEMM_STAGES stages of weights (16 KiB) and inputs
// (BN / 8 KiB), then each thread's pair-opening chain ([warp][m][n][e][lane] floats).
template <int BN>
struct GemmTile {
    static constexpr int WN = BN / 16;  // n-tiles per warp: the block's tokens in two halves
    static constexpr int B_BYTES = BN / 8 * 1024;
    static constexpr int STAGE_BYTES = GEMM_A_BYTES + B_BYTES;
    static constexpr int FIRST_BYTES = MMA_WARPS * 2 * WN * 4 * 32 * 4;
    // Dynamic shared memory of a launch (the host's mma_gemm_shared).
    static constexpr int SMEM = GEMM_STAGES * STAGE_BYTES + FIRST_BYTES;
};

// Chain ci of the GEMM's order (0, 4, 1, 5, 2, 6, 3, 7) and how many groups it holds.
__device__ __forceinline__ int gemm_chain(int ci) { return (ci & 1) * 4 + (ci >> 1); }
__device__ __forceinline__ int gemm_chain_len(int v, int groups) {
    return v < groups ? (groups - v + MMA_WARPS - 1) / MMA_WARPS : 0;
}

// A GEMM launch's split plan (its `split_plan` argument): the low 4 bits are the chain splits S
// (1, 4 or 8) of the tiles it splits, the rest how many tiles come first whole (`whole`). Units
// (blocks, or a persistent block's turns) 0 .. whole - 1 are tiles 0 .. whole - 1 in one unit
// each; every later tile takes S adjacent units, one per split. whole = 0: every tile in S units.
// With whole a multiple of the SMs, the last partial wave of tiles is cut into S times as many
// shorter units that spread over every SM. A split tile's workspace slices and counter are its
// `slot`: its number among the split tiles. Which units carry a tile changes none of its bits.
struct SplitUnit {
    int tile_id, split, splits, slot;
    __device__ __forceinline__ SplitUnit(int plan, int unit) {
        const int s = plan & 15, whole = plan >> 4;
        if (unit < whole) {
            tile_id = unit;
            split = 0;
            splits = 1;
            slot = 0;
        } else {
            slot = (unit - whole) / s;
            tile_id = whole + slot;
            split = (unit - whole) % s;
            splits = s;
        }
    }
};
// The units of a launch of `tiles` tiles under `plan`.
__device__ __forceinline__ int split_plan_units(int plan, int tiles) {
    const int whole = plan >> 4;
    return whole + (tiles - whole) * (plan & 15);
}

// The positions [ci0, ci1) of the chain order that block `split` of a tile's `splits` runs, and
// the groups they hold (`mine`), in that order.
struct GemmChains {
    int ci0, ci1, mine, groups;
    __device__ __forceinline__ GemmChains(int split, int splits, int K) {
        groups = (K + MMA_GROUP - 1) / MMA_GROUP;
        ci0 = split * MMA_WARPS / splits;
        ci1 = (split + 1) * MMA_WARPS / splits;
        mine = 0;
        for (int ci = ci0; ci < ci1; ++ci) mine += gemm_chain_len(gemm_chain(ci), groups);
    }
    // The block's p-th group (p < mine).
    __device__ __forceinline__ int group_at(int p) const {
#pragma unroll
        for (int ci = 0; ci < MMA_WARPS; ++ci) {
            if (ci < ci0) continue;
            const int v = gemm_chain(ci), n = gemm_chain_len(v, groups);
            if (p < n) return v + MMA_WARPS * p;
            p -= n;
        }
        return 0;
    }
};

// A chain at position ci just ended in `acc`: positions 0, 2, 4, 6 (chains 0..3) open a pair and
// wait in `first` (this thread's own slots, `stride` apart), the odd ones close it:
// p_i = w_i + w_(i+4), sum = ((p0 + p1) + p2) + p3.
template <int VALS>
__device__ __forceinline__ void gemm_chain_done(int ci, int ci0, const float (&acc)[VALS],
                                                float (&sum)[VALS], float* first, int stride) {
#pragma unroll
    for (int v = 0; v < VALS; ++v) {
        float& f = first[v * stride];
        if ((ci & 1) == 0) {
            f = acc[v];
        } else {
            const float pair = f + acc[v];
            sum[v] = ci == ci0 + 1 ? pair : sum[v] + pair;
        }
    }
}

// The barrier among the threads that hold a GEMM tile's sums: the whole block, or (SYNC = 1) the
// 256 threads of the two computing warpgroups of the warp-specialized GEMM, whose producer
// warpgroup has left (named barrier 1).
template <int SYNC>
__device__ __forceinline__ void tile_sync() {
    if (SYNC == 0)
        __syncthreads();
    else
        asm volatile("bar.sync 1, %0;\n" ::"n"(MMA_THREADS) : "memory");
}

// A split tile's exchange: each block writes what it holds (its pair in `sum` with 4 splits,
// its chain in `acc` with 8) to its slice of ws ([slot][split][value][thread], the tile's
// `SplitUnit::slot`) and counts itself in counters[slot]; the last to arrive resets the counter,
// merges the slices as one block would, ((p0 + p1) + p2) + p3 with p_i = w_i + w_(i+4), into
// `sum` and returns true.
template <int VALS, int SYNC = 0>
__device__ __forceinline__ bool gemm_merge_splits(float* ws, int* counters, int slot, int split,
                                                  int splits, const float (&acc)[VALS],
                                                  float (&sum)[VALS]) {
    const int tid = threadIdx.x;
    float* slices = ws + (size_t)slot * splits * VALS * MMA_THREADS;
#pragma unroll
    for (int v = 0; v < VALS; ++v) {
        const float held = splits == MMA_WARPS ? acc[v] : sum[v];
        __stcg(slices + ((size_t)split * VALS + v) * MMA_THREADS + tid, held);
    }
    __threadfence();
    tile_sync<SYNC>();
    __shared__ int last;
    if (tid == 0) last = atomicAdd(counters + slot, 1) == splits - 1;
    tile_sync<SYNC>();
    if (!last) return false;
    __threadfence();
    if (tid == 0) counters[slot] = 0;
#pragma unroll
    for (int v = 0; v < VALS; ++v) {
        auto at = [&](int z) {
            return __ldcg(slices + ((size_t)z * VALS + v) * MMA_THREADS + tid);
        };
        // Slice z holds position z: with 8, chains w_i and w_(i+4) at 2i and 2i + 1.
        float pr[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) pr[i] = splits == MMA_WARPS ? at(2 * i) + at(2 * i + 1) : at(i);
        sum[v] = ((pr[0] + pr[1]) + pr[2]) + pr[3];
    }
    return true;
}

// MEPI_ROPE: a finished 128-row tile of the q|k|v projection, whose rows are whole heads of
// D = NJ * 64 dims (head_dim 64 or 128). Warp w takes the (token, head) units u = w + 8 i of the
// tile, all of one head (w % (128 / D)): a prompt row's head as rope_append's warp takes it
// (rope_dests' destinations, the norm weights and cos/sin through rope_load_table, each lane's
// values lane + 32 j of either half with the bias added as MEPI_STORE adds it, then rope_apply;
// a v head's values rounded into the pool): the same operations on the same f32 values, so the
// same bits as y through rope_append. A decode row's head goes to y as MEPI_STORE writes it.
// The epilogue is latency-bound (each unit's loads wait on its position, a k or v head's on its
// page too), so lane i first looks up unit i's position and page, and the units go in batches
// of ROPE_EPI_BATCH whose loads are all issued before any of them computes. Opt-in
// (`KernelTuning::rope_epilogue`): measured no faster than rope_append (BENCHMARKS.md,
// 2026-11-28 thirtieth session).
#define ROPE_EPI_BATCH 4
template <typename KV, int BN, int NJ>
__device__ __forceinline__ void rope_store_tile(const float (*tile)[BN + 1],
                                                const float* __restrict__ bias,
                                                float* __restrict__ y, int y_stride, int row0,
                                                int t0, int R, int T, const RopeEpilogue<KV>& e) {
    constexpr int D = NJ * 64, PER = GEMM_BM / D, UNITS = BN * PER / MMA_WARPS;
    static_assert(MMA_WARPS % PER == 0 && UNITS <= 32 && UNITS % ROPE_EPI_BATCH == 0,
                  "a warp's units: one head, a lane each, whole batches");
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int r0 = (warp % PER) * D, row = row0 + r0, h = row / D;
    if (row >= R) return;
    const bool rotated = h < e.heads + e.kv_heads, pooled = h >= e.heads;
    const float* nw = h < e.heads ? e.q_norm : e.k_norm;
    auto token = [&](int i) { return t0 + (warp + MMA_WARPS * i) / PER; };
    int pos = 0, page = 0;
    if (lane < UNITS && token(lane) < T && token(lane) >= e.from) {
        pos = e.meta.position[token(lane)];
        if (pooled) page = rope_page(e.meta, e.tables, e.geo, token(lane), pos);
    }
    auto value = [&](int i, int t) {
        float v = tile[r0 + i][t];
        if (bias) v += bias[row + i];
        return v;
    };
    for (int i0 = 0; i0 < UNITS; i0 += ROPE_EPI_BATCH) {
        RopeLane<NJ> r[ROPE_EPI_BATCH];
        RopeTarget d[ROPE_EPI_BATCH];
#pragma unroll
        for (int b = 0; b < ROPE_EPI_BATCH; ++b) {
            const int tok = token(i0 + b);
            d[b] = rope_dests(__shfl_sync(~0u, pos, i0 + b), __shfl_sync(~0u, page, i0 + b),
                              tok - e.from, h, e.q_out, e.kv, e.geo, e.heads, e.kv_heads, D,
                              e.cos_t, e.sin_t);
            if (rotated && tok < T && tok >= e.from)
                rope_load_table(r[b], nw, d[b].cs, d[b].sn, D, lane);
        }
#pragma unroll
        for (int b = 0; b < ROPE_EPI_BATCH; ++b) {
            const int tok = token(i0 + b), t = tok - t0;
            if (tok >= T) continue;
            if (tok < e.from) {
                for (int i = lane; i < D; i += 32) y[(size_t)tok * y_stride + row + i] = value(i, t);
                continue;
            }
            KV* pool = static_cast<KV*>(d[b].pool);
            if (!rotated) {
                for (int i = lane; i < D; i += 32) narrow(value(i, t), pool + i);
                continue;
            }
#pragma unroll
            for (int j = 0; j < NJ; ++j) {
                r[b].x1[j] = value(lane + 32 * j, t);
                r[b].x2[j] = value(lane + 32 * j + D / 2, t);
            }
            rope_apply<KV>(r[b], nw, e.eps, D, lane, d[b].q_dst, pool);
        }
    }
}

// A finished 128-row × BN-token tile (sums in shared memory, [row][token]) to y, by rows: the
// bias, then the epilogue (as mma_body's: for GLU, tile m's rows 4q + e (gate) and 4q + 2 + e
// (up) give output 8 (row0 / 16 + m) + 2q + e).
template <int EPI, int BN, typename W>
__device__ __forceinline__ void gemm_store_tile(const float (*tile)[BN + 1],
                                                const float* __restrict__ bias,
                                                float* __restrict__ y, int y_stride, int row0,
                                                int t0, int R, int T, W* __restrict__ yh,
                                                int yh_wg,
                                                const RopeEpilogue<W>* rope = nullptr) {
    const int tid = threadIdx.x;
    if constexpr (EPI == MEPI_ROPE) {
        if (rope->head_dim == 64)
            rope_store_tile<W, BN, 1>(tile, bias, y, y_stride, row0, t0, R, T, *rope);
        else
            rope_store_tile<W, BN, 2>(tile, bias, y, y_stride, row0, t0, R, T, *rope);
    } else if (EPI == MEPI_GLU) {
        for (int i = tid; i < GEMM_BM / 2 * BN; i += MMA_THREADS) {
            const int o = i % (GEMM_BM / 2), t = i / (GEMM_BM / 2);
            const int m = o / 8, q = (o % 8) / 2, e = o % 2;
            const int rg = 16 * m + 4 * q + e, ru = rg + 2;
            if (row0 + ru < R && t0 + t < T) {
                float gs = tile[rg][t], us = tile[ru][t];
                if (bias) {
                    gs += bias[row0 + rg];
                    us += bias[row0 + ru];
                }
                const int j = (row0 / 16 + m) * 8 + 2 * q + e;
                const float v = silu(gs) * us;
                if (yh)
                    narrow(v, yh + (size_t)(t0 + t) * y_stride + xhat_at(j, yh_wg));
                else
                    y[(size_t)(t0 + t) * y_stride + j] = v;
            }
        }
    } else {
        // Eight outputs per thread at a time, their residuals loaded together first (one at a
        // time, each load's latency was ~10% of a 64-token down projection under ncu).
        constexpr int BATCH = 8;
        static_assert(GEMM_BM * BN % (MMA_THREADS * BATCH) == 0, "whole batches");
        for (int i0 = tid; i0 < GEMM_BM * BN; i0 += MMA_THREADS * BATCH) {
            float old[BATCH];
#pragma unroll
            for (int j = 0; j < BATCH; ++j) {
                const int i = i0 + j * MMA_THREADS, r = i % GEMM_BM, t = i / GEMM_BM;
                const bool ok = EPI == MEPI_ADD && row0 + r < R && t0 + t < T;
                old[j] = ok ? y[(size_t)(t0 + t) * y_stride + row0 + r] : 0.f;
            }
#pragma unroll
            for (int j = 0; j < BATCH; ++j) {
                const int i = i0 + j * MMA_THREADS, r = i % GEMM_BM, t = i / GEMM_BM;
                if (row0 + r < R && t0 + t < T) {
                    float v = tile[r][t];
                    if (bias) v += bias[row0 + r];
                    y[(size_t)(t0 + t) * y_stride + row0 + r] = EPI == MEPI_ADD ? old[j] + v : v;
                }
            }
        }
    }
}

// The end of a GEMM block: the split exchange (when split), then the tile's sums through shared
// memory at `smem` (over the stages, or wgs's own region), so that the stores go by rows.
// `place(v, row, token)` says where the thread's value v lies in the 128-row × BN-token tile.
template <int EPI, int BN, int VALS, typename Place, int SYNC = 0, typename W>
__device__ __forceinline__ void gemm_finish(void* smem, const float (&acc)[VALS],
                                            float (&sum)[VALS], Place place, float* ws,
                                            int* counters, const SplitUnit& su,
                                            const float* __restrict__ bias,
                                            float* __restrict__ y, int y_stride, int row0, int t0,
                                            int R, int T, W* __restrict__ yh, int yh_wg,
                                            const RopeEpilogue<W>* rope = nullptr) {
    cp_async_wait<0>();
    tile_sync<SYNC>();
    if (su.splits > 1 &&
        !gemm_merge_splits<VALS, SYNC>(ws, counters, su.slot, su.split, su.splits, acc, sum))
        return;
    float(*tile)[BN + 1] = static_cast<float(*)[BN + 1]>(smem);
#pragma unroll
    for (int v = 0; v < VALS; ++v) {
        int r, t;
        place(v, r, t);
        tile[r][t] = sum[v];
    }
    tile_sync<SYNC>();
    gemm_store_tile<EPI, BN>(tile, bias, y, y_stride, row0, t0, R, T, yh, yh_wg, rope);
}

// Group gi's weights for the block's 8 row tiles into stage `a` ([m][h][q][lane], 16 KiB).
template <typename W>
__device__ __forceinline__ void gemm_stage_weights(u32 a, const W* __restrict__ w, int row0, int R,
                                                   int K, int groups, int gi) {
#pragma unroll
    for (int r = 0; r < GEMM_A_BYTES / 16 / MMA_THREADS; ++r) {
        const int i = threadIdx.x + r * MMA_THREADS;
        const int m = i / 128, hq = (i / 32) % 4, lane = i % 32;
#if MMA_TILED
        const bool valid = row0 + 16 * m < R;
        const W* src = w + ((size_t)(row0 / 16 + m) * groups + gi) * 1024 + hq * 256 + lane * 8;
#else
        const int row = row0 + 16 * m + 8 * (hq >> 1) + (lane >> 2);
        const int k = gi * MMA_GROUP + 32 * (hq & 1) + 8 * (lane & 3);
        const bool valid = row < R && k < K;
        const W* src = w + (size_t)row * K + k;
#endif
        cp_async16(a + i * 16, valid ? src : w, valid);
    }
}

// Group gi's prepared inputs of tokens t0 .. t0 + BN - 1 into stage `b` ([n][q][lane]).
template <typename W, int BN>
__device__ __forceinline__ void gemm_stage_inputs(u32 b, const W* __restrict__ xh, int t0, int T,
                                                  int K, int gi) {
#pragma unroll
    for (int r = 0; r < GemmTile<BN>::B_BYTES / 16 / MMA_THREADS; ++r) {
        const int i = threadIdx.x + r * MMA_THREADS;
        const int n = i / 64, q = (i / 32) % 2, lane = i % 32;
        const int t = t0 + 8 * n + (lane >> 2);
        const int k = gi * MMA_GROUP + 32 * q + 8 * (lane & 3);
        const bool valid = t < T && k < K;
        cp_async16(b + i * 16, valid ? xh + (size_t)t * K + k : xh, valid);
    }
}

// Row tile `m`'s A fragments of group stage `a` for mma steps 2q and 2q + 1 (step s = 2q + jj:
// words 2jj, 2jj + 1 of chunk q of rows g and g + 8, as mma_body's a[] of mma j = s).
__device__ __forceinline__ void gemm_a_fragments(u32 a, int m, int lane, int q, u32 (&fa)[2][4]) {
    const uint4 lo = lds128(a + ((m * 4 + q) * 32 + lane) * 16);
    const uint4 hi = lds128(a + ((m * 4 + 2 + q) * 32 + lane) * 16);
    const u32* l = reinterpret_cast<const u32*>(&lo);
    const u32* h = reinterpret_cast<const u32*>(&hi);
#pragma unroll
    for (int jj = 0; jj < 2; ++jj) {
        fa[jj][0] = l[2 * jj];
        fa[jj][1] = h[2 * jj];
        fa[jj][2] = l[2 * jj + 1];
        fa[jj][3] = h[2 * jj + 1];
    }
}

template <typename W, int EPI, int BN>
__device__ __forceinline__ void mma_gemm_body(const W* __restrict__ w, const float* __restrict__ bias,
                                              const W* __restrict__ xh, int K, int R, int T,
                                              float* __restrict__ y, int y_stride, int token_tiles,
                                              float* ws, int* counters, int split_plan,
                                              W* __restrict__ yh, int yh_wg) {
    typedef GemmTile<BN> L;
    constexpr int WN = L::WN;
    constexpr int VALS = 2 * WN * 4;
    extern __shared__ __align__(128) unsigned char gemm_smem[];
#if defined(__CUDA_ARCH__)
    u32 dyn;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn));
    if (dyn < L::SMEM) __trap();  // launched without its shared memory: a host bug
#endif
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wr = warp & 3, wc = warp >> 2;  // the warp's 32 rows and BN / 2 tokens
    const SplitUnit su(split_plan, blockIdx.x);
    const int row0 = (su.tile_id / token_tiles) * GEMM_BM;
    const int t0 = (su.tile_id % token_tiles) * BN;
    const GemmChains ch(su.split, su.splits, K);
    const u32 base = (u32)__cvta_generic_to_shared(gemm_smem);
    auto stage_a = [&](int s) { return base + (u32)(s % GEMM_STAGES) * L::STAGE_BYTES; };
    auto stage_b = [&](int s) { return stage_a(s) + GEMM_A_BYTES; };

    // The first stages' weights do not depend on the previous kernel; the inputs do (to_half).
#pragma unroll
    for (int s = 0; s < GEMM_STAGES - 1; ++s)
        if (s < ch.mine)
            gemm_stage_weights<W>(stage_a(s), w, row0, R, K, ch.groups, ch.group_at(s));
    pdl_enter();
#pragma unroll
    for (int s = 0; s < GEMM_STAGES - 1; ++s) {
        if (s < ch.mine) gemm_stage_inputs<W, BN>(stage_b(s), xh, t0, T, K, ch.group_at(s));
        cp_async_commit();
    }

    // acc[(m * WN + n) * 4 + e]: row tile m of the warp's two, its n-tile n, C element e.
    float acc[VALS], sum[VALS];
    float* first = reinterpret_cast<float*>(gemm_smem + GEMM_STAGES * L::STAGE_BYTES) +
                   warp * (VALS * 32) + lane;
    int p = 0;
    for (int ci = ch.ci0; ci < ch.ci1; ++ci) {
#pragma unroll
        for (int v = 0; v < VALS; ++v) acc[v] = 0.f;
        const int len = gemm_chain_len(gemm_chain(ci), ch.groups);
        for (int j = 0; j < len; ++j, ++p) {
            cp_async_wait<GEMM_STAGES - 2>();
            __syncthreads();
            // Refill the stage every warp finished with (the barrier above) GEMM_STAGES - 1 ahead.
            const int ahead = p + GEMM_STAGES - 1;
            if (ahead < ch.mine) {
                const int gi = ch.group_at(ahead);
                gemm_stage_weights<W>(stage_a(ahead), w, row0, R, K, ch.groups, gi);
                gemm_stage_inputs<W, BN>(stage_b(ahead), xh, t0, T, K, gi);
            }
            cp_async_commit();
            const u32 a = stage_a(p), b = stage_b(p);
#pragma unroll
            for (int q = 0; q < 2; ++q) {
                u32 fa[2][2][4];
#pragma unroll
                for (int m = 0; m < 2; ++m) gemm_a_fragments(a, 2 * wr + m, lane, q, fa[m]);
                uint4 xb[WN];
#pragma unroll
                for (int n = 0; n < WN; ++n)
                    xb[n] = lds128(b + (((WN * wc + n) * 2 + q) * 32 + lane) * 16);
#pragma unroll
                for (int jj = 0; jj < 2; ++jj) {
                    // mma j = 2q + jj: words 2jj, 2jj + 1 of the inputs' chunk q.
#pragma unroll
                    for (int n = 0; n < WN; ++n) {
                        const u32* bw = reinterpret_cast<const u32*>(&xb[n]);
#pragma unroll
                        for (int m = 0; m < 2; ++m)
                            mma_16816(&acc[(m * WN + n) * 4], fa[m][jj], bw[2 * jj],
                                      bw[2 * jj + 1], w);
                    }
                }
            }
        }
        gemm_chain_done(ci, ch.ci0, acc, sum, first, 32);
    }
    const int g = lane >> 2, c = lane & 3;
    auto place = [&](int v, int& r, int& t) {
        const int m = v / (WN * 4), n = (v / 4) % WN, e = v % 4;
        r = 32 * wr + 16 * m + g + 8 * (e >> 1);
        t = 8 * WN * wc + 8 * n + 2 * c + (e & 1);
    };
    gemm_finish<EPI, BN>(gemm_smem, acc, sum, place, ws, counters, su, bias, y, y_stride, row0, t0,
                         R, T, yh, yh_wg);
}

// Compile-time knobs for experiments (NERVA_KERNEL_DEFINES on the GPU machine; the defaults are
// what the host's wg_gemm_shared sizes, and fewer stages fit in what it gives). WG_PROBE is a
// speed probe that gives wrong results: 1 skips staging the weights, 2 the inputs, to see what
// their traffic costs; 3 runs all of a block's groups as one chain, to see what the chain ends
// cost; 4 loads the weights' A fragments from shared memory for the first two groups only, 5
// gives wgmma its A from shared memory (what the fragments' path through registers costs), 6
// leaves out the proxy fence before each group's barrier (what the fence costs), 7 that barrier
// (racing the refills: what the barrier costs).
#ifndef WG_STAGES_WIDE
#define WG_STAGES_WIDE 5
#endif
#ifndef WG_STAGES_192
#define WG_STAGES_192 3
#endif
#ifndef WG_STAGES_144
#define WG_STAGES_144 4
#endif
#ifndef WG_STAGES_NARROW
#define WG_STAGES_NARROW 8
#endif
#ifndef WG_PROBE
#define WG_PROBE 0
#endif
// WG_HALF_TILE: the warp-specialized GEMM (wgs, wgt) runs a unit whose 128-token tile holds at
// most 64 of the launch's tokens (the last one of e.g. 576: 64 decode tokens and a 512-token
// prompt chunk) on m64 x n64 wgmma, half the tensor-core work. The same steps on the same operands
// for every token there is (an n64 step's accumulators are the n128 step's first 32, tokens
// 0-63): the same bits. The choice is made once per unit, and the narrow unit has its own copy of
// the chains and the epilogue: a branch inside the group loop measured 4% slower steps
// (2026-12-07, thirty-seventh session), one per chain spilled 144-184 bytes of the sums. Not in
// the opt-in rope epilogue's kernel, where the second copy spilled 350-850 bytes (q|k|v's
// default launch stores plainly and has it). With it off the kernels' SASS is main's. Measured
// and left off (2026-12-08, thirty-ninth session, H100: bit-identical, but mixed steps of 64
// decode tokens and a 256- or 512-token chunk 1-2% slower, q|k|v at 320 tokens 66 -> 78 us).
#ifndef WG_HALF_TILE
#define WG_HALF_TILE 0
#endif

#if WG_PROBE == 5
// Probe 5's wgmma with both operands from shared memory (bf16 whatever W is: a speed probe).
__device__ __forceinline__ void wgmma_ss_probe(float (&d)[64], u64 a, u64 b) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {" WGMMA_REGS64
                 "}, %64, %65, 1, 1, 1, 0, 0;\n"
                 : WGMMA_ACC64
                 : "l"(a), "l"(b));
}
__device__ __forceinline__ void wgmma_ss_probe(float (&d)[32], u64 a, u64 b) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {" WGMMA_REGS32
                 "}, %32, %33, 1, 1, 1, 0, 0;\n"
                 : WGMMA_ACC32
                 : "l"(a), "l"(b));
}
#endif

// The fixed-order GEMM on Hopper's warpgroup MMA (sm_90a): mma_gemm_body's tile, chains, order,
// splits and epilogue, and its bits (wgmma gives mma.sync's bits step for step: wgmma.cuh), with
// the tensor-core work issued asynchronously per warpgroup. Warp w holds row tile w (its A
// fragments from the staged weights, as mma_gemm_body reads them) and all BN tokens: the two
// warpgroups are 64 rows each, one m64 × BN × k16 wgmma per step. The inputs come prepared by
// to_half in the wgmma order: within each group of 64, step s's logical k 0..15 stored
// together (x̃[16 s + l] = x̂ at mma step s's logical k l), so that a token's group is one
// 128-byte row of the 128-byte-swizzled K-major layout (8 tokens per 1 KiB atom, 16-byte chunk j
// of token t at chunk j ^ (t % 8): the tensor cores read it without bank conflicts, where the
// unswizzled layout measured 56% excess shared-memory wavefronts) and stages with 16-byte copies.
// K must be a multiple of 64 (the host takes mma_gemm_body otherwise).
//
// Pipeline: STAGES stages, group p + AHEAD (= STAGES - 2) staged while group p computes. Group
// p's wgmma stay in flight until the warpgroup has issued group p + 1 (wait_group 1), so each
// warp keeps two sets of A fragments; the stage refilled at group p last held group p - 2, which
// every warpgroup retired before the barrier that precedes the refill. As many stages as fit in
// 225 KiB with the pair-opening chains: 5 on 128-token tiles, 8 on 64-token ones (decode steps,
// where the weights stream from memory and the bytes in flight set the speed). A version with
// bulk copies and per-stage barriers instead of cp.async and __syncthreads measured slower at
// every size (BENCHMARKS.md, 2026-11-26 eighth session).
template <int BN>
struct WgTile {
    static constexpr int VALS = BN / 2;  // accumulators per thread: 16 rows × BN / 32 lanes
    static constexpr int B_BYTES = BN * MMA_GROUP * 2;
    static constexpr int STAGE_BYTES = GEMM_A_BYTES + B_BYTES;
    static constexpr int FIRST_BYTES = MMA_THREADS * VALS * 4;
    // The finished tile ([128][BN + 1] floats). The warp-specialized GEMM writes it over the
    // pair-opening chains (free once the last chain closed its pair), not over the stages, which
    // its producer is already filling with the next tile's groups.
    static constexpr int TILE_BYTES = GEMM_BM * (BN + 1) * 4;
    static constexpr int END_BYTES = FIRST_BYTES > TILE_BYTES ? FIRST_BYTES : TILE_BYTES;
    static constexpr int STAGES = BN == 64    ? WG_STAGES_NARROW
                                  : BN == 192 ? WG_STAGES_192
                                  : BN == 144 ? WG_STAGES_144
                                              : WG_STAGES_WIDE;
    static constexpr int AHEAD = STAGES - 2;
    // Dynamic shared memory of a launch (the host's wg_gemm_shared): 1 KiB more, to align the
    // stages to the swizzle atom.
    static constexpr int SMEM = STAGES * STAGE_BYTES + END_BYTES + 1024;
};

template <int V>
struct IntC {
    static constexpr int value = V;
};

// What one thread copies into every stage of the wgmma GEMM, set up once so that staging a group
// costs a few adds per copy (ncu: address arithmetic and the group lookup were most of the
// instructions, and instruction issue set the speed). THREADS threads stage (the block's 256, or
// the warp-specialized GEMM's producer warpgroup of 128); thread `tid` of them copies:
// weights: its GEMM_A_BYTES / 16 / THREADS 16-byte chunks of the 8 row tiles (as
// gemm_stage_weights lays them out: chunk i = tid + THREADS r at i * 16, row tile i / 128);
// inputs: chunk j = tid % 8 of tokens tid / 8 + (THREADS / 8) r (the 128-byte swizzle:
// (t / 8) * 1024 + (t % 8) * 128 + (j ^ (t % 8)) * 16). Row tiles past R and tokens past T are
// zero-filled: their copies read 0 bytes, so their addresses (past the matrix) are never
// dereferenced.
template <typename W, int BN, int THREADS = MMA_THREADS>
struct WgStager {
    static constexpr int A_CHUNKS = GEMM_A_BYTES / 16 / THREADS;
    static constexpr int B_CHUNKS = WgTile<BN>::B_BYTES / 16 / THREADS;
    static constexpr int TILES_PER_CHUNK = THREADS / 128;  // row tiles from chunk r to r + 1
    static constexpr int TOKENS_PER_CHUNK = THREADS / 8;   // tokens from chunk r to r + 1
    const W* a_src;  // chunk 0 of group 0
    const W* b_src;
    size_t a_step;   // elements from chunk r to r + 1
    size_t b_step;
    int a_group;     // elements from group gi to gi + 1
    u32 a_dst, b_dst;
    unsigned a_ok, b_ok;  // valid chunks, bit r

    __device__ __forceinline__ WgStager(int tid, const W* __restrict__ w,
                                        const W* __restrict__ xh, int row0, int R, int t0, int T,
                                        int K, int groups) {
        a_ok = 0;
        b_ok = 0;
        a_dst = tid * 16;
#if MMA_TILED
        // Tile (row0 / 16 + m), group gi: 1,024 elements at ((row0 / 16 + m) * groups + gi) * 1024.
        a_src = w + ((size_t)(row0 / 16 + tid / 128) * groups) * 1024 + (tid % 128) * 8;
        a_step = (size_t)TILES_PER_CHUNK * groups * 1024;
        a_group = 1024;
#else
        const int hq = (tid / 32) % 4, l = tid % 32;
        a_src = w + (size_t)(row0 + 16 * (tid / 128) + 8 * (hq >> 1) + (l >> 2)) * K +
                32 * (hq & 1) + 8 * (l & 3);
        a_step = (size_t)16 * TILES_PER_CHUNK * K;
        a_group = MMA_GROUP;
#endif
#pragma unroll
        for (int r = 0; r < A_CHUNKS; ++r) {
#if MMA_TILED
            const bool ok = row0 + 16 * (tid / 128 + TILES_PER_CHUNK * r) < R;
#else
            const bool ok = row0 + 16 * (tid / 128 + TILES_PER_CHUNK * r) +
                                8 * (((tid / 32) % 4) >> 1) + ((tid % 32) >> 2) < R;
#endif
            a_ok |= (unsigned)ok << r;
        }
        const int t = tid / 8, j = tid % 8;
        b_src = xh + (size_t)(t0 + t) * K + 8 * j;
        b_step = (size_t)TOKENS_PER_CHUNK * K;
        b_dst = (t >> 3) * 1024 + (t & 7) * 128 + ((j ^ (t & 7)) << 4);
#pragma unroll
        for (int r = 0; r < B_CHUNKS; ++r)
            b_ok |= (unsigned)(t0 + t + TOKENS_PER_CHUNK * r < T) << r;
    }

    // Group gi's weights into the stage at `a`.
    __device__ __forceinline__ void weights(u32 a, int gi) const {
        if (WG_PROBE == 1) return;
        const u32 dst = a + a_dst;
        const W* src = a_src + (size_t)gi * a_group;
#pragma unroll
        for (int r = 0; r < A_CHUNKS; ++r)
            cp_async16(dst + r * THREADS * 16, src + r * a_step, (a_ok >> r) & 1);
    }
    // Group gi's inputs into the stage's input part at `b` (1 KiB aligned).
    __device__ __forceinline__ void inputs(u32 b, int gi) const {
        if (WG_PROBE == 2) return;
        const W* src = b_src + gi * MMA_GROUP;
#pragma unroll
        for (int r = 0; r < B_CHUNKS; ++r)
            cp_async16(b + b_dst + r * THREADS * 16, src + r * b_step, (b_ok >> r) & 1);
    }
};

// The block's groups in chain order, one step at a time (GemmChains::group_at without its loop).
struct GroupCursor {
    int ci, gi;
    __device__ __forceinline__ GroupCursor(const GemmChains& ch) : ci(ch.ci0), gi(gemm_chain(ch.ci0)) {
        settle(ch);
    }
    // Past the end of a chain: the next chain position that holds a group.
    __device__ __forceinline__ void settle(const GemmChains& ch) {
        while (gi >= ch.groups && ++ci < ch.ci1) gi = gemm_chain(ci);
    }
    __device__ __forceinline__ void next(const GemmChains& ch) {
        gi += MMA_WARPS;
        settle(ch);
    }
};

// Where a wgmma GEMM block stands: its tile and chain split, the groups it runs, and its
// dynamic shared memory (checked against what the kernel needs), the stages starting at the first
// 1 KiB boundary (the swizzle atom).
// `unit`: which (tile, chain split) the block runs under the launch's split plan (SplitUnit),
// blockIdx.x unless it walks several (wgs).
template <int BN>
struct WgBlock {
    int lane, warp;
    SplitUnit su;
    int row0, t0;
    GemmChains ch;
    u32 raw, base;
    __device__ __forceinline__ WgBlock(unsigned char* smem, int K, int token_tiles, int split_plan,
                                       int unit)
        : lane(threadIdx.x & 31),
          warp(threadIdx.x >> 5),
          su(split_plan, unit),
          row0((su.tile_id / token_tiles) * GEMM_BM),
          t0((su.tile_id % token_tiles) * BN),
          ch(su.split, su.splits, K) {
        u32 dyn;
        asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn));
        if (dyn < WgTile<BN>::SMEM) __trap();  // launched without its shared memory: a host bug
        raw = (u32)__cvta_generic_to_shared(smem);
        base = (raw + 1023) & ~1023u;
    }
    // Where the thread's accumulator v lies in the 128-row × BN-token tile: n-tile v / 4, C
    // element v % 4 (rows g, g + 8; tokens 2c, 2c + 1) of the warp's 16 rows.
    __device__ __forceinline__ void place(int v, int& r, int& t) const {
        const int g = lane >> 2, c = lane & 3, n = v / 4, e = v % 4;
        r = 16 * warp + g + 8 * (e >> 1);
        t = 8 * n + 2 * c + (e & 1);
    }
};

// One chain of a wgmma GEMM block, `len` groups from group p (advanced past them), from a zero
// accumulator: `group(IntC<set>(), p)` issues group p with fragment set `set` (alternating, so
// group p - 1's wgmma stay in flight); at the chain's end every wgmma retires and `retired(p)`
// hears that the groups before p are done.
// LIVE: the accumulators the groups write (the first LIVE; a half tile's group writes 32).
template <int LIVE, int VALS, typename Group, typename Retired>
__device__ __forceinline__ void wg_chain(int len, int& p, float (&acc)[VALS], u32 (&fa)[2][4][4],
                                         Group group, Retired retired) {
    auto& live = reinterpret_cast<float(&)[LIVE]>(acc);
#pragma unroll
    for (int v = 0; v < LIVE; ++v) live[v] = 0.f;
    int j = 0;
    for (; j + 1 < len; j += 2, p += 2) {
        group(IntC<0>(), p);
        group(IntC<1>(), p + 1);
    }
    if (j < len) group(IntC<0>(), p++);
    wgmma_wait<0>();
    wgmma_hold(live);
    wgmma_hold(fa[0]);
    wgmma_hold(fa[1]);
    retired(p);
}

// A wgmma GEMM block's chains in order (wg_chain), each merged at its end (gemm_chain_done).
// `p`: the block's running group count (advanced past the chains' groups). LIVE as wg_chain's:
// the accumulators and sums past it are neither written nor read.
template <int LIVE, int VALS, typename Group, typename Retired>
__device__ __forceinline__ void wg_chains(const GemmChains& ch, int& p, float (&acc)[VALS],
                                          float (&sum)[VALS], u32 (&fa)[2][4][4], float* first,
                                          Group group, Retired retired) {
    for (int ci = ch.ci0; ci < ch.ci1; ++ci) {
        int len = gemm_chain_len(gemm_chain(ci), ch.groups);
        // Probe 3: every group in one chain (what the chain ends cost).
        if (WG_PROBE == 3) {
            if (ci != ch.ci0) continue;
            len = ch.mine;
        }
        wg_chain<LIVE>(len, p, acc, fa, group, retired);
        gemm_chain_done(ci, ch.ci0, reinterpret_cast<const float(&)[LIVE]>(acc),
                        reinterpret_cast<float(&)[LIVE]>(sum), first, 32);
    }
}

// Group p of wg_gemm_body's pipeline (and wg_stream_body's) with fragment set SET, its stage at
// `use`: wait until its copies landed (and every warp is past group p - 1), `refill()` the stage
// that held group p - 2 with the group AHEAD further on (or nothing) and commit that, then issue
// the group's wgmma. Group p - 1's wgmma stay in flight until these are issued (wait_group 1).
template <typename W, int AHEAD, int SET, int VALS, typename Refill>
__device__ __forceinline__ void wg_group(u32 use, int warp, int lane, int p, float (&acc)[VALS],
                                         u32 (&fa)[2][4][4], Refill refill) {
    cp_async_wait<AHEAD - 1>();
    // The copies into stage p are visible to the tensor cores (the async proxy).
    if (WG_PROBE != 6) asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    if (WG_PROBE != 7) __syncthreads();
    refill();
    cp_async_commit();
    if (WG_PROBE != 4 || p < 2) {
        gemm_a_fragments(use, warp, lane, 0, reinterpret_cast<u32(&)[2][4]>(fa[SET][0]));
        gemm_a_fragments(use, warp, lane, 1, reinterpret_cast<u32(&)[2][4]>(fa[SET][2]));
    }
    wgmma_fence();
    const u32 b = use + GEMM_A_BYTES;
#if WG_PROBE == 5
    // The weights from shared memory as wgmma's own operand (wrong values, the traffic of a
    // 128-byte-swizzled A): what reading A through registers costs.
#pragma unroll
    for (int s = 0; s < 4; ++s)
        wgmma_ss_probe(acc, wgmma_desc_sw128(use + (warp / 4) * 8192 + s * 32),
                       wgmma_desc_sw128(b + s * 32));
#else
#pragma unroll
    for (int s = 0; s < 4; ++s) wgmma_step<W>(acc, fa[SET][s], wgmma_desc_sw128(b + s * 32));
#endif
    wgmma_commit();
    wgmma_hold(acc);
    // Group p - 1 retired: its fragments (the other set) are free again.
    wgmma_wait<1>();
    wgmma_hold(fa[SET ^ 1]);
}

template <typename W, int EPI, int BN>
__device__ __forceinline__ void wg_gemm_body(const W* __restrict__ w, const float* __restrict__ bias,
                                             const W* __restrict__ xh, int K, int R, int T,
                                             float* __restrict__ y, int y_stride, int token_tiles,
                                             float* ws, int* counters, int split_plan,
                                             W* __restrict__ yh, int yh_wg) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    typedef WgTile<BN> L;
    constexpr int VALS = L::VALS, WG_STAGES = L::STAGES, WG_AHEAD = L::AHEAD;
    extern __shared__ __align__(128) unsigned char gemm_smem[];
    const WgBlock<BN> blk(gemm_smem, K, token_tiles, split_plan, blockIdx.x);
    const int lane = blk.lane, warp = blk.warp, row0 = blk.row0, t0 = blk.t0;
    const GemmChains& ch = blk.ch;
    const u32 raw = blk.raw, base = blk.base;
    const u32 last_slot = base + (WG_STAGES - 1) * L::STAGE_BYTES;
    auto advance = [&](u32& slot) { slot = slot == last_slot ? base : slot + L::STAGE_BYTES; };
    const WgStager<W, BN> stager(threadIdx.x, w, xh, row0, R, t0, T, K, ch.groups);
    // The next group to stage and its slot; the slot of the next group to compute.
    GroupCursor ahead(ch);
    u32 fill = base, use = base;

    // The first groups' weights do not depend on the previous kernel, their inputs do (to_half).
    {
        GroupCursor c = ahead;
        u32 slot = base;
#pragma unroll
        for (int s = 0; s < WG_AHEAD; ++s) {
            if (s < ch.mine) {
                stager.weights(slot, c.gi);
                c.next(ch);
            }
            advance(slot);
        }
    }
    pdl_enter();
#pragma unroll
    for (int s = 0; s < WG_AHEAD; ++s) {
        if (s < ch.mine) {
            stager.inputs(fill + GEMM_A_BYTES, ahead.gi);
            ahead.next(ch);
        }
        cp_async_commit();
        advance(fill);
    }

    // acc[4 n + e]: n-tile n (tokens 8n ..), C element e (rows g, g + 8; tokens 2c, 2c + 1).
    float acc[VALS], sum[VALS];
    u32 fa[2][4][4];
    float* first = reinterpret_cast<float*>(gemm_smem + (base - raw) + WG_STAGES * L::STAGE_BYTES) +
                   warp * (VALS * 32) + lane;
    // Group p with fragment set SET.
    auto group = [&](auto set, int p) {
        wg_group<W, WG_AHEAD, decltype(set)::value>(use, warp, lane, p, acc, fa, [&] {
            if (p + WG_AHEAD < ch.mine) {
                stager.weights(fill, ahead.gi);
                stager.inputs(fill + GEMM_A_BYTES, ahead.gi);
                ahead.next(ch);
            }
            advance(fill);
        });
        advance(use);
    };
    int p = 0;
    wg_chains<VALS>(ch, p, acc, sum, fa, first, group, [](int) {});
    auto place = [&](int v, int& r, int& t) { blk.place(v, r, t); };
    gemm_finish<EPI, BN>(gemm_smem, acc, sum, place, ws, counters, blk.su, bias, y, y_stride, row0,
                         t0, R, T, yh, yh_wg);
#else
    __trap();  // sm_90a only: the host selects these kernels on compute capability 9.0 alone
#endif
}

// The persistent ("stream") schedule of a 64-token wgmma GEMM launch of `blocks` blocks over
// `tiles` tiles of 128 rows × 64 tokens: block b takes `per` = tiles / blocks whole tiles, then an
// even share of the chains of the tiles left over (rem0 onwards; unit u is chain position u % 8
// of tile rem0 + u / 8), cut between any two chains. So every SM streams the same number of
// groups give or take one chain, where one block per tile left 1.45 waves of blocks for the 8B's
// gate|up at decode batches (192 tiles on 132 SMs) and a fixed ramp per block.
struct StreamShare {
    int blocks, per, rem0, units, u0, u1;
    __device__ __forceinline__ StreamShare(int tiles, int blocks_, int b) : blocks(blocks_) {
        per = tiles / blocks;
        rem0 = per * blocks;
        units = (tiles - rem0) * MMA_WARPS;
        u0 = (int)((long long)units * b / blocks);
        u1 = (int)((long long)units * (b + 1) / blocks);
    }
    // Some block's share starts at unit u (a cut between positions u - 1 and u of a tile).
    __device__ __forceinline__ bool cut_at(int u) const {
        const long long b = ((long long)u * blocks + units - 1) / units;
        return b < blocks && (long long)units * b / blocks == u;
    }
};

// The pieces of block b's share in order: its whole tiles (positions 0..8), then its run of
// chain units broken at tile ends (positions c0..c1 of one tile).
struct StreamPiece {
    int k, u, tile, c0, c1;
    bool valid;
    __device__ __forceinline__ StreamPiece(const StreamShare& s, int b) : k(0), u(s.u0) { set(s, b); }
    __device__ __forceinline__ void set(const StreamShare& s, int b) {
        valid = true;
        if (k < s.per) {
            tile = b * s.per + k;
            c0 = 0;
            c1 = MMA_WARPS;
        } else if (u < s.u1) {
            tile = s.rem0 + u / MMA_WARPS;
            c0 = u % MMA_WARPS;
            c1 = min(MMA_WARPS, c0 + s.u1 - u);
        } else {
            valid = false;
        }
    }
    __device__ __forceinline__ void advance(const StreamShare& s, int b) {
        if (k < s.per) ++k;
        else u += c1 - c0;
        set(s, b);
    }
    __device__ __forceinline__ bool whole() const { return c0 == 0 && c1 == MMA_WARPS; }
};

// Block b's groups in order across its pieces (GroupCursor over a stream share).
struct StreamGroups {
    StreamPiece pc;
    int ci, gi;
    __device__ __forceinline__ StreamGroups(const StreamShare& s, int b, int groups)
        : pc(s, b), ci(pc.c0), gi(gemm_chain(pc.c0)) {
        settle(s, b, groups);
    }
    __device__ __forceinline__ void settle(const StreamShare& s, int b, int groups) {
        while (pc.valid && gi >= groups) {
            if (++ci >= pc.c1) {
                pc.advance(s, b);
                if (!pc.valid) return;
                ci = pc.c0;
            }
            gi = gemm_chain(ci);
        }
    }
    __device__ __forceinline__ void next(const StreamShare& s, int b, int groups) {
        gi += MMA_WARPS;
        settle(s, b, groups);
    }
};

// Shared memory of wg_stream_body: wg64's stages, then one region that holds the pair-opening
// chains while a piece runs and the finished tile ([128][65] floats) at its end.
struct WgStreamTile {
    typedef WgTile<64> T;
    static constexpr int TILE_BYTES = GEMM_BM * 65 * 4;
    static constexpr int REGION = T::FIRST_BYTES > TILE_BYTES ? T::FIRST_BYTES : TILE_BYTES;
    static constexpr int SMEM = T::STAGES * T::STAGE_BYTES + REGION + 1024;
};

// A chain at position ci of a piece [c0, c1) of a tile shared with other blocks just ended in
// `acc`: a pair that opens and closes in the piece is written whole (w_2i + w_2i+1, at slot 2i),
// a chain whose pair partner lies in another block's piece alone (at its own slot). `slots`:
// this thread's value 0 of slot 0 of the tile's 8 slots ([slot][value][thread]).
template <int VALS>
__device__ __forceinline__ void stream_chain_done(int ci, int c0, int c1, const float (&acc)[VALS],
                                                  float* first, float* slots) {
    const bool opens = (ci & 1) == 0, paired = opens ? ci + 1 < c1 : ci - 1 >= c0;
#pragma unroll
    for (int v = 0; v < VALS; ++v) {
        float& f = first[v * 32];
        if (opens && paired) f = acc[v];
        else if (paired) __stcg(slots + ((ci - 1) * VALS + v) * MMA_THREADS, f + acc[v]);
        else __stcg(slots + (ci * VALS + v) * MMA_THREADS, acc[v]);
    }
}

// A shared tile's piece is written: count its chains in counters[r]; the block that completes
// the 8 resets the counter, reads the slots back and merges them into `sum` as one block would,
// ((p0 + p1) + p2) + p3, each p_i whole from slot 2i or (cut between its chains) w_2i + w_2i+1.
template <int VALS>
__device__ __forceinline__ bool stream_merge(const StreamShare& sh, int r, int chains,
                                             int* counters, const float* slots,
                                             float (&sum)[VALS]) {
    __threadfence();
    __syncthreads();
    __shared__ int last;
    if (threadIdx.x == 0) last = atomicAdd(counters + r, chains) + chains == MMA_WARPS;
    __syncthreads();
    if (!last) return false;
    __threadfence();
    if (threadIdx.x == 0) counters[r] = 0;
    bool cut[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) cut[i] = sh.cut_at(r * MMA_WARPS + 2 * i + 1);
#pragma unroll
    for (int v = 0; v < VALS; ++v) {
        auto at = [&](int z) { return __ldcg(slots + (z * VALS + v) * MMA_THREADS); };
        float pr[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) pr[i] = cut[i] ? at(2 * i) + at(2 * i + 1) : at(2 * i);
        sum[v] = ((pr[0] + pr[1]) + pr[2]) + pr[3];
    }
    return true;
}

// wg64 as a persistent GEMM: gridDim.x blocks (at most one per SM, no more than 8 per tile)
// share the launch's tiles by StreamShare, and each streams its groups through one pipeline from
// piece to piece, so the next piece's first groups are in flight while a piece ends. The same
// tiles, chains, order and arithmetic as wg_gemm_body (the same bits): a whole tile merges its
// chains as one wg64 block does; the pieces of a shared tile leave their pairs or lone chains in
// ws (8 slots of 128 × 64 floats per tile left over, at most blocks - 1 tiles: within the split
// workspace) and the last to finish merges them in the one order. `split_plan` is unused.
template <typename W, int EPI>
__device__ __forceinline__ void wg_stream_body(const W* __restrict__ w,
                                               const float* __restrict__ bias,
                                               const W* __restrict__ xh, int K, int R, int T,
                                               float* __restrict__ y, int y_stride,
                                               int token_tiles, float* ws, int* counters,
                                               W* __restrict__ yh, int yh_wg) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr int BN = 64;
    typedef WgTile<BN> L;
    constexpr int VALS = L::VALS, WG_STAGES = L::STAGES, WG_AHEAD = L::AHEAD;
    extern __shared__ __align__(128) unsigned char gemm_smem[];
    u32 dyn;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn));
    if (dyn < WgStreamTile::SMEM) __trap();  // launched without its shared memory: a host bug
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, b = blockIdx.x;
    const u32 raw = (u32)__cvta_generic_to_shared(gemm_smem), base = (raw + 1023) & ~1023u;
    const u32 last_slot = base + (WG_STAGES - 1) * L::STAGE_BYTES;
    auto advance = [&](u32& slot) { slot = slot == last_slot ? base : slot + L::STAGE_BYTES; };
    const int groups = (K + MMA_GROUP - 1) / MMA_GROUP;
    const int tiles = (R + GEMM_BM - 1) / GEMM_BM * token_tiles;
    const StreamShare share(tiles, gridDim.x, b);
    auto origin = [&](int tile, int& row0, int& t0) {
        row0 = (tile / token_tiles) * GEMM_BM;
        t0 = (tile % token_tiles) * BN;
    };
    // A stager for the tile of `at`'s piece (rebuilt when the piece moves to another tile).
    auto stager_for = [&](const StreamGroups& at) {
        int row0, t0;
        origin(at.pc.tile, row0, t0);
        return WgStager<W, BN>(tid, w, xh, row0, R, t0, T, K, groups);
    };
    StreamGroups ahead(share, b, groups);
    WgStager<W, BN> stager = stager_for(ahead);
    int stager_tile = ahead.pc.tile;
    auto restage = [&]() {
        if (ahead.pc.tile != stager_tile) {
            stager = stager_for(ahead);
            stager_tile = ahead.pc.tile;
        }
    };
    u32 fill = base, use = base;

    // The first groups' weights do not depend on the previous kernel, their inputs do (to_half).
    {
        StreamGroups c = ahead;
        u32 slot = base;
#pragma unroll 1
        for (int s = 0; s < WG_AHEAD && c.pc.valid; ++s) {
            stager_for(c).weights(slot, c.gi);
            c.next(share, b, groups);
            advance(slot);
        }
    }
    pdl_enter();
#pragma unroll
    for (int s = 0; s < WG_AHEAD; ++s) {
        if (ahead.pc.valid) {
            restage();
            stager.inputs(fill + GEMM_A_BYTES, ahead.gi);
            ahead.next(share, b, groups);
        }
        cp_async_commit();
        advance(fill);
    }

    float acc[VALS], sum[VALS];
    u32 fa[2][4][4];
    unsigned char* region = gemm_smem + (base - raw) + WG_STAGES * L::STAGE_BYTES;
    float* first = reinterpret_cast<float*>(region) + warp * (VALS * 32) + lane;
    float(*tile_sums)[BN + 1] = reinterpret_cast<float(*)[BN + 1]>(region);
    auto group = [&](auto set, int p) {
        wg_group<W, WG_AHEAD, decltype(set)::value>(use, warp, lane, p, acc, fa, [&] {
            if (ahead.pc.valid) {
                restage();
                stager.weights(fill, ahead.gi);
                stager.inputs(fill + GEMM_A_BYTES, ahead.gi);
                ahead.next(share, b, groups);
            }
            advance(fill);
        });
        advance(use);
    };
    int p = 0;
    for (StreamPiece pc(share, b); pc.valid; pc.advance(share, b)) {
        const bool whole = pc.whole();
        // A shared tile's slots and counter (tiles from rem0 on).
        const int r = pc.tile - share.rem0;
        float* slots = whole ? nullptr : ws + (size_t)r * MMA_WARPS * VALS * MMA_THREADS + tid;
        for (int ci = pc.c0; ci < pc.c1; ++ci) {
            wg_chain<VALS>(gemm_chain_len(gemm_chain(ci), groups), p, acc, fa, group, [](int) {});
            if (whole) gemm_chain_done(ci, 0, acc, sum, first, 32);
            else stream_chain_done(ci, pc.c0, pc.c1, acc, first, slots);
        }
        if (!whole && !stream_merge(share, r, pc.c1 - pc.c0, counters, slots, sum)) continue;
        int row0, t0;
        origin(pc.tile, row0, t0);
        // Every thread is done with its pair-opening chains before the region holds the tile.
        __syncthreads();
#pragma unroll
        for (int v = 0; v < VALS; ++v) {
            const int g = lane >> 2, c = lane & 3, n = v / 4, e = v % 4;
            tile_sums[16 * warp + g + 8 * (e >> 1)][8 * n + 2 * c + (e & 1)] = sum[v];
        }
        __syncthreads();
        gemm_store_tile<EPI, BN>(tile_sums, bias, y, y_stride, row0, t0, R, T, yh, yh_wg);
        // (A chain of no groups, K < 512, would reach the region without a group's barrier.)
        __syncthreads();
    }
    cp_async_wait<0>();
#else
    __trap();  // sm_90a only: the host selects these kernels on compute capability 9.0 alone
#endif
}

// The wgmma GEMM with its copies in a warpgroup of their own (WGS_THREADS = 384: warps 0-7
// compute as wg_gemm_body's, warps 8-11 stage). Same tiles, chains, order, splits and epilogue:
// the same bits. In wg_gemm_body every warp stages its share of each group between the barrier
// and its wgmma, and all 8 warps meet at a block barrier per group (ncu, 2,048 tokens: tensor
// pipe active 49%, the staging's address arithmetic and that barrier among the top stalls).
// Here the producer warpgroup walks the block's groups through the STAGES slots on its own:
// it waits for slot s to be empty (empty[s]: the 256 computing threads arrive once the wgmma
// that read it have retired), copies, and full[s] completes when its 128 threads' copies have
// landed. The computing warpgroups wait only for full[s], each on its own, so one can merge a
// chain's end while the other keeps the tensor cores busy. The producer gives registers to the
// computing warps (setmaxnreg: 40 and 232 per thread, 64,512 of the 65,536).
//
// TMA (wgt; tiled weights only): one producer thread stages each group with two bulk tensor
// copies instead of 128 threads' 16-byte copies: the weights' 8 row tiles (`wmap`, the tiled
// layout seen as [row tile][8 × groups][128] 16-bit elements, box 8 × 8 × 128: the 16 KiB land
// in gemm_stage_weights's order) and the tokens' group (`xmap`, [T][K], box BN × 64 with the
// 128-byte swizzle, which is the layout wg stages by hand; tokens past T arrive as zeros).
// full[s] completes on the copies' bytes, so the computing warps need no proxy fence: the
// copies write through the async proxy that the tensor cores read.
#define WGS_THREADS 384
template <typename W, int EPI, int BN, bool TMA>
__device__ __forceinline__ void wgs_gemm_body(const W* __restrict__ w,
                                              const float* __restrict__ bias,
                                              const W* __restrict__ xh, int K, int R, int T,
                                              float* __restrict__ y, int y_stride, int token_tiles,
                                              float* ws, int* counters, int split_plan,
                                              W* __restrict__ yh, int yh_wg,
                                              const TmaMap* wmap, const TmaMap* xmap,
                                              const RopeEpilogue<W>* rope = nullptr) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    typedef WgTile<BN> L;
    constexpr int VALS = L::VALS, STAGES = L::STAGES;
    extern __shared__ __align__(128) unsigned char gemm_smem[];
    __shared__ __align__(8) unsigned long long bars[2 * STAGES];  // full[s], then empty[s]
    const int tid = threadIdx.x;
    // The launch's units (tile, chain split), this block's b, b + gridDim.x, ...
    const int units = split_plan_units(split_plan, (R + GEMM_BM - 1) / GEMM_BM * token_tiles);
    auto unit_at = [&](int unit) {
        return WgBlock<BN>(gemm_smem, K, token_tiles, split_plan, unit);
    };
    const WgBlock<BN> blk0 = unit_at(blockIdx.x);
    const u32 raw = blk0.raw, base = blk0.base;
    const u32 full0 = (u32)__cvta_generic_to_shared(bars), empty0 = full0 + 8 * STAGES;
    if (tid == 0) {
#pragma unroll
        for (int s = 0; s < STAGES; ++s) {
            mbar_init(full0 + 8 * s, TMA ? 1 : MMA_THREADS / 2);
            mbar_init(empty0 + 8 * s, MMA_THREADS);
        }
    }
    __syncthreads();

    if (blk0.warp >= MMA_WARPS) {
        // The producer: the block's p-th group (counted across its units) into slot p % STAGES
        // once the computing warps released the slot's previous group (p - STAGES). The first
        // unit's first groups' weights do not depend on the previous kernel, their inputs do
        // (to_half).
        // (wgt192's one producer thread needs no more: its consumers need every register.)
        if (TMA && BN == 192)
            asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n");
        else
            asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
        if constexpr (TMA) {
#if MMA_TILED
            if (tid != MMA_THREADS) return;
            tma_prefetch_map(wmap);
            tma_prefetch_map(xmap);
            // Group gi of the unit at row0, t0: weights / inputs into `slot`, counted in `full`.
            auto weights = [&](u32 slot, u32 full, int row0, int gi) {
                tma_load_3d(slot, wmap, full, 0, 8 * gi, row0 / 16);
            };
            auto inputs = [&](u32 slot, u32 full, int t0, int gi) {
                tma_load_2d(slot + GEMM_A_BYTES, xmap, full, gi * MMA_GROUP, t0);
            };
            int early = 0;  // the first unit's groups whose weights went out before pdl_enter
            for (GroupCursor c(blk0.ch); early < blk0.ch.mine && early < STAGES; ++early) {
                mbar_expect_tx(full0 + 8 * early, GEMM_A_BYTES);
                weights(base + early * L::STAGE_BYTES, full0 + 8 * early, blk0.row0, c.gi);
                c.next(blk0.ch);
            }
            pdl_enter();
            int p = 0;
            for (int unit = blockIdx.x; unit < units; unit += gridDim.x) {
                const WgBlock<BN> blk = unit_at(unit);
                GroupCursor ahead(blk.ch);
                for (int i = 0; i < blk.ch.mine; ++i, ++p) {
                    const int s = p % STAGES;
                    const u32 slot = base + s * L::STAGE_BYTES, full = full0 + 8 * s;
                    if (p < early) {
                        mbar_arrive_expect_tx(full, L::B_BYTES);
                    } else {
                        if (p >= STAGES) mbar_wait(empty0 + 8 * s, ((p / STAGES) & 1) ^ 1);
                        mbar_arrive_expect_tx(full, L::STAGE_BYTES);
                        weights(slot, full, blk.row0, ahead.gi);
                    }
                    inputs(slot, full, blk.t0, ahead.gi);
                    ahead.next(blk.ch);
                }
            }
            return;
#else
            __trap();  // the host runs wgt on tiled weights only
#endif
        } else {
            const int ptid = tid - MMA_THREADS;
            int early = 0;
            {
                const WgStager<W, BN, MMA_THREADS / 2> stager(ptid, w, xh, blk0.row0, R, blk0.t0,
                                                              T, K, blk0.ch.groups);
                for (GroupCursor c(blk0.ch); early < blk0.ch.mine && early < STAGES; ++early) {
                    stager.weights(base + early * L::STAGE_BYTES, c.gi);
                    c.next(blk0.ch);
                }
            }
            pdl_enter();
            int p = 0;
            for (int unit = blockIdx.x; unit < units; unit += gridDim.x) {
                const WgBlock<BN> blk = unit_at(unit);
                const WgStager<W, BN, MMA_THREADS / 2> stager(ptid, w, xh, blk.row0, R, blk.t0, T,
                                                              K, blk.ch.groups);
                GroupCursor ahead(blk.ch);
                for (int i = 0; i < blk.ch.mine; ++i, ++p) {
                    const int s = p % STAGES;
                    const u32 slot = base + s * L::STAGE_BYTES;
                    if (p >= early) {
                        if (p >= STAGES) mbar_wait(empty0 + 8 * s, ((p / STAGES) & 1) ^ 1);
                        stager.weights(slot, ahead.gi);
                    }
                    stager.inputs(slot + GEMM_A_BYTES, ahead.gi);
                    mbar_arrive_cp_async(full0 + 8 * s);
                    ahead.next(blk.ch);
                }
            }
        }
        return;
    }

    if (TMA && BN == 192)
        asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n");
    else
        asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
    pdl_enter();
    const int lane = blk0.lane, warp = blk0.warp;
    // acc[4 n + e]: n-tile n (tokens 8n ..), C element e (rows g, g + 8; tokens 2c, 2c + 1).
    float acc[VALS], sum[VALS];
    u32 fa[2][4][4];
    // The pair-opening chains and, once a unit's last chain closed its pair, the finished tile.
    unsigned char* end = gemm_smem + (base - raw) + STAGES * L::STAGE_BYTES;
    float* first = reinterpret_cast<float*>(end) + warp * (VALS * 32) + lane;
    // The block's groups so far (across its units); those before `released` have been given
    // back to the producer.
    int p = 0, released = 0;
    auto release = [&](int upto) {
        for (; released < upto; ++released) mbar_arrive(empty0 + 8 * (released % STAGES));
    };
    // Group p with fragment set SET, on the tile's BN tokens or (NARROW) its first 64.
    auto group_as = [&](auto narrow, auto set, int p) {
        constexpr int SET = decltype(set)::value;
        const int s = p % STAGES;
        const u32 slot = base + s * L::STAGE_BYTES;
        mbar_wait(full0 + 8 * s, (p / STAGES) & 1);
        // The copies into the slot are visible to the tensor cores (the async proxy).
        if (!TMA) asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        gemm_a_fragments(slot, warp, lane, 0, reinterpret_cast<u32(&)[2][4]>(fa[SET][0]));
        gemm_a_fragments(slot, warp, lane, 1, reinterpret_cast<u32(&)[2][4]>(fa[SET][2]));
        wgmma_fence();
        const u32 b = slot + GEMM_A_BYTES;
        auto& live = reinterpret_cast<float(&)[decltype(narrow)::value ? 32 : VALS]>(acc);
#pragma unroll
        for (int k = 0; k < 4; ++k) wgmma_step<W>(live, fa[SET][k], wgmma_desc_sw128(b + k * 32));
        wgmma_commit();
        wgmma_hold(live);
        // Group p - 1 retired: its fragments (the other set) and its slot are free again. (A
        // third set, wait_group 2, makes ptxas serialize the wgmma.)
        wgmma_wait<1>();
        wgmma_hold(fa[SET ^ 1]);
        release(p);
    };
    // The unit's chains on its tile's BN tokens or (NARROW) its first 64.
    auto chains = [&](auto narrow, const WgBlock<BN>& blk) {
        constexpr bool NARROW = decltype(narrow)::value;
        if constexpr (NARROW) {
            // Tokens 64 on are never stored; zeros (rather than the unit before's values) keep
            // them out of the registers and any split's exchange well defined.
#pragma unroll
            for (int v = 32; v < VALS; ++v) acc[v] = sum[v] = 0.f;
        }
        auto group = [&](auto set, int p) { group_as(narrow, set, p); };
        wg_chains<NARROW ? 32 : VALS>(blk.ch, p, acc, sum, fa, first, group, release);
    };
    auto finish = [&](const WgBlock<BN>& blk) {
        auto place = [&](int v, int& r, int& t) { blk.place(v, r, t); };
        gemm_finish<EPI, BN, VALS, decltype(place), 1>(end, acc, sum, place, ws, counters, blk.su,
                                                       bias, y, y_stride, blk.row0, blk.t0, R, T,
                                                       yh, yh_wg, rope);
    };
    for (int unit = blockIdx.x; unit < units; unit += gridDim.x) {
        const WgBlock<BN> blk = unit_at(unit);
        if constexpr (EPI == MEPI_ROPE || WG_HALF_TILE || (BN == 192 && EPI == MEPI_ADD)) {
            // No value of the unit before is used here (each unit's chains set sum before they
            // read it, and each group its fragments), but ptxas cannot see it: it would keep
            // them live through the rope epilogue, which needs the registers (it spilled 324
            // bytes), through the half tiles' second copy of the unit, and through the residual
            // adds of the 192-token tiles (356 bytes spilled, 172 so; the other epilogues of
            // those spill 144 without this, 172 with it).
#pragma unroll
            for (int v = 0; v < VALS; ++v) sum[v] = 0.f;
#pragma unroll
            for (int i = 0; i < 2; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j)
#pragma unroll
                    for (int k = 0; k < 4; ++k) fa[i][j][k] = 0;
        }
        const bool narrow =
            BN == 128 && WG_HALF_TILE && EPI != MEPI_ROPE && T - blk.t0 <= BN / 2;
        if (narrow) {
            chains(IntC<1>(), blk);
            finish(blk);
        } else {
            chains(IntC<0>(), blk);
            finish(blk);
        }
        // Every thread is done reading the tile before the next unit's first chain end
        // overwrites it.
        tile_sync<1>();
    }
#else
    __trap();  // sm_90a only: the host selects these kernels on compute capability 9.0 alone
#endif
}

// The GEMM variants of a family: the projection's parameter list (x, x_stride, x_rows, norm_w
// and eps unused: the inputs come prepared), then the chain-split workspace and the split plan
// (SplitUnit: tiles of 128 rows × BN tokens, token_tiles per row block, adjacent, the first
// `whole` in one block each, each later one in S adjacent blocks, its splits),
// GemmTile<BN>::SMEM (wg: WgTile<BN>::SMEM) bytes of dynamic shared memory; with S > 1, ws holds
// (tiles - whole) × S × 128 × BN floats and counters one zero int per split tile.
// gemm / gemm64: mma.sync, 128- or 64-token tiles; wg / wg64: the same on wgmma (sm_90a, inputs
// in the wgmma order, K a multiple of 64); wgs: wg's 128-token tiles warp-specialized
// (WGS_THREADS threads); wgt: the warp-specialized GEMM staged by tensor copies (tiled
// weights).
#define MMA_GEMM_PARAMS(W)                                                                  \
    const W *__restrict__ w, const float *__restrict__ bias, const float *__restrict__ x,     \
        int x_stride, const W *__restrict__ xh, const int *__restrict__ x_rows,               \
        const float *__restrict__ norm_w, float eps, int K, int R, int T,                     \
        float *__restrict__ y, int y_stride, int token_tiles, W *__restrict__ yh, int yh_wg,  \
        float *ws, int *counters, int split_plan
#define MMA_GEMM_ENTRY(NAME, BODY, W, EPI, BN, THREADS)                                        \
    extern "C" __global__ void __launch_bounds__(THREADS, 1) NAME(MMA_GEMM_PARAMS(W)) {         \
        BODY<W, EPI, BN>(w, bias, xh, K, R, T, y, y_stride, token_tiles, ws, counters,          \
                         split_plan, yh, yh_wg);                                               \
    }
// The warp-specialized GEMM: wgs staging by cp.async, wgt by tensor copies (`wmap`, `xmap`
// after the GEMM's parameters).
#define MMA_WGS_ENTRY(NAME, W, EPI)                                                            \
    extern "C" __global__ void __launch_bounds__(WGS_THREADS, 1) NAME(MMA_GEMM_PARAMS(W)) {     \
        wgs_gemm_body<W, EPI, 128, false>(w, bias, xh, K, R, T, y, y_stride, token_tiles, ws,  \
                                          counters, split_plan, yh, yh_wg, nullptr, nullptr);  \
    }
// The persistent 64-token wgmma GEMM (wg_stream_body), blocks sharing the launch's tiles.
#define MMA_WG_STREAM_ENTRY(NAME, W, EPI)                                                      \
    extern "C" __global__ void __launch_bounds__(MMA_THREADS, 1) NAME(MMA_GEMM_PARAMS(W)) {     \
        (void)split_plan;                                                                      \
        wg_stream_body<W, EPI>(w, bias, xh, K, R, T, y, y_stride, token_tiles, ws, counters,   \
                               yh, yh_wg);                                                     \
    }
// wgt on BN-token tiles: 128; 192 (`wgt192`): m64 x n192 wgmma, 96 accumulators and 96 sums
// per thread (the consumer warpgroups take 240 registers, the one-thread producer 24), 3 stages
// of 40 KiB (the pair-opening chains' 96 KiB take the rest), per multiply a third fewer weight
// bytes staged and A fragments loaded than on 128-token tiles; or 144 (`wgt144`): 72 and 72
// per thread, 4 stages of 34 KiB, a ninth fewer. Same chains, order and epilogue: the same
// bits, as each token's sums are wgmma steps of the same operands whatever the step's N (the
// GPU bit-identity test runs both: passed on an H100, 2026-12-08). The host prices the three
// widths per launch (launch_shape.rs, `mma_launch`).
#define MMA_WGT_ENTRY(NAME, W, EPI, BN)                                                    \
    extern "C" __global__ void __launch_bounds__(WGS_THREADS, 1)                               \
        NAME(MMA_GEMM_PARAMS(W), const __grid_constant__ TmaMap wmap,                         \
             const __grid_constant__ TmaMap xmap) {                                            \
        wgs_gemm_body<W, EPI, BN, true>(w, bias, xh, K, R, T, y, y_stride, token_tiles, ws,    \
                                        counters, split_plan, yh, yh_wg, &wmap, &xmap);        \
    }

// The q|k|v projection's wgt with the ROPE epilogue (its step after the maps, by value; KV is
// W, the pool's type). Only its head dims (64, 128) are served: for others the host runs
// rope_append after the plain wgt.
#define MMA_WGT_ROPE_ENTRY(NAME, W)                                                            \
    extern "C" __global__ void __launch_bounds__(WGS_THREADS, 1)                               \
        NAME(MMA_GEMM_PARAMS(W), const __grid_constant__ TmaMap wmap,                         \
             const __grid_constant__ TmaMap xmap,                                              \
             const __grid_constant__ RopeEpilogue<W> rope) {                                   \
        wgs_gemm_body<W, MEPI_ROPE, 128, true>(w, bias, xh, K, R, T, y, y_stride, token_tiles, \
                                               ws, counters, split_plan, yh, yh_wg, &wmap,     \
                                               &xmap, &rope);                                  \
    }

#define MMA_ENTRY(NAME, W, NT, MT, IN, EPI, DEEP, SPLIT, RING, PERSIST)                        \
    extern "C" __global__ void __launch_bounds__(MMA_THREADS, MMA_MIN_BLOCKS(NT, MT, DEEP))   \
        NAME(const W* __restrict__ w, const float* __restrict__ bias,                         \
             const float* __restrict__ x, int x_stride, const W* __restrict__ xh,             \
             const int* __restrict__ x_rows, const float* __restrict__ norm_w, float eps,     \
             int K, int R, int T, float* __restrict__ y, int y_stride, int token_tiles,       \
             W* __restrict__ yh, int yh_wg, double* __restrict__ ssq) {                        \
        mma_body<W, NT, MT, IN, EPI, DEEP, SPLIT, RING, PERSIST>(                              \
            w, bias, x, x_stride, xh, x_rows, norm_w, eps, K, R, T, y, y_stride, token_tiles, yh,  \
            yh_wg, ssq);                                                                       \
    }

// Per dtype and epilogue: the in-kernel norm/rounding for one n-tile (1-8 tokens, 16-row tiles:
// all SMs busy at batch 1); inputs prepared by to_half for 2 and 4 n-tiles, and 8 n-tiles with
// two 16-row tiles per warp (past 32 tokens, in passes of 64: half the blocks re-read x̂). A
// 16-n-tile variant (128 tokens per pass) measured slower than two passes of this one
// (BENCHMARKS.md, 2026-11-23 third session). n1d: n1 with deeper prefetch (MMA_DEEP_DEPTH);
// n1h: one n-tile with inputs prepared by to_half (3–8 tokens: the in-kernel norm and rounding
// of 8 f32 rows per group cost more than the prepare launch; KernelTuning); n2s, n4s, n8m2s: the
// multi-tile variants taking token tiles from the launch (KernelTuning); n1r, n1dr, n1hr: n1,
// n1d, n1h streaming their weights through the ring in shared memory (MMA_RING); n1p, n1hp: n1,
// n1h persistent, each block walking row tiles with its weight loads running on from one tile
// into the next (mma_body's PERSIST; KernelTuning::n1_persistent).
#define MMA_FAMILY(MODE, IN1, EPI, DT, W)                                               \
    MMA_ENTRY(mma_##MODE##_##DT##_n1, W, 1, 1, IN1, EPI, 0, 0, 0, 0)                    \
    MMA_ENTRY(mma_##MODE##_##DT##_n2, W, 2, 1, MIN_HALF, EPI, 0, 0, 0, 0)               \
    MMA_ENTRY(mma_##MODE##_##DT##_n4, W, 4, 1, MIN_HALF, EPI, 0, 0, 0, 0)               \
    MMA_ENTRY(mma_##MODE##_##DT##_n8m2, W, 8, 2, MIN_HALF, EPI, 0, 0, 0, 0)             \
    MMA_ENTRY(mma_##MODE##_##DT##_n1d, W, 1, 1, IN1, EPI, 1, 0, 0, 0)                   \
    MMA_ENTRY(mma_##MODE##_##DT##_n1h, W, 1, 1, MIN_HALF, EPI, 0, 0, 0, 0)              \
    MMA_ENTRY(mma_##MODE##_##DT##_n2s, W, 2, 1, MIN_HALF, EPI, 0, 1, 0, 0)              \
    MMA_ENTRY(mma_##MODE##_##DT##_n4s, W, 4, 1, MIN_HALF, EPI, 0, 1, 0, 0)              \
    MMA_ENTRY(mma_##MODE##_##DT##_n8m2s, W, 8, 2, MIN_HALF, EPI, 0, 1, 0, 0)            \
    MMA_ENTRY(mma_##MODE##_##DT##_n1r, W, 1, 1, IN1, EPI, 0, 0, MMA_RING, 0)            \
    MMA_ENTRY(mma_##MODE##_##DT##_n1dr, W, 1, 1, IN1, EPI, 1, 0, MMA_RING_DEEP, 0)      \
    MMA_ENTRY(mma_##MODE##_##DT##_n1hr, W, 1, 1, MIN_HALF, EPI, 0, 0, MMA_RING, 0)      \
    MMA_ENTRY(mma_##MODE##_##DT##_n1p, W, 1, 1, IN1, EPI, 0, 0, 0, 1)                   \
    MMA_ENTRY(mma_##MODE##_##DT##_n1hp, W, 1, 1, MIN_HALF, EPI, 0, 0, 0, 1)             \
    MMA_GEMM_ENTRY(mma_##MODE##_##DT##_gemm, mma_gemm_body, W, EPI, 128, MMA_THREADS)   \
    MMA_GEMM_ENTRY(mma_##MODE##_##DT##_gemm64, mma_gemm_body, W, EPI, 64, MMA_THREADS)  \
    MMA_GEMM_ENTRY(mma_##MODE##_##DT##_wg, wg_gemm_body, W, EPI, 128, MMA_THREADS)      \
    MMA_GEMM_ENTRY(mma_##MODE##_##DT##_wg64, wg_gemm_body, W, EPI, 64, MMA_THREADS)     \
    MMA_WGS_ENTRY(mma_##MODE##_##DT##_wgs, W, EPI)                                      \
    MMA_WGT_ENTRY(mma_##MODE##_##DT##_wgt, W, EPI, 128)                                 \
    MMA_WGT_ENTRY(mma_##MODE##_##DT##_wgt192, W, EPI, 192)                              \
    MMA_WGT_ENTRY(mma_##MODE##_##DT##_wgt144, W, EPI, 144)                              \
    MMA_WG_STREAM_ENTRY(mma_##MODE##_##DT##_wg64s, W, EPI)

#define MMA_DTYPE(DT, W)                                  \
    MMA_FAMILY(rms, MIN_RMS, MEPI_STORE, DT, W)           \
    MMA_FAMILY(plain_add, MIN_PLAIN, MEPI_ADD, DT, W)     \
    MMA_FAMILY(glu, MIN_RMS, MEPI_GLU, DT, W)             \
    MMA_WGT_ROPE_ENTRY(mma_rope_##DT##_wgt, W)

MMA_DTYPE(bf16, __nv_bfloat16)
MMA_DTYPE(f16, __half)

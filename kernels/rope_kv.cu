// After the fused q|k|v projection of a step with prefill tokens: per-head QK-norm (Qwen3),
// rotary embedding, the rotated queries to q_out, and k, v appended to the paged KV pool at each
// token's position, all before attention runs (a prefill token attends to the step's earlier
// tokens). Decode-only steps do this inside attn_decode instead.
//
// One warp per head: block (x, y) of ROPE_WARPS warps takes heads ROPE_WARPS y .. (q heads,
// then k, then v) of tokens ROPE_TOKENS x .., so every warp of a block has one head and small
// blocks keep many warps per SM (ncu, 1,024 tokens of qwen3-8b on the H200: one block of 1,024
// threads per token looping over 48 heads took 40 us at 16% of DRAM, its warps waiting on one
// dependent load after another). The positions, their pages, cos and sin and the norm weights
// are loaded before the programmatic wait, so after it a warp waits for one round trip (its
// heads' values).
#include "common.cuh"
#include "kv.cuh"
#include "rope.cuh"

#define ROPE_WARPS 8
// Tokens per warp: the warp takes its head of ROPE_TOKENS adjacent tokens, every load of both
// in flight together and their arithmetic side by side (one token's head alone left the warp
// waiting on one chain of dependent steps).
#define ROPE_TOKENS 2

// Where token t's head h goes: its rows in the projection and its destinations.
struct RopeHead : RopeTarget {
    const float* src;  // the head's D projected values
};

template <typename KV>
__device__ __forceinline__ RopeHead rope_head_at(StepMeta meta, const float* __restrict__ qkv,
                                                 float* __restrict__ q_out, KV* __restrict__ kv,
                                                 const int* __restrict__ tables, KvGeometry geo,
                                                 int heads, int kv_heads, int head_dim,
                                                 const float* __restrict__ cos_t,
                                                 const float* __restrict__ sin_t, int t, int h) {
    const int q_dim = heads * head_dim, kv_dim = kv_heads * head_dim;
    RopeHead r;
    static_cast<RopeTarget&>(r) = rope_target(meta, t, t, h, q_out, kv, tables, geo, heads,
                                              kv_heads, head_dim, cos_t, sin_t);
    r.src = qkv + (size_t)t * (q_dim + 2 * kv_dim) + h * head_dim;
    return r;
}

// One q or k head of ROPE_TOKENS tokens through rope_head's fast path, held to NJ = head_dim /
// 64 elements per lane and half: the table's operands before the programmatic wait, the heads'
// values after it, each token's arithmetic rope_apply's.
template <typename KV, int NJ>
__device__ __forceinline__ void rope_append_fast(const RopeHead (&hd)[ROPE_TOKENS],
                                                 const float* __restrict__ nw, float eps,
                                                 int head_dim, int lane) {
    RopeLane<NJ> r[ROPE_TOKENS];
#pragma unroll
    for (int i = 0; i < ROPE_TOKENS; ++i)
        rope_load_table(r[i], nw, hd[i].cs, hd[i].sn, head_dim, lane);
    pdl_enter();
#pragma unroll
    for (int i = 0; i < ROPE_TOKENS; ++i) rope_load_head(r[i], hd[i].src, head_dim, lane);
#pragma unroll
    for (int i = 0; i < ROPE_TOKENS; ++i)
        rope_apply<KV>(r[i], nw, eps, head_dim, lane, hd[i].q_dst, static_cast<KV*>(hd[i].pool));
}

template <typename KV>
__device__ __forceinline__ void rope_append_body(
    StepMeta meta, const float* __restrict__ qkv, float* __restrict__ q_out, KV* __restrict__ kv,
    const int* __restrict__ tables, KvGeometry geo, int heads, int kv_heads, int head_dim,
    const float* __restrict__ q_norm, const float* __restrict__ k_norm, float eps,
    const float* __restrict__ cos_t, const float* __restrict__ sin_t) {
    const int t0 = blockIdx.x * ROPE_TOKENS, lane = threadIdx.x & 31;
    const int h = blockIdx.y * ROPE_WARPS + (threadIdx.x >> 5);
    // Before the wait: only the step's metadata, block tables and tables of constants.
    const int n = meta.counts[0];
    if (t0 >= n || h >= heads + 2 * kv_heads) return;
    // Past the step's last token the warp does that token again: the same values to the same
    // places, and no branch between the tokens' work.
    RopeHead hd[ROPE_TOKENS];
#pragma unroll
    for (int i = 0; i < ROPE_TOKENS; ++i)
        hd[i] = rope_head_at(meta, qkv, q_out, kv, tables, geo, heads, kv_heads, head_dim, cos_t,
                             sin_t, min(t0 + i, n - 1), h);
    if (h >= heads + kv_heads) {
        pdl_enter();
#pragma unroll
        for (int i = 0; i < ROPE_TOKENS; ++i)
            copy_head_wide<KV>(hd[i].src, head_dim, lane, static_cast<KV*>(hd[i].pool));
        return;
    }
    const float* nw = h < heads ? q_norm : k_norm;
    if (head_dim == 64) {
        rope_append_fast<KV, 1>(hd, nw, eps, head_dim, lane);
    } else if (head_dim == 128) {
        rope_append_fast<KV, 2>(hd, nw, eps, head_dim, lane);
    } else if (head_dim == 256) {
        rope_append_fast<KV, 4>(hd, nw, eps, head_dim, lane);
    } else {
        pdl_enter();
#pragma unroll
        for (int i = 0; i < ROPE_TOKENS; ++i)
            rope_head_general<KV>(hd[i].src, nw, eps, hd[i].cs, hd[i].sn, head_dim, lane,
                                  hd[i].q_dst, static_cast<KV*>(hd[i].pool));
    }
}

#define ROPE_ENTRY(DT, KV)                                                                    \
    extern "C" __global__ void __launch_bounds__(32 * ROPE_WARPS) rope_append_##DT(       \
        StepMeta meta, const float* qkv, float* q_out, KV* kv, const int* tables,              \
        KvGeometry geo, int heads, int kv_heads, int head_dim, const float* q_norm,            \
        const float* k_norm, float eps, const float* cos_t, const float* sin_t) {              \
        rope_append_body(meta, qkv, q_out, kv, tables, geo, heads, kv_heads, head_dim, q_norm, \
                         k_norm, eps, cos_t, sin_t);                                           \
    }

ROPE_ENTRY(bf16, __nv_bfloat16)
ROPE_ENTRY(f16, __half)

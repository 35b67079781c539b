// After the fused q|k|v projection of a step with prefill tokens: per-head QK-norm (Qwen3),
// rotary embedding, the rotated queries to q_out, and k, v appended to the paged KV pool at each
// token's position, all before attention runs (a prefill token attends to the step's earlier
// tokens). Decode-only steps do this inside attn_decode instead.
//
// One warp per head: block (t, y) of ROPE_WARPS warps takes token t's heads ROPE_WARPS y ..
// (q heads, then k, then v), so every warp of a block has one head and small blocks keep many
// warps per SM (ncu, 1,024 tokens of qwen3-8b on the H200: one block of 1,024 threads per token
// looping over 48 heads took 40 us at 16% of DRAM, its warps waiting on one dependent load
// after another). The position, its page, cos and sin and the norm weights are loaded before
// the programmatic wait, so after it a warp waits for one round trip (its head's values).
#include "common.cuh"
#include "kv.cuh"
#include "rope.cuh"

#define ROPE_WARPS 8

// One q or k head through rope_head's fast path, held to NJ = head_dim / 64 elements per lane
// and half (fewer registers, more warps per SM): the table's operands before the programmatic
// wait, the head's values after it.
template <typename KV, int NJ>
__device__ __forceinline__ void rope_append_fast(const float* __restrict__ src,
                                                 const float* __restrict__ nw, float eps,
                                                 const float* __restrict__ cs,
                                                 const float* __restrict__ sn, int head_dim,
                                                 int lane, float* __restrict__ q_dst,
                                                 KV* __restrict__ k_dst) {
    RopeLane<NJ> r;
    rope_load_table(r, nw, cs, sn, head_dim, lane);
    pdl_enter();
    rope_load_head(r, src, head_dim, lane);
    rope_apply<KV>(r, nw, eps, head_dim, lane, q_dst, k_dst);
}

template <typename KV>
__device__ __forceinline__ void rope_append_body(
    StepMeta meta, const float* __restrict__ qkv, float* __restrict__ q_out, KV* __restrict__ kv,
    const int* __restrict__ tables, KvGeometry geo, int heads, int kv_heads, int head_dim,
    const float* __restrict__ q_norm, const float* __restrict__ k_norm, float eps,
    const float* __restrict__ cos_t, const float* __restrict__ sin_t) {
    const int t = blockIdx.x, lane = threadIdx.x & 31;
    const int h = blockIdx.y * ROPE_WARPS + (threadIdx.x >> 5);
    // Before the wait: only the step's metadata, block tables and tables of constants.
    if (t >= meta.counts[0] || h >= heads + 2 * kv_heads) return;
    const int q_dim = heads * head_dim, kv_dim = kv_heads * head_dim;
    const int pos = meta.position[t];
    const float* row = qkv + (size_t)t * (q_dim + 2 * kv_dim);
    KV* pool = nullptr;
    if (h >= heads) {
        const int page = tables[(size_t)meta.token_slot[t] * geo.max_pages + pos / geo.page_tokens];
        const int kind = h < heads + kv_heads ? 0 : 1;
        pool = kv + kv_offset(geo, page, kind, pos) + (h - heads - kind * kv_heads) * head_dim;
    }
    if (h >= heads + kv_heads) {
        pdl_enter();
        copy_head_wide<KV>(row + q_dim + (h - heads) * head_dim, head_dim, lane, pool);
        return;
    }
    const bool is_q = h < heads;
    const float* src = is_q ? row + h * head_dim : row + q_dim + (h - heads) * head_dim;
    const float* nw = is_q ? q_norm : k_norm;
    float* q_dst = is_q ? q_out + (size_t)t * q_dim + h * head_dim : nullptr;
    const float* cs = cos_t + (size_t)pos * (head_dim / 2);
    const float* sn = sin_t + (size_t)pos * (head_dim / 2);
    if (head_dim == 64) {
        rope_append_fast<KV, 1>(src, nw, eps, cs, sn, head_dim, lane, q_dst, pool);
    } else if (head_dim == 128) {
        rope_append_fast<KV, 2>(src, nw, eps, cs, sn, head_dim, lane, q_dst, pool);
    } else if (head_dim == 256) {
        rope_append_fast<KV, 4>(src, nw, eps, cs, sn, head_dim, lane, q_dst, pool);
    } else {
        pdl_enter();
        rope_head_general<KV>(src, nw, eps, cs, sn, head_dim, lane, q_dst, pool);
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

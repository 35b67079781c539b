// After the fused q|k|v projection of a step with prefill tokens: per-head QK-norm (Qwen3),
// rotary embedding, the rotated queries to q_out, and k, v appended to the paged KV pool at each
// token's position, all before attention runs (a prefill token attends to the step's earlier
// tokens). Decode-only steps do this inside attn_decode instead. One block per token, one warp
// per head.
#include "common.cuh"
#include "kv.cuh"
#include "rope.cuh"

template <typename KV>
__device__ __forceinline__ void rope_append_body(
    StepMeta meta, const float* __restrict__ qkv, float* __restrict__ q_out, KV* __restrict__ kv,
    const int* __restrict__ tables, KvGeometry geo, int heads, int kv_heads, int head_dim,
    const float* __restrict__ q_norm, const float* __restrict__ k_norm, float eps,
    const float* __restrict__ cos_t, const float* __restrict__ sin_t) {
    pdl_enter();
    const int t = blockIdx.x;
    if (t >= meta.counts[0]) return;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    const int q_dim = heads * head_dim, kv_dim = kv_heads * head_dim;
    const int pos = meta.position[t];
    const int slot = meta.token_slot[t];
    const int page = tables[(size_t)slot * geo.max_pages + pos / geo.page_tokens];
    const float* row = qkv + (size_t)t * (q_dim + 2 * kv_dim);
    const float* cs = cos_t + (size_t)pos * (head_dim / 2);
    const float* sn = sin_t + (size_t)pos * (head_dim / 2);

    for (int h = warp; h < heads + 2 * kv_heads; h += warps) {
        if (h < heads) {
            rope_head<KV>(row + h * head_dim, q_norm, eps, cs, sn, head_dim, lane,
                          q_out + (size_t)t * q_dim + h * head_dim, nullptr);
        } else if (h < heads + kv_heads) {
            const int kh = h - heads;
            rope_head<KV>(row + q_dim + kh * head_dim, k_norm, eps, cs, sn, head_dim, lane,
                          nullptr, kv + kv_offset(geo, page, 0, pos) + kh * head_dim);
        } else {
            const int vh = h - heads - kv_heads;
            copy_head<KV>(row + q_dim + kv_dim + vh * head_dim, head_dim, lane,
                          kv + kv_offset(geo, page, 1, pos) + vh * head_dim);
        }
    }
}

#define ROPE_ENTRY(DT, KV)                                                                    \
    extern "C" __global__ void __launch_bounds__(1024) rope_append_##DT(                      \
        StepMeta meta, const float* qkv, float* q_out, KV* kv, const int* tables,              \
        KvGeometry geo, int heads, int kv_heads, int head_dim, const float* q_norm,            \
        const float* k_norm, float eps, const float* cos_t, const float* sin_t) {              \
        rope_append_body(meta, qkv, q_out, kv, tables, geo, heads, kv_heads, head_dim, q_norm, \
                         k_norm, eps, cos_t, sin_t);                                           \
    }

ROPE_ENTRY(bf16, __nv_bfloat16)
ROPE_ENTRY(f16, __half)

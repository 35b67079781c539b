// After the fused q|k|v projection of a step: per-head QK-norm (Qwen3), rotary embedding, the
// rotated queries to q_out, and k, v appended to the paged KV pool at each token's position.
// One block per token, one warp per head; rotate_half pairs (i, i + D/2) as transformers does,
// with the same f32 cos/sin table as the CPU reference.
#include "common.cuh"
#include "norm.cuh"
#include "kv.cuh"

template <typename KV>
__device__ __forceinline__ void rope_append_body(
    StepMeta meta, const float* __restrict__ qkv, float* __restrict__ q_out, KV* __restrict__ kv,
    const int* __restrict__ tables, KvGeometry geo, int heads, int kv_heads, int head_dim,
    const float* __restrict__ q_norm, const float* __restrict__ k_norm, float eps,
    const float* __restrict__ cos_t, const float* __restrict__ sin_t) {
    const int t = blockIdx.x;
    if (t >= meta.counts[0]) return;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    const int q_dim = heads * head_dim, kv_dim = kv_heads * head_dim;
    const int half = head_dim / 2;
    const int pos = meta.position[t];
    const int slot = meta.seq_slot[meta.token_seq[t]];
    const int page = tables[(size_t)slot * geo.max_pages + pos / geo.page_tokens];
    const float* row = qkv + (size_t)t * (q_dim + 2 * kv_dim);
    const float* cs = cos_t + (size_t)pos * half;
    const float* sn = sin_t + (size_t)pos * half;

    for (int h = warp; h < heads + 2 * kv_heads; h += warps) {
        const bool is_q = h < heads, is_k = !is_q && h < heads + kv_heads;
        const float* src = is_q ? row + h * head_dim
                         : is_k ? row + q_dim + (h - heads) * head_dim
                                : row + q_dim + kv_dim + (h - heads - kv_heads) * head_dim;
        if (!is_q && !is_k) {
            KV* dst = kv + kv_offset(geo, page, 1, pos) + (h - heads - kv_heads) * head_dim;
            for (int i = lane; i < head_dim; i += 32) narrow(src[i], dst + i);
            continue;
        }
        const float* nw = is_q ? q_norm : k_norm;
        float inv = 1.f;
        if (nw) {
            double ss = 0.0;
            for (int i = lane; i < head_dim; i += 32) ss += (double)src[i] * src[i];
            inv = warp_rms_inv(ss, head_dim, eps);
        }
        for (int i = lane; i < half; i += 32) {
            float x1 = src[i], x2 = src[i + half];
            if (nw) {
                x1 = nw[i] * (x1 * inv);
                x2 = nw[i + half] * (x2 * inv);
            }
            const float a = x1 * cs[i] - x2 * sn[i];
            const float b = x2 * cs[i] + x1 * sn[i];
            if (is_q) {
                float* dst = q_out + (size_t)t * q_dim + h * head_dim;
                dst[i] = a;
                dst[i + half] = b;
            } else {
                KV* dst = kv + kv_offset(geo, page, 0, pos) + (h - heads) * head_dim;
                narrow(a, dst + i);
                narrow(b, dst + i + half);
            }
        }
    }
}

#define ROPE_ENTRY(DT, KV)                                                                    \
    extern "C" __global__ void rope_append_##DT(                                              \
        StepMeta meta, const float* qkv, float* q_out, KV* kv, const int* tables,              \
        KvGeometry geo, int heads, int kv_heads, int head_dim, const float* q_norm,            \
        const float* k_norm, float eps, const float* cos_t, const float* sin_t) {              \
        rope_append_body(meta, qkv, q_out, kv, tables, geo, heads, kv_heads, head_dim, q_norm, \
                         k_norm, eps, cos_t, sin_t);                                           \
    }

ROPE_ENTRY(bf16, __nv_bfloat16)
ROPE_ENTRY(f16, __half)

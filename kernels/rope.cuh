// One attention head's QK-norm (Qwen3) and rotary embedding, computed by one warp: shared by the
// standalone rope/KV-append kernel and the fused decode attention, so both give the same bits.
// rotate_half pairs (i, i + D/2) as transformers does, with the CPU reference's f32 cos/sin table.
#pragma once
#include "common.cuh"
#include "kv.cuh"
#include "norm.cuh"

// Where step row t's head h (q heads, then k, then v) goes once rotated: the position's cos and
// sin, and the rotated query's row `q_row` of q_out (q heads) or the head's slot in the paged
// pool (k and v heads); the other destination null. Shared by rope_append and the q|k|v GEMM's
// rope epilogue (mma.cuh), so both write the same places.
struct RopeTarget {
    const float* cs;
    const float* sn;
    float* q_dst;
    void* pool;
};

// The pool page that holds step row t's position `pos`.
__device__ __forceinline__ int rope_page(const StepMeta& meta, const int* __restrict__ tables,
                                         const KvGeometry& geo, int t, int pos) {
    return tables[(size_t)meta.token_slot[t] * geo.max_pages + pos / geo.page_tokens];
}

// rope_target once the row's position and (k and v heads) its page are known.
template <typename KV>
__device__ __forceinline__ RopeTarget rope_dests(int pos, int page, int q_row, int h,
                                                 float* __restrict__ q_out, KV* __restrict__ kv,
                                                 const KvGeometry& geo, int heads, int kv_heads,
                                                 int head_dim, const float* __restrict__ cos_t,
                                                 const float* __restrict__ sin_t) {
    RopeTarget r;
    r.cs = cos_t + (size_t)pos * (head_dim / 2);
    r.sn = sin_t + (size_t)pos * (head_dim / 2);
    r.q_dst = nullptr;
    r.pool = nullptr;
    if (h < heads) {
        r.q_dst = q_out + (size_t)q_row * heads * head_dim + h * head_dim;
    } else {
        const int kind = h < heads + kv_heads ? 0 : 1;
        r.pool = kv + kv_offset(geo, page, kind, pos) + (h - heads - kind * kv_heads) * head_dim;
    }
    return r;
}

template <typename KV>
__device__ __forceinline__ RopeTarget rope_target(const StepMeta& meta, int t, int q_row, int h,
                                                  float* __restrict__ q_out, KV* __restrict__ kv,
                                                  const int* __restrict__ tables,
                                                  const KvGeometry& geo, int heads, int kv_heads,
                                                  int head_dim, const float* __restrict__ cos_t,
                                                  const float* __restrict__ sin_t) {
    const int pos = meta.position[t];
    const int page = h < heads ? 0 : rope_page(meta, tables, geo, t, pos);
    return rope_dests(pos, page, q_row, h, q_out, kv, geo, heads, kv_heads, head_dim, cos_t,
                      sin_t);
}

// Elements i and i + half of a head, rotated by (c, s) and stored as f32 (q_dst) or as the KV
// type (k_dst, whichever is not null).
template <typename KV>
__device__ __forceinline__ void rotate_pair(float x1, float x2, float c, float s, int i, int half,
                                            float* __restrict__ q_dst, KV* __restrict__ k_dst) {
    const float a = x1 * c - x2 * s;
    const float b = x2 * c + x1 * s;
    if (q_dst) {
        q_dst[i] = a;
        q_dst[i + half] = b;
    } else {
        narrow(a, k_dst + i);
        narrow(b, k_dst + i + half);
    }
}

// The fast path's operands (head_dim / 2 a multiple of 32, at most 32 ROPE_MAXJ): lane's elements
// lane + 32 j of the head's two halves, their norm weights (1 without a norm) and the position's
// cos and sin. NJ: the most elements per lane and half it holds (a kernel that knows head_dim
// holds no more).
#define ROPE_MAXJ 4
template <int NJ = ROPE_MAXJ>
struct RopeLane {
    float x1[NJ], x2[NJ], n1[NJ], n2[NJ], c[NJ], s[NJ];
};

__device__ __forceinline__ bool rope_fast(int head_dim) {
    const int half = head_dim / 2;
    return half % 32 == 0 && half <= 32 * ROPE_MAXJ;
}

// The operands that do not depend on the projection (norm weights, cos and sin): a kernel may
// load them before its programmatic wait.
template <int NJ>
__device__ __forceinline__ void rope_load_table(RopeLane<NJ>& r, const float* __restrict__ nw,
                                                const float* __restrict__ cs,
                                                const float* __restrict__ sn, int head_dim,
                                                int lane) {
    const int half = head_dim / 2, nj = half / 32;
#pragma unroll
    for (int j = 0; j < NJ; ++j) {
        if (j >= nj) break;
        const int i = lane + 32 * j;
        r.n1[j] = nw ? nw[i] : 1.f;
        r.n2[j] = nw ? nw[i + half] : 1.f;
        r.c[j] = cs[i];
        r.s[j] = sn[i];
    }
}

template <int NJ>
__device__ __forceinline__ void rope_load_head(RopeLane<NJ>& r, const float* __restrict__ src,
                                               int head_dim, int lane) {
    const int half = head_dim / 2, nj = half / 32;
#pragma unroll
    for (int j = 0; j < NJ; ++j) {
        if (j >= nj) break;
        r.x1[j] = src[lane + 32 * j];
        r.x2[j] = src[lane + 32 * j + half];
    }
}

// The fast path's arithmetic, in the general path's order: lane's elements lane + 32 j
// ascending, first half then second. `nw` only says whether the head has a norm (r holds its
// weights).
template <typename KV, int NJ>
__device__ __forceinline__ void rope_apply(const RopeLane<NJ>& r, const float* nw, float eps,
                                           int head_dim, int lane, float* __restrict__ q_dst,
                                           KV* __restrict__ k_dst) {
    const int half = head_dim / 2, nj = half / 32;
    float inv = 1.f;
    if (nw) {
        double ss = 0.0;
#pragma unroll
        for (int j = 0; j < NJ; ++j)
            if (j < nj) ss += (double)r.x1[j] * r.x1[j];
#pragma unroll
        for (int j = 0; j < NJ; ++j)
            if (j < nj) ss += (double)r.x2[j] * r.x2[j];
        inv = warp_rms_inv(ss, head_dim, eps);
    }
#pragma unroll
    for (int j = 0; j < NJ; ++j) {
        if (j >= nj) break;
        const int i = lane + 32 * j;
        float a1 = r.x1[j], a2 = r.x2[j];
        if (nw) {
            a1 = r.n1[j] * (a1 * inv);
            a2 = r.n2[j] * (a2 * inv);
        }
        rotate_pair<KV>(a1, a2, r.c[j], r.s[j], i, half, q_dst, k_dst);
    }
}

// rope_head for any head_dim: each lane's elements lane + 32 i loaded as it goes (the fast path's
// order, so the same bits).
template <typename KV>
__device__ __forceinline__ void rope_head_general(const float* __restrict__ src,
                                                  const float* __restrict__ nw, float eps,
                                                  const float* __restrict__ cs,
                                                  const float* __restrict__ sn, int head_dim,
                                                  int lane, float* __restrict__ q_dst,
                                                  KV* __restrict__ k_dst) {
    const int half = head_dim / 2;
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
        rotate_pair<KV>(x1, x2, cs[i], sn[i], i, half, q_dst, k_dst);
    }
}

// src: the head's D projected values (f32); nw: its norm weights or null; cs/sn: the position's
// D/2 cos and sin. Writes the rotated head to q_dst (f32) or k_dst (the KV type), whichever is
// not null.
template <typename KV>
__device__ __forceinline__ void rope_head(const float* __restrict__ src,
                                          const float* __restrict__ nw, float eps,
                                          const float* __restrict__ cs,
                                          const float* __restrict__ sn, int head_dim, int lane,
                                          float* __restrict__ q_dst, KV* __restrict__ k_dst) {
    const int half = head_dim / 2;
    if (rope_fast(head_dim)) {
        // Every load first (one round trip), then rope_apply.
        RopeLane<> r;
        const int nj = half / 32;
#pragma unroll
        for (int j = 0; j < ROPE_MAXJ; ++j) {
            if (j >= nj) break;
            const int i = lane + 32 * j;
            r.x1[j] = src[i];
            r.x2[j] = src[i + half];
            r.n1[j] = nw ? nw[i] : 1.f;
            r.n2[j] = nw ? nw[i + half] : 1.f;
            r.c[j] = cs[i];
            r.s[j] = sn[i];
        }
        rope_apply<KV>(r, nw, eps, head_dim, lane, q_dst, k_dst);
        return;
    }
    rope_head_general<KV>(src, nw, eps, cs, sn, head_dim, lane, q_dst, k_dst);
}

// A value head copied into the pool.
template <typename KV>
__device__ __forceinline__ void copy_head(const float* __restrict__ src, int head_dim, int lane,
                                          KV* __restrict__ dst) {
    for (int i = lane; i < head_dim; i += 32) narrow(src[i], dst + i);
}

// copy_head with 16-byte loads where head_dim is a multiple of 128 (src 16-byte and dst 8-byte
// aligned): each lane converts four adjacent elements. The same values.
template <typename KV>
__device__ __forceinline__ void copy_head_wide(const float* __restrict__ src, int head_dim,
                                               int lane, KV* __restrict__ dst) {
    if (head_dim % 128 != 0) {
        copy_head<KV>(src, head_dim, lane, dst);
        return;
    }
    for (int i = 4 * lane; i < head_dim; i += 128) {
        const float4 v = *reinterpret_cast<const float4*>(src + i);
        union {
            KV h[4];
            uint2 u;
        } pack;
        narrow(v.x, &pack.h[0]);
        narrow(v.y, &pack.h[1]);
        narrow(v.z, &pack.h[2]);
        narrow(v.w, &pack.h[3]);
        *reinterpret_cast<uint2*>(dst + i) = pack.u;
    }
}

// One attention head's QK-norm (Qwen3) and rotary embedding, computed by one warp: shared by the
// standalone rope/KV-append kernel and the fused decode attention, so both give the same bits.
// rotate_half pairs (i, i + D/2) as transformers does, with the CPU reference's f32 cos/sin table.
#pragma once
#include "common.cuh"
#include "norm.cuh"

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
    if (half % 32 == 0 && half <= 128) {
        // Every load first (one round trip), then the same arithmetic in the same order as the
        // general path below: lane's elements lane + 32 j ascending, first half then second.
        constexpr int MAXJ = 4;
        const int nj = half / 32;
        float x1[MAXJ], x2[MAXJ], n1[MAXJ], n2[MAXJ], c[MAXJ], s[MAXJ];
#pragma unroll
        for (int j = 0; j < MAXJ; ++j) {
            if (j >= nj) break;
            const int i = lane + 32 * j;
            x1[j] = src[i];
            x2[j] = src[i + half];
            n1[j] = nw ? nw[i] : 1.f;
            n2[j] = nw ? nw[i + half] : 1.f;
            c[j] = cs[i];
            s[j] = sn[i];
        }
        float inv = 1.f;
        if (nw) {
            double ss = 0.0;
#pragma unroll
            for (int j = 0; j < MAXJ; ++j)
                if (j < nj) ss += (double)x1[j] * x1[j];
#pragma unroll
            for (int j = 0; j < MAXJ; ++j)
                if (j < nj) ss += (double)x2[j] * x2[j];
            inv = warp_rms_inv(ss, head_dim, eps);
        }
#pragma unroll
        for (int j = 0; j < MAXJ; ++j) {
            if (j >= nj) break;
            const int i = lane + 32 * j;
            float a1 = x1[j], a2 = x2[j];
            if (nw) {
                a1 = n1[j] * (a1 * inv);
                a2 = n2[j] * (a2 * inv);
            }
            rotate_pair<KV>(a1, a2, c[j], s[j], i, half, q_dst, k_dst);
        }
        return;
    }
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

// A value head copied into the pool.
template <typename KV>
__device__ __forceinline__ void copy_head(const float* __restrict__ src, int head_dim, int lane,
                                          KV* __restrict__ dst) {
    for (int i = lane; i < head_dim; i += 32) narrow(src[i], dst + i);
}

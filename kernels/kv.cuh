// The paged KV pool: [pages][layers][2 (k, v)][page_tokens][kv_dim] in the weights' 16-bit type,
// so a page is one contiguous range (copy-on-write copies it with one memcpy).
#pragma once
#include "common.cuh"

struct KvGeometry {
    int layers, layer, page_tokens, kv_dim, max_pages;
};

__device__ __forceinline__ size_t kv_offset(const KvGeometry& g, int page, int kind, int pos) {
    return ((((size_t)page * g.layers + g.layer) * 2 + kind) * g.page_tokens +
            pos % g.page_tokens) * (size_t)g.kv_dim;
}


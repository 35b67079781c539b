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


// Where the key rows of kv head g of one layer lie in the pool, for the positions of one block
// table (their value rows follow page_tokens * kv_dim elements later): the page division by a
// shift where page_tokens is a power of two (the usual page sizes), the layer's and head's
// offset computed once. A block table is read-only while kernels run (copied in before a step).
struct KvRows {
    const int* table;
    size_t page_stride, base;
    int page_tokens, shift, kv_dim;

    __device__ __forceinline__ KvRows(const KvGeometry& geo, const int* tab, int g, int D) {
        table = tab;
        page_tokens = geo.page_tokens;
        kv_dim = geo.kv_dim;
        shift = (page_tokens & (page_tokens - 1)) == 0 ? __ffs(page_tokens) - 1 : -1;
        page_stride = (size_t)geo.layers * 2 * page_tokens * kv_dim;
        base = (size_t)geo.layer * 2 * page_tokens * kv_dim + (size_t)g * D;
    }
    // Offset of position j's (≥ 0) key row: kv_offset(geo, table[j / page_tokens], 0, j) + g D.
    __device__ __forceinline__ size_t key_row(int j) const {
        int i, in;
        if (shift >= 0) {
            i = j >> shift;
            in = j & (page_tokens - 1);
        } else {
            i = j / page_tokens;
            in = j - i * page_tokens;
        }
        return (size_t)__ldg(table + i) * page_stride + base + (size_t)in * kv_dim;
    }
};

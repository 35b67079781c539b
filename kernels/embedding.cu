// Token embedding: x[t, :] = E[token(t), :] in f32. A decode token is read from the device token
// ring (what its slot sampled last step), so the next step never waits for the host.
// embed_tiled_*: the table in the tensor-core projections' tiled layout (mma.cuh), as it is
// when it doubles as the LM head.
#include "common.cuh"

// Element offset of chunk (row r, columns k .. k + 7) in the tiled layout of a matrix of `cols`
// columns (nervad/src/backend/cuda/weight_tiles.rs, tiled_offset).
__device__ __forceinline__ size_t tiled_chunk(u32 r, int k, int cols) {
    const int groups = (cols + 63) / 64;
    const int lane = (r % 8) * 4 + (k % 32) / 8;
    const int hq = ((r % 16) / 8) * 2 + (k % 64) / 32;
    return (((size_t)(r / 16) * groups + k / 64) * 4 + hq) * 256 + lane * 8;
}

template <typename W, bool TILED>
__device__ __forceinline__ void embed_body(StepMeta meta, const u32* __restrict__ sampled,
                                           const W* __restrict__ table, u32 vocab,
                                           int hidden, float* __restrict__ x) {
    pdl_enter();
    const int t = blockIdx.x;
    if (t >= meta.counts[0]) return;
    u32 tok = meta.token[t];
    if (tok & NERVA_FROM_SLOT) tok = sampled[tok & ~NERVA_FROM_SLOT];
    if (tok >= vocab) tok = 0;  // never reached: host ids are validated, device ids clamped
    const W* row = table + (size_t)tok * hidden;
    float* out = x + (size_t)t * hidden;
    for (int c = threadIdx.x; c < hidden / 8; c += blockDim.x) {
        const W* chunk = TILED ? table + tiled_chunk(tok, c * 8, hidden) : row + c * 8;
        float v[8];
        widen8(*reinterpret_cast<const uint4*>(chunk), chunk, v);
#pragma unroll
        for (int i = 0; i < 8; ++i) out[c * 8 + i] = v[i];
    }
}

#define EMBED_ENTRY(NAME, W, TILED)                                                           \
    extern "C" __global__ void NAME(StepMeta meta, const u32* sampled, const W* table,       \
                                    u32 vocab, int hidden, float* x) {                        \
        embed_body<W, TILED>(meta, sampled, table, vocab, hidden, x);                         \
    }

EMBED_ENTRY(embed_bf16, __nv_bfloat16, false)
EMBED_ENTRY(embed_f16, __half, false)
EMBED_ENTRY(embed_tiled_bf16, __nv_bfloat16, true)
EMBED_ENTRY(embed_tiled_f16, __half, true)

// Token embedding: x[t, :] = E[token(t), :] in f32. A decode token is read from the device token
// ring (what its slot sampled last step), so the next step never waits for the host.
#include "common.cuh"

template <typename W>
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
        float v[8];
        widen8(*reinterpret_cast<const uint4*>(row + c * 8), row, v);
#pragma unroll
        for (int i = 0; i < 8; ++i) out[c * 8 + i] = v[i];
    }
}

extern "C" __global__ void embed_bf16(StepMeta meta, const u32* sampled,
                                      const __nv_bfloat16* table, u32 vocab, int hidden,
                                      float* x) {
    embed_body(meta, sampled, table, vocab, hidden, x);
}

extern "C" __global__ void embed_f16(StepMeta meta, const u32* sampled, const __half* table,
                                     u32 vocab, int hidden, float* x) {
    embed_body(meta, sampled, table, vocab, hidden, x);
}

// The read-bandwidth ceiling every decode figure is compared with: one pass over a large
// buffer with 16-byte streaming loads (what a GEMV step does with its weights), summed so the
// loads cannot be dropped.
#include "common.cuh"

extern "C" __global__ void read_bandwidth(const uint4* __restrict__ src, size_t n,
                                          unsigned int* __restrict__ sink) {
    pdl_enter();
    unsigned int acc = 0;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const uint4 v = __ldcs(src + i);
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x9e3779b9u) sink[0] = acc;  // practically never taken; keeps the loads live
}

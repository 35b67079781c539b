// Does Hopper's wgmma (m64nNk16, A from registers, B from shared memory) give the bits of
// mma.sync m16n8k16 for the same operands and accumulator? If it does, the fixed-order GEMM
// (kernels/mma.cuh) can move to wgmma and keep every projection's bits, so batch invariance
// holds between the GEMV-shaped kernels and the GEMM. Built on the GPU machine:
//   nvcc -O2 -gencode arch=compute_90a,code=sm_90a -o wgmma_bits lab/gpu/wgmma_bits.cu && ./wgmma_bits
// It prints, for several operand distributions and chain lengths, how many outputs differ in
// any bit and the largest relative difference (a wrong layout shows up as a large one).
#include <cuda_bf16.h>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cmath>
#include <vector>
#include <random>

typedef unsigned int u32;
typedef unsigned long long u64;

#define N 64      // tokens (wgmma n)
#define M 64      // rows (one warpgroup)

// A: [steps][M][16] bf16, B: [steps][N][16] bf16 (K-major per token), C: [M][N] f32.
__device__ __forceinline__ void mma16816(float c[4], const u32 a[4], u32 b0, u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ u32 pair(const __nv_bfloat16* p) { return *reinterpret_cast<const u32*>(p); }

// Reference: warp w takes rows 16w.., all n-tiles, steps in order.
__global__ void ref_kernel(const __nv_bfloat16* A, const __nv_bfloat16* B, const float* C, int steps,
                           float* D) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
    for (int n = 0; n < N / 8; ++n) {
        float acc[4];
        const int r0 = 16 * w + g, t0 = 8 * n + 2 * c;
        acc[0] = C[r0 * N + t0];
        acc[1] = C[r0 * N + t0 + 1];
        acc[2] = C[(r0 + 8) * N + t0];
        acc[3] = C[(r0 + 8) * N + t0 + 1];
        for (int s = 0; s < steps; ++s) {
            const __nv_bfloat16* a = A + (size_t)s * M * 16;
            const __nv_bfloat16* b = B + (size_t)s * N * 16;
            u32 fa[4] = {pair(a + r0 * 16 + 2 * c), pair(a + (r0 + 8) * 16 + 2 * c),
                         pair(a + r0 * 16 + 2 * c + 8), pair(a + (r0 + 8) * 16 + 2 * c + 8)};
            const int tok = 8 * n + g;
            mma16816(acc, fa, pair(b + tok * 16 + 2 * c), pair(b + tok * 16 + 2 * c + 8));
        }
        D[r0 * N + t0] = acc[0];
        D[r0 * N + t0 + 1] = acc[1];
        D[(r0 + 8) * N + t0] = acc[2];
        D[(r0 + 8) * N + t0 + 1] = acc[3];
    }
}

__device__ __forceinline__ u64 desc(u32 addr, u32 lbo, u32 sbo) {
    u64 d = 0;
    d |= (u64)((addr & 0x3FFFF) >> 4);
    d |= (u64)((lbo & 0x3FFFF) >> 4) << 16;
    d |= (u64)((sbo & 0x3FFFF) >> 4) << 32;
    return d;  // layout type 0: no swizzle
}

#define ACC32(x) \
    "+f"(x[0]), "+f"(x[1]), "+f"(x[2]), "+f"(x[3]), "+f"(x[4]), "+f"(x[5]), "+f"(x[6]), "+f"(x[7]), \
    "+f"(x[8]), "+f"(x[9]), "+f"(x[10]), "+f"(x[11]), "+f"(x[12]), "+f"(x[13]), "+f"(x[14]), \
    "+f"(x[15]), "+f"(x[16]), "+f"(x[17]), "+f"(x[18]), "+f"(x[19]), "+f"(x[20]), "+f"(x[21]), \
    "+f"(x[22]), "+f"(x[23]), "+f"(x[24]), "+f"(x[25]), "+f"(x[26]), "+f"(x[27]), "+f"(x[28]), \
    "+f"(x[29]), "+f"(x[30]), "+f"(x[31])

__device__ __forceinline__ void wgmma_n64(float d[32], const u32 a[4], u64 bdesc) {
    asm volatile(
        "{\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,"
        "%24,%25,%26,%27,%28,%29,%30,%31}, {%32,%33,%34,%35}, %36, 1, 1, 1, 0;\n"
        "}\n"
        : ACC32(d)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(bdesc));
}

// Candidate: one warpgroup, A fragments from registers (mma.sync's layout), B staged in shared
// memory as core matrices (8 tokens x 16 bytes), K-major, no swizzle: core matrix (nb, kh) at
// nb * 256 + kh * 128 (kh: k 0-7 or 8-15). `swap` exchanges which descriptor field carries the
// K-direction stride (the PTX names are easy to mix up; the probe tries both).
__global__ void wg_kernel(const __nv_bfloat16* A, const __nv_bfloat16* B, const float* C, int steps,
                          float* D, int swap) {
    __shared__ __align__(1024) __nv_bfloat16 bs[N * 16];
    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, g = lane >> 2, c = lane & 3;
    float acc[32];
    for (int n = 0; n < N / 8; ++n) {
        const int r0 = 16 * w + g, t0 = 8 * n + 2 * c;
        acc[4 * n + 0] = C[r0 * N + t0];
        acc[4 * n + 1] = C[r0 * N + t0 + 1];
        acc[4 * n + 2] = C[(r0 + 8) * N + t0];
        acc[4 * n + 3] = C[(r0 + 8) * N + t0 + 1];
    }
    for (int s = 0; s < steps; ++s) {
        const __nv_bfloat16* a = A + (size_t)s * M * 16;
        const __nv_bfloat16* b = B + (size_t)s * N * 16;
        __syncthreads();
        for (int i = tid; i < N * 2; i += 128) {
            const int tok = i / 2, kh = i % 2;
            const int nb = tok / 8, row = tok % 8;
            memcpy(&bs[(nb * 256 + kh * 128 + row * 16) / 2], b + tok * 16 + kh * 8, 16);
        }
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        __syncthreads();
        const int r0 = 16 * w + g;
        u32 fa[4] = {pair(a + r0 * 16 + 2 * c), pair(a + (r0 + 8) * 16 + 2 * c),
                     pair(a + r0 * 16 + 2 * c + 8), pair(a + (r0 + 8) * 16 + 2 * c + 8)};
        const u32 base = (u32)__cvta_generic_to_shared(bs);
        const u64 d = swap ? desc(base, 256, 128) : desc(base, 128, 256);
        asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
        wgmma_n64(acc, fa, d);
        asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
        asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    }
    for (int n = 0; n < N / 8; ++n) {
        const int r0 = 16 * w + g, t0 = 8 * n + 2 * c;
        D[r0 * N + t0] = acc[4 * n + 0];
        D[r0 * N + t0 + 1] = acc[4 * n + 1];
        D[(r0 + 8) * N + t0] = acc[4 * n + 2];
        D[(r0 + 8) * N + t0 + 1] = acc[4 * n + 3];
    }
}

static float rnd_val(std::mt19937& r, int dist) {
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    std::uniform_int_distribution<int> e(-12, 12);
    switch (dist) {
        case 0: return u(r);                                   // plain
        case 1: return u(r) * std::ldexp(1.f, e(r));           // wide exponents
        default: return (r() & 1 ? 1.f : -1.f) * (1.f + u(r) * 1e-2f) * std::ldexp(1.f, e(r) / 3);
    }
}

int main() {
    const int max_steps = 64;
    std::mt19937 rng(7);
    const char* dists[] = {"uniform", "wide-exponent", "cancelling"};
    int total_diff = 0;
    for (int dist = 0; dist < 3; ++dist)
        for (int steps : {1, 4, 64}) {
            std::vector<__nv_bfloat16> ha((size_t)max_steps * M * 16), hb((size_t)max_steps * N * 16);
            std::vector<float> hc(M * N);
            for (auto& v : ha) v = __float2bfloat16(rnd_val(rng, dist));
            for (auto& v : hb) v = __float2bfloat16(rnd_val(rng, dist));
            for (auto& v : hc) v = rnd_val(rng, dist) * (dist == 1 ? 64.f : 1.f);
            __nv_bfloat16 *da, *db;
            float *dc, *dr, *dw;
            cudaMalloc(&da, ha.size() * 2);
            cudaMalloc(&db, hb.size() * 2);
            cudaMalloc(&dc, hc.size() * 4);
            cudaMalloc(&dr, hc.size() * 4);
            cudaMalloc(&dw, hc.size() * 4);
            cudaMemcpy(da, ha.data(), ha.size() * 2, cudaMemcpyHostToDevice);
            cudaMemcpy(db, hb.data(), hb.size() * 2, cudaMemcpyHostToDevice);
            cudaMemcpy(dc, hc.data(), hc.size() * 4, cudaMemcpyHostToDevice);
            ref_kernel<<<1, 128>>>(da, db, dc, steps, dr);
            std::vector<float> r(M * N), w(M * N);
            cudaMemcpy(r.data(), dr, r.size() * 4, cudaMemcpyDeviceToHost);
            for (int swap = 0; swap < 2; ++swap) {
                wg_kernel<<<1, 128>>>(da, db, dc, steps, dw, swap);
                cudaError_t err = cudaDeviceSynchronize();
                if (err != cudaSuccess) {
                    printf("error: %s\n", cudaGetErrorString(err));
                    return 1;
                }
                cudaMemcpy(w.data(), dw, w.size() * 4, cudaMemcpyDeviceToHost);
                int diff = 0;
                double rel = 0;
                for (int i = 0; i < M * N; ++i) {
                    u32 x, y;
                    memcpy(&x, &r[i], 4);
                    memcpy(&y, &w[i], 4);
                    if (x != y) ++diff;
                    rel = std::fmax(rel, std::fabs(r[i] - w[i]) / (std::fabs(r[i]) + 1e-30));
                }
                printf("wgmma-bits dist=%-13s steps=%2d desc=%s: %4d of %d outputs differ, max rel %.3g\n",
                       dists[dist], steps, swap ? "swapped" : "lbo=k  ", diff, M * N, rel);
                if (rel < 1e-2) total_diff += diff;
            }
            cudaFree(da); cudaFree(db); cudaFree(dc); cudaFree(dr); cudaFree(dw);
        }
    printf("wgmma-bits summary: %d differing outputs under the matching layout\n", total_diff);
    return 0;
}

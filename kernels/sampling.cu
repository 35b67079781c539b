// Sampling on the device, with the CPU reference's semantics (backend/sampling.rs):
// repetition penalty (CTRL) over prompt and output tokens, presence/frequency penalties over
// output tokens, temperature, then top-k, top-p, min-p truncation and one draw. Log-probabilities
// are log_softmax after penalties and temperature, before truncation; top-n alternatives best
// first, ties to the lower id.
//
// One block per sampled row. Every vocabulary-wide reduction is a fixed tree (deterministic),
// and the draw comes from a counter-based stream (seed, draw index), so a request's tokens depend
// only on its seed and its logits: reproducible per seed, whatever else is in the batch. The
// truncation thresholds are found by bisection over the float order (exact, no sort):
// top-k keeps keys >= the k-th largest key (ties at the threshold are all kept), top-p keeps a
// token while the mass strictly above it is below p (as the reference's sorted scan does).
#include "common.cuh"

#define SAMPLE_THREADS 1024
#define MAX_TOP 20

struct SlotParams {
    float temperature;
    u32 top_k;
    float top_p;
    float min_p;
    float repetition_penalty;
    float presence_penalty;
    float frequency_penalty;
    u32 top_logprobs;
    u64 seed;
    u64 draws;
};

struct SampleRecord {
    u32 token;
    float logprob;
    u32 top_n;
    u32 pad;
    u32 ids[MAX_TOP];
    float logprobs[MAX_TOP];
};

struct Shared {
    double dred[32];
    double dscan[32];
    float fval[32];
    int fidx[32];
    u32 ured[32];
    double dbcast;
    float fbcast;
    int ibcast;
    u32 ubcast;
    u32 chosen[MAX_TOP];
};

__device__ __forceinline__ bool better(float a, int ai, float b, int bi) {
    return a > b || (a == b && ai < bi);
}

// Block-wide argmax (largest value, lowest index on ties) of (v, i), broadcast to all threads.
__device__ void block_argmax(float v, int i, Shared& sh, float* out_v, int* out_i) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, v, o);
        const int oi = __shfl_xor_sync(0xffffffffu, i, o);
        if (better(ov, oi, v, i)) { v = ov; i = oi; }
    }
    __syncthreads();
    if (lane == 0) { sh.fval[warp] = v; sh.fidx[warp] = i; }
    __syncthreads();
    if (warp == 0) {
        const int warps = (blockDim.x + 31) >> 5;
        v = lane < warps ? sh.fval[lane] : -INFINITY;
        i = lane < warps ? sh.fidx[lane] : 0x7fffffff;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, v, o);
            const int oi = __shfl_xor_sync(0xffffffffu, i, o);
            if (better(ov, oi, v, i)) { v = ov; i = oi; }
        }
        if (lane == 0) { sh.fbcast = v; sh.ibcast = i; }
    }
    __syncthreads();
    *out_v = sh.fbcast;
    *out_i = sh.ibcast;
}

__device__ double block_sum(double v, Shared& sh) {
    const double r = block_sum_d(v, sh.dred);
    if (threadIdx.x == 0) sh.dbcast = r;
    __syncthreads();
    const double out = sh.dbcast;
    __syncthreads();
    return out;
}

__device__ u32 block_count(u32 v, Shared& sh) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads();
    if (lane == 0) sh.ured[warp] = v;
    __syncthreads();
    if (warp == 0) {
        const int warps = (blockDim.x + 31) >> 5;
        v = lane < warps ? sh.ured[lane] : 0u;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (lane == 0) sh.ubcast = v;
    }
    __syncthreads();
    const u32 out = sh.ubcast;
    __syncthreads();
    return out;
}

__device__ __forceinline__ u64 splitmix64(u64 x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

// Uniform in [0, 1) from the slot's seed and draw index (53 bits).
__device__ __forceinline__ double uniform(u64 seed, u64 draw) {
    const u64 x = splitmix64(splitmix64(seed) ^ (draw * 0xD1B54A32D192ED03ull));
    return (double)(x >> 11) * (1.0 / 9007199254740992.0);
}

// Per vocabulary chunk of a sampled row: penalties and temperature applied in place, then the
// chunk's max (lowest id on ties) and sum of e^(l - chunk max). Many blocks per row, so the
// vocabulary-wide passes run on every SM instead of one; sample_rows merges the chunks in
// order (a fixed order: deterministic).
#define PREP_CHUNKS 64
#define PREP_THREADS 256

struct ChunkStats {
    float max;
    int argmax;
    double sum;
};

extern "C" __global__ void __launch_bounds__(PREP_THREADS)
    logits_prepare(StepMeta meta, int row_base, int rows, float* __restrict__ logits, int vocab,
                   const SlotParams* __restrict__ params, const u32* __restrict__ counts,
                   const u32* __restrict__ prompt_bits, ChunkStats* __restrict__ stats) {
    __shared__ Shared sh;
    pdl_enter();
    const int j = blockIdx.x, chunk = blockIdx.y;
    const int row = row_base + j;
    if (j >= rows || row >= meta.counts[2] || !meta.lrow_sample[row]) return;
    const int slot = meta.seq_slot[meta.lrow_seq[row]];
    const SlotParams P = params[slot];
    float* l = logits + (size_t)j * vocab;
    const u32* cnt = counts + (size_t)slot * vocab;
    const u32* bits = prompt_bits + (size_t)slot * ((vocab + 31) / 32);
    const int per = (vocab + PREP_CHUNKS - 1) / PREP_CHUNKS;
    const int lo = chunk * per, hi = min(vocab, lo + per);
    const bool rep = P.repetition_penalty != 1.f;
    const bool pen = P.presence_penalty != 0.f || P.frequency_penalty != 0.f;
    const bool temp = P.temperature > 0.f && P.temperature != 1.f;
    float best = -INFINITY;
    int best_i = 0x7fffffff;
    for (int v = lo + threadIdx.x; v < hi; v += PREP_THREADS) {
        float x = l[v];
        if (rep || pen || temp) {
            const u32 c = cnt[v];
            if (rep && (c > 0 || ((bits[v >> 5] >> (v & 31)) & 1u)))
                x = x > 0.f ? x / P.repetition_penalty : x * P.repetition_penalty;
            if (pen && c > 0) x -= P.presence_penalty + P.frequency_penalty * (float)c;
            if (temp) x /= P.temperature;
            l[v] = x;
        }
        if (better(x, v, best, best_i)) { best = x; best_i = v; }
    }
    float mx;
    int arg;
    block_argmax(best, best_i, sh, &mx, &arg);
    double s = 0.0;
    for (int v = lo + threadIdx.x; v < hi; v += PREP_THREADS) s += (double)expf(l[v] - mx);
    const double total = block_sum(s, sh);
    if (threadIdx.x == 0) {
        ChunkStats* out = stats + (size_t)j * PREP_CHUNKS + chunk;
        out->max = mx;
        out->argmax = arg;
        out->sum = total;
    }
}

extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS)
    sample_rows(StepMeta meta, int row_base, int rows, float* __restrict__ logits, int vocab,
                SlotParams* __restrict__ params, u32* __restrict__ counts,
                const u32* __restrict__ prompt_bits, u32* __restrict__ sampled,
                SampleRecord* __restrict__ records, float* __restrict__ weights,
                const ChunkStats* __restrict__ stats) {
    __shared__ Shared sh;
    pdl_enter();
    const int j = blockIdx.x;
    const int row = row_base + j;
    if (j >= rows || row >= meta.counts[2] || !meta.lrow_sample[row]) return;
    const int seq = meta.lrow_seq[row];
    const int slot = meta.seq_slot[seq];
    const SlotParams P = params[slot];
    float* l = logits + (size_t)j * vocab;
    float* w = weights + (size_t)j * vocab;
    u32* cnt = counts + (size_t)slot * vocab;
    const int tid = threadIdx.x;

    // Penalties and temperature were applied by logits_prepare; merge its chunk statistics in
    // chunk order.
    {
        // One chunk per thread: max (first chunk on ties: lowest id), then the rescaled sums
        // through the fixed-order block reduction.
        const ChunkStats* cs = stats + (size_t)j * PREP_CHUNKS;
        const bool mine = tid < PREP_CHUNKS;
        const float cm = mine ? cs[tid].max : -INFINITY;
        const int ci = mine ? cs[tid].argmax : 0x7fffffff;
        float m;
        int arg;
        block_argmax(cm, ci, sh, &m, &arg);
        const double term = mine && cm != -INFINITY ? cs[tid].sum * exp((double)cm - (double)m) : 0.0;
        const double sum = block_sum(term, sh);
        if (tid == 0) {
            sh.fbcast = m;
            sh.ibcast = arg;
            sh.dbcast = (double)m + log(sum);
        }
    }
    __syncthreads();
    const float mx = sh.fbcast;
    const int argmax = sh.ibcast;
    const double lse = sh.dbcast;
    __syncthreads();

    int token = argmax;
    if (P.temperature > 0.f) {
        // top-k: the k-th largest key by bisection over the key space.
        u32 kth = 0;
        if (P.top_k > 0 && P.top_k < (u32)vocab) {
            u32 lo = 0, hi = 0xffffffffu;
            while (lo < hi) {
                const u32 mid = (u32)(((u64)lo + hi + 1) / 2);
                u32 c = 0;
                for (int v = tid; v < vocab; v += SAMPLE_THREADS) c += order_key(l[v]) >= mid;
                if (block_count(c, sh) >= P.top_k) lo = mid; else hi = mid - 1;
            }
            kth = lo;
        }
        double tot = 0.0;
        for (int v = tid; v < vocab; v += SAMPLE_THREADS) {
            const float x = order_key(l[v]) >= kth ? expf(l[v] - mx) : 0.f;
            w[v] = x;
            tot += x;
        }
        __syncthreads();
        if (P.top_p < 1.f) {
            const double target = (double)P.top_p * block_sum(tot, sh);
            // Smallest key whose strictly-better kept mass is below the target.
            u32 lo = 0, hi = 0xffffffffu;
            while (lo < hi) {
                const u32 mid = lo + (hi - lo) / 2;
                double m = 0.0;
                for (int v = tid; v < vocab; v += SAMPLE_THREADS)
                    if (order_key(l[v]) > mid) m += w[v];
                if (block_sum(m, sh) < target) hi = mid; else lo = mid + 1;
            }
            for (int v = tid; v < vocab; v += SAMPLE_THREADS)
                if (order_key(l[v]) < lo) w[v] = 0.f;
            __syncthreads();
        }
        if (P.min_p > 0.f) {
            // The best token is always kept and weighs e^0 = 1.
            for (int v = tid; v < vocab; v += SAMPLE_THREADS)
                if (w[v] < P.min_p) w[v] = 0.f;
            __syncthreads();
        }
        // Draw: contiguous id ranges per thread, a deterministic exclusive scan of their mass.
        const int seg = (vocab + SAMPLE_THREADS - 1) / SAMPLE_THREADS;
        const int lo_v = min(vocab, tid * seg), hi_v = min(vocab, lo_v + seg);
        double own = 0.0;
        for (int v = lo_v; v < hi_v; ++v) own += w[v];
        const int lane = tid & 31, warp = tid >> 5;
        double inc = own;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const double y = __shfl_up_sync(0xffffffffu, inc, o);
            if (lane >= o) inc += y;
        }
        if (lane == 31) sh.dscan[warp] = inc;
        __syncthreads();
        if (warp == 0) {
            double x = sh.dscan[lane];
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                const double y = __shfl_up_sync(0xffffffffu, x, o);
                if (lane >= o) x += y;
            }
            sh.dscan[lane] = x;  // inclusive over warps
        }
        __syncthreads();
        const double total = sh.dscan[31];
        const double before = (warp > 0 ? sh.dscan[warp - 1] : 0.0) + inc - own;
        const double u = uniform(P.seed, P.draws) * total;
        if (tid == 0) sh.ibcast = -1;
        __syncthreads();
        if (own > 0.0 && u >= before && u < before + own) {
            double cum = before;
            int pick = -1;
            for (int v = lo_v; v < hi_v; ++v) {
                cum += w[v];
                if (w[v] > 0.f) pick = v;
                if (u < cum && w[v] > 0.f) break;
            }
            atomicMax(&sh.ibcast, pick);
        }
        __syncthreads();
        int pick = sh.ibcast;
        if (pick < 0) {
            // Rounding left u at the very top: the last kept token.
            int last = -1;
            for (int v = tid; v < vocab; v += SAMPLE_THREADS)
                if (w[v] > 0.f) last = v;
            __syncthreads();
            if (tid == 0) sh.ibcast = -1;
            __syncthreads();
            atomicMax(&sh.ibcast, last);
            __syncthreads();
            pick = sh.ibcast < 0 ? argmax : sh.ibcast;
        }
        token = pick;
    }

    SampleRecord* rec = records + seq;
    const int n = min((int)P.top_logprobs, min(MAX_TOP, vocab));
    for (int k = 0; k < n; ++k) {
        float b = -INFINITY;
        int bi = 0x7fffffff;
        for (int v = tid; v < vocab; v += SAMPLE_THREADS) {
            bool taken = false;
            for (int q = 0; q < k; ++q) taken |= sh.chosen[q] == (u32)v;
            if (!taken && better(l[v], v, b, bi)) { b = l[v]; bi = v; }
        }
        float bv;
        int id;
        block_argmax(b, bi, sh, &bv, &id);
        if (tid == 0) {
            sh.chosen[k] = (u32)id;
            rec->ids[k] = (u32)id;
            rec->logprobs[k] = (float)((double)bv - lse);
        }
        __syncthreads();
    }
    // Defensive: a token outside the vocabulary (NaN logits everywhere) becomes 0 rather than
    // an out-of-range read by the next step's embedding.
    if (token < 0 || token >= vocab) token = 0;
    if (tid == 0) {
        rec->token = (u32)token;
        rec->logprob = (float)((double)l[token] - lse);
        rec->top_n = (u32)n;
        sampled[slot] = (u32)token;
        cnt[token] += 1;
        params[slot].draws = P.draws + 1;
    }
}

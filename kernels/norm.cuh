// RMSNorm pieces shared by the kernels that fuse a norm (the projections' prologue computes its
// own; per-head QK-norm uses this warp version). Sums of squares in f64 like the CPU reference.
#pragma once
#include "common.cuh"

// 1 / sqrt(mean(v^2) + eps) of a vector spread over one warp (each lane passes its part's sum).
__device__ __forceinline__ float warp_rms_inv(double lane_sum_sq, int n, float eps) {
    const double s = warp_sum_d(lane_sum_sq);
    const float var = (float)(s / n);
    return 1.0f / sqrtf(var + eps);
}

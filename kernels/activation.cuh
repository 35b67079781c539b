// Activations, written as the CPU reference writes them (x / (1 + e^-x)) so both round alike.
#pragma once

__device__ __forceinline__ float silu(float g) { return g / (1.0f + expf(-g)); }

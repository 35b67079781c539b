// Tensor-core projections over tiled weights (the default tensor-core mode; the layout is in
// mma.cuh and nervad/src/backend/cuda/weight_tiles.rs). The same kernels as mma.cu, the same
// bits; only the weights' addresses differ.
#define MMA_TILED 1
#include "mma.cuh"

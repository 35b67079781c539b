// Tensor-core projections over row-major weights (GEMV, mixed and fast-prefill modes share them
// with the GEMV and cuBLAS). The kernels are in mma.cuh.
#include "mma.cuh"

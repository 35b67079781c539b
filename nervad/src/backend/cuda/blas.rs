//! cuBLAS for projections over many tokens (prefill chunks): 16-bit activations and weights on
//! the tensor cores, f32 accumulation and output.
//!
//! Loaded at run time like the driver: a host without libcublas keeps the projection kernels
//! of `kernels/gemv.cu` for every step. The handle runs on the backend's stream and uses a
//! workspace carved from the arena, so it allocates nothing after start.

use std::ffi::c_void;

use cudarc::cublas::sys as cb;

use super::driver::{DevBuf, Gpu};
use crate::backend::BackendError;
use crate::model::DType;

/// Workspace cuBLAS gets from the arena (NVIDIA recommends 32 MiB on Hopper).
pub const WORKSPACE_BYTES: usize = 32 << 20;

/// A cuBLAS handle bound to the backend's stream.
pub struct Blas {
    handle: cb::cublasHandle_t,
    dtype: cb::cudaDataType,
}

// SAFETY: the handle is used by one thread at a time (&mut self of the owning backend), with
// the context current.
unsafe impl Send for Blas {}

fn blas_error(what: &str, e: cudarc::cublas::result::CublasError) -> BackendError {
    BackendError::Device(format!("cuBLAS {what}: {e:?}"))
}

impl Blas {
    /// Is libcublas loadable? (Checked before any call, which would panic without it.)
    pub fn present() -> bool {
        // SAFETY: only tries to dlopen the library by its usual names.
        unsafe { cb::is_culib_present() }
    }

    /// A handle on `gpu`'s stream with `workspace` (≥ [`WORKSPACE_BYTES`]) for `dtype` weights.
    pub fn new(gpu: &Gpu, workspace: DevBuf, dtype: DType) -> Result<Self, BackendError> {
        let dtype = match dtype {
            DType::BF16 => cb::cudaDataType::CUDA_R_16BF,
            DType::F16 => cb::cudaDataType::CUDA_R_16F,
            other => {
                return Err(BackendError::Unsupported(format!(
                    "cuBLAS projections take 16-bit weights, not {other:?}"
                )));
            }
        };
        let handle =
            cudarc::cublas::result::create_handle().map_err(|e| blas_error("create", e))?;
        let blas = Blas { handle, dtype };
        // SAFETY: the handle is live; the stream belongs to the same context; the workspace is
        // a live arena region of the given size, used only by this handle on this stream.
        unsafe {
            cudarc::cublas::result::set_stream(handle, gpu.raw_stream().cast())
                .map_err(|e| blas_error("set stream", e))?;
            cb::cublasSetWorkspace_v2(handle, workspace.ptr as *mut c_void, workspace.bytes)
                .result()
                .map_err(|e| blas_error("set workspace", e))?;
        }
        Ok(blas)
    }

    /// y[t, r] (=, or += when `accumulate`) Σ_k a[t, k] · w[r, k] for t < m, r < n: `a` is m
    /// rows of k 16-bit values (row stride k), `w` n rows of k, `y` m rows of f32 with row
    /// stride `ldy`.
    ///
    /// # Safety
    /// The pointers must address arena memory of those shapes, and `y` must not overlap `a` or
    /// `w`.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn gemm(
        &mut self,
        a: u64,
        w: u64,
        m: usize,
        n: usize,
        k: usize,
        y: u64,
        ldy: usize,
        accumulate: bool,
    ) -> Result<(), BackendError> {
        let alpha = 1.0f32;
        let beta = if accumulate { 1.0f32 } else { 0.0 };
        // Row-major Y (m×n) = A (m×k) · Wᵀ is column-major Yᵀ (n×m) = W (k×n col-major, op T) ·
        // Aᵀ (k×m col-major, op N).
        // SAFETY: shapes and pointers as documented by the caller's contract; alpha and beta
        // live across the call (cuBLAS reads host scalars before returning).
        unsafe {
            cudarc::cublas::result::gemm_ex(
                self.handle,
                cb::cublasOperation_t::CUBLAS_OP_T,
                cb::cublasOperation_t::CUBLAS_OP_N,
                n as i32,
                m as i32,
                k as i32,
                (&alpha as *const f32).cast(),
                w as *const c_void,
                self.dtype,
                k as i32,
                a as *const c_void,
                self.dtype,
                k as i32,
                (&beta as *const f32).cast(),
                y as *mut c_void,
                cb::cudaDataType::CUDA_R_32F,
                ldy as i32,
                cb::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                cb::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(|e| blas_error("gemm", e))
    }
}

impl Drop for Blas {
    fn drop(&mut self) {
        // SAFETY: created in `new`, destroyed once here.
        let _ = unsafe { cudarc::cublas::result::destroy_handle(self.handle) };
    }
}

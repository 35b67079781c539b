//! Tensor maps (TMA descriptors) of the wgmma GEMM staged by tensor copies (`mma_*_wgt`,
//! kernels/mma.cuh): how its two bulk copies per group see the weights and the inputs.
//!
//! Encoding is host arithmetic only (`cuTensorMapEncodeTiled` touches no device), so a launch
//! encodes its maps for its own pointers and token count: cheap, and a captured graph keeps the
//! maps by value with the other arguments.

use cudarc::driver::sys;

use super::driver::Args;
use super::launch_shape::MMA_WGT;
use crate::backend::BackendError;

/// The two tensor maps a `wgt` launch takes after the GEMM's arguments (`wmap`, `xmap`).
#[derive(Clone, Copy)]
pub struct GemmMaps {
    pub weights: sys::CUtensorMap,
    pub inputs: sys::CUtensorMap,
}

/// Elements per line of the weights' map: it sees a (row tile, group) block of the tiled layout
/// (2 KiB) as 8 lines of this many (a box dimension holds at most 256 elements).
const TILE_LINE: u64 = 128;
/// 16-bit elements of a (16-row tile, group of 64 columns) block.
const TILE_ELEMS: u64 = 16 * 64;

impl GemmMaps {
    /// The maps a launch of `MMA_VARIANTS[variant]` takes (`MMA_WGT`'s, as `new`), none for the
    /// other variants.
    pub fn for_variant(
        variant: usize,
        w: u64,
        rows: usize,
        k: usize,
        xh: u64,
        tokens: usize,
    ) -> Result<Option<Self>, BackendError> {
        if variant == MMA_WGT {
            Self::new(w, rows, k, xh, tokens).map(Some)
        } else {
            Ok(None)
        }
    }

    /// `args` with the maps (when the launch takes them) after the GEMM's arguments.
    pub fn append<'a>(maps: Option<&'a Self>, args: Args<'a>) -> Args<'a> {
        match maps {
            Some(m) => args.arg(&m.weights).arg(&m.inputs),
            None => args,
        }
    }

    /// The maps of a launch over `rows` × `k` 16-bit weights at `w` in the tiled layout
    /// (`weight_tiles`: rows padded to 16, `k` a multiple of 64) and `tokens` prepared input
    /// rows of `k` at `xh` (to_half in the wgmma order).
    ///
    /// - weights: the tiled matrix as [row tile][8 × groups][128]: the box 8 × 8 × 128 at
    ///   (row0 / 16, 8 × group, 0) is a group's 8 row tiles, 16 KiB in the stage's order; row
    ///   tiles past the matrix arrive as zeros.
    /// - inputs: [tokens][k] with the 128-byte swizzle: the box 128 × 64 at (t0, 64 × group) is
    ///   the stage's inputs in the layout the wgmma descriptors read; tokens past `tokens` arrive
    ///   as zeros.
    pub fn new(
        w: u64,
        rows: usize,
        k: usize,
        xh: u64,
        tokens: usize,
    ) -> Result<Self, BackendError> {
        if !k.is_multiple_of(64)
            || rows == 0
            || tokens == 0
            || !w.is_multiple_of(16)
            || !xh.is_multiple_of(16)
        {
            return Err(BackendError::Device(format!(
                "tensor copies need K a multiple of 64, rows and tokens, 16-byte aligned \
                 operands (K {k}, {rows} rows, {tokens} tokens, w {w:#x}, x {xh:#x})"
            )));
        }
        let (groups, tiles) = ((k / 64) as u64, rows.div_ceil(16) as u64);
        let weights = encode(
            w,
            &[TILE_LINE, 8 * groups, tiles],
            &[TILE_LINE * 2, groups * TILE_ELEMS * 2],
            &[TILE_LINE as u32, 8, 8],
            sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_NONE,
        )?;
        let inputs = encode(
            xh,
            &[k as u64, tokens as u64],
            &[k as u64 * 2],
            &[64, 128],
            sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
        )?;
        Ok(GemmMaps { weights, inputs })
    }
}

/// A tiled map of 16-bit elements at `base`: `dims` innermost first, the byte strides of every
/// dimension but the first, the box copied per load.
fn encode<const R: usize>(
    base: u64,
    dims: &[u64; R],
    strides: &[u64],
    boxes: &[u32; R],
    swizzle: sys::CUtensorMapSwizzle,
) -> Result<sys::CUtensorMap, BackendError> {
    assert_eq!(strides.len() + 1, R, "a stride per outer dimension");
    let mut map = sys::CUtensorMap { opaque: [0; 16] };
    let ones = [1u32; R];
    // SAFETY: cuTensorMapEncodeTiled only writes the 128-byte `map` and reads R dims, R - 1
    // strides, R box sizes and R element strides from the arrays passed (each of that length);
    // it encodes the address without dereferencing it.
    unsafe {
        sys::cuTensorMapEncodeTiled(
            &mut map,
            sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_UINT16,
            R as u32,
            base as *mut std::ffi::c_void,
            dims.as_ptr(),
            strides.as_ptr(),
            boxes.as_ptr(),
            ones.as_ptr(),
            sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
            swizzle,
            sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        )
    }
    .result()
    .map_err(|e| BackendError::Device(format!("tensor map ({R}-d, dims {dims:?}): {e}")))?;
    Ok(map)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_the_copies_cannot_take_are_refused_before_the_driver() {
        // K not a multiple of 64, no tokens, a misaligned operand: a clear error, no encoding.
        for (w, k, xh, tokens) in [
            (0x1000, 96, 0x2000, 8),
            (0x1000, 128, 0x2000, 0),
            (0x1008, 128, 0x2000, 8),
        ] {
            let e = GemmMaps::new(w, 256, k, xh, tokens).err().expect("refused");
            assert!(e.to_string().contains("tensor copies need"), "{e}");
        }
    }
}

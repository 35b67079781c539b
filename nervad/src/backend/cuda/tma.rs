//! Tensor maps (TMA descriptors): how the wgmma GEMM staged by tensor copies (`mma_*_wgt`,
//! kernels/mma.cuh) sees the weights and the inputs, and how the serial decode attention
//! (`attn_decode_serial`, kernels/attention.cu) sees the paged KV pool.
//!
//! Encoding is host arithmetic only (`cuTensorMapEncodeTiled` touches no device), so a launch
//! encodes its maps for its own pointers and token count: cheap, and a captured graph keeps the
//! maps by value with the other arguments.

use cudarc::driver::sys;

use super::driver::Args;
use super::launch_shape::{
    ATTN_TILE, MMA_GEMM_TOKENS, MMA_WGT, MMA_WGT_MID, MMA_WGT_WIDE, gemm_tile_tokens,
};
use crate::backend::BackendError;

/// The two tensor maps a `wgt`, `wgt192` or `wgt144` launch takes after the GEMM's arguments
/// (`wmap`, `xmap`).
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
    /// The maps a launch of `MMA_VARIANTS[variant]` takes (`MMA_WGT`'s, `MMA_WGT_WIDE`'s and
    /// `MMA_WGT_MID`'s, as `new` with their tiles' tokens), none for the other variants.
    pub fn for_variant(
        variant: usize,
        w: u64,
        rows: usize,
        k: usize,
        xh: u64,
        tokens: usize,
    ) -> Result<Option<Self>, BackendError> {
        match variant {
            MMA_WGT | MMA_WGT_WIDE | MMA_WGT_MID => {
                let tile = gemm_tile_tokens(variant).unwrap_or(MMA_GEMM_TOKENS);
                Self::new(w, rows, k, xh, tokens, tile).map(Some)
            }
            _ => Ok(None),
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
    /// rows of `k` at `xh` (to_half in the wgmma order), staged `tile` tokens at a time.
    ///
    /// - weights: the tiled matrix as [row tile][8 × groups][128]: the box 8 × 8 × 128 at
    ///   (row0 / 16, 8 × group, 0) is a group's 8 row tiles, 16 KiB in the stage's order; row
    ///   tiles past the matrix arrive as zeros.
    /// - inputs: [tokens][k] with the 128-byte swizzle: the box `tile` × 64 at (t0, 64 × group)
    ///   is the stage's inputs in the layout the wgmma descriptors read; tokens past `tokens`
    ///   arrive as zeros.
    pub fn new(
        w: u64,
        rows: usize,
        k: usize,
        xh: u64,
        tokens: usize,
        tile: usize,
    ) -> Result<Self, BackendError> {
        if !k.is_multiple_of(64)
            || rows == 0
            || tokens == 0
            || !(8..=256).contains(&tile)
            || !tile.is_multiple_of(8)
            || !w.is_multiple_of(16)
            || !xh.is_multiple_of(16)
        {
            return Err(BackendError::Device(format!(
                "tensor copies need K a multiple of 64, rows and tokens, a tile of 8-256 tokens \
                 in whole 8s, 16-byte aligned operands (K {k}, {rows} rows, {tokens} tokens, \
                 tile {tile}, w {w:#x}, x {xh:#x})"
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
            &[64, tile as u32],
            sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
        )?;
        Ok(GemmMaps { weights, inputs })
    }
}

/// The paged KV pool as attn_decode_serial's tensor copies see it: a 2-d map of rows of
/// `kv_dim` elements (every (page, layer, kind, position) of the pool's
/// [pages][layers][2][page_tokens][kv_dim] layout), box `page_tokens` rows × 64 dims with the
/// 128-byte swizzle (attn_mma.cuh's TileSwizzled). None where the copies cannot stage whole
/// tiles that way (a tile not made of whole pages, head dims not made of 64-dim boxes or past
/// the tile buffers' 128, boxes that break the swizzle's 1 KiB period); the kernel then stages
/// with cp.async.
pub fn kv_pool_map(
    pool: u64,
    pages: usize,
    layers: usize,
    page_tokens: usize,
    kv_dim: usize,
    head_dim: usize,
) -> Result<Option<sys::CUtensorMap>, BackendError> {
    let rows = (pages * layers * 2 * page_tokens) as u64;
    if page_tokens == 0
        || !ATTN_TILE.is_multiple_of(page_tokens)
        || !page_tokens.is_multiple_of(8)
        || !head_dim.is_multiple_of(64)
        || head_dim > 128
        || !(kv_dim * 2).is_multiple_of(16)
        || !pool.is_multiple_of(16)
        || rows == 0
        || rows >= 1 << 32
    {
        return Ok(None);
    }
    encode(
        pool,
        &[kv_dim as u64, rows],
        &[kv_dim as u64 * 2],
        &[64, page_tokens as u32],
        sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
    )
    .map(Some)
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
    fn kv_pools_whose_tiles_are_not_whole_page_boxes_get_no_map() {
        // Pages that do not divide a tile, head dims that are no whole 64-dim boxes or wider
        // than the tile buffers, boxes that break the swizzle's 1 KiB period (4 rows of 128
        // bytes): cp.async stages those. None of these reaches the driver.
        for (page_tokens, head_dim) in [
            (12, 128),
            (64, 128),
            (16, 256),
            (16, 80),
            (4, 128),
            (0, 128),
        ] {
            let map = kv_pool_map(0x10000, 64, 2, page_tokens, 8 * head_dim, head_dim);
            assert!(map.expect("no error").is_none(), "{page_tokens} {head_dim}");
        }
    }

    #[test]
    fn shapes_the_copies_cannot_take_are_refused_before_the_driver() {
        // K not a multiple of 64, no tokens, a misaligned operand, a tile past a box's 256 rows
        // or not of whole 8-token n-tiles: a clear error, no encoding.
        for (w, k, xh, tokens, tile) in [
            (0x1000, 96, 0x2000, 8, 128),
            (0x1000, 128, 0x2000, 0, 128),
            (0x1008, 128, 0x2000, 8, 192),
            (0x1000, 128, 0x2000, 8, 320),
            (0x1000, 128, 0x2000, 8, 100),
        ] {
            let e = GemmMaps::new(w, 256, k, xh, tokens, tile)
                .err()
                .expect("refused");
            assert!(e.to_string().contains("tensor copies need"), "{e}");
        }
    }
}

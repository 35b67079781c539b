//! The tiled weight layout of the tensor-core projections (`kernels/mma.cuh`, MMA_TILED).
//!
//! An mma warp loads, per group of 64 columns of a 16-row tile, four 16-byte chunks per thread:
//! (row half h, column half q) for lane (g, c) = rows 8h + g, columns 32q + 8c .. +7. Stored
//! row-major, each of those warp-wide loads touches 8 rows of 64 bytes, K × 2 bytes apart. Tiled,
//! the 2 KiB of a (row tile, group) lie together in load order, so each warp-wide load reads 512
//! contiguous bytes and a block's 8 warps stream 16 KiB in one run. Only addresses change: every
//! thread loads the same 16 bytes as from the row-major matrix, so the results keep their bits.
//!
//! Rows are padded with zeros to a multiple of 16 and columns to a multiple of 64 (the
//! row-major kernel reads zeros there too).

/// Rows per tile (the mma's M).
pub const TILE_ROWS: usize = 16;
/// Columns per group (four chained m16n8k16).
pub const TILE_COLS: usize = 64;
/// 16-bit elements per 16-byte chunk.
const CHUNK: usize = 8;

/// Bytes of an `rows` × `cols` matrix of 16-bit weights in the tiled layout.
pub fn tiled_bytes(rows: usize, cols: usize) -> usize {
    rows.next_multiple_of(TILE_ROWS) * cols.next_multiple_of(TILE_COLS) * 2
}

/// Element offset of weight (r, k) in the tiled layout of a matrix of `cols` columns: the
/// address formula of `load_weights` in `kernels/mma.cuh` (MMA_TILED) and of `embed_tiled_*`.
pub fn tiled_offset(r: usize, k: usize, cols: usize) -> usize {
    let groups = cols.div_ceil(TILE_COLS);
    let (tile, h, g) = (r / TILE_ROWS, (r % TILE_ROWS) / 8, r % 8);
    let (group, q, c, e) = (
        k / TILE_COLS,
        (k % TILE_COLS) / 32,
        (k % 32) / CHUNK,
        k % CHUNK,
    );
    let lane = g * 4 + c;
    (((tile * groups + group) * 4 + h * 2 + q) * 32 + lane) * CHUNK + e
}

/// The row-major 16-bit matrix stacked from `parts` (each whole rows of `cols` elements, in
/// order: e.g. q, k and v) written into `out` in the tiled layout, padding included. Row tiles
/// are independent: large matrices are tiled on all cores. `out` is reused between matrices
/// without a memset of the whole: every element is written, and tiles that hold padding are
/// zeroed first.
pub fn tile_rows(parts: &[&[u8]], cols: usize, out: &mut Vec<u8>) {
    let row_bytes = cols * 2;
    assert!(
        cols.is_multiple_of(CHUNK) && parts.iter().all(|p| p.len().is_multiple_of(row_bytes)),
        "whole rows of 16-byte chunks"
    );
    let rows: usize = parts.iter().map(|p| p.len() / row_bytes).sum();
    out.resize(tiled_bytes(rows, cols), 0);
    if rows == 0 {
        return;
    }
    // Row r of the stacked matrix.
    let row = |mut r: usize| -> &[u8] {
        for p in parts {
            let n = p.len() / row_bytes;
            if r < n {
                return &p[r * row_bytes..(r + 1) * row_bytes];
            }
            r -= n;
        }
        unreachable!("row within the stacked parts")
    };
    let tile_bytes = TILE_ROWS * cols.next_multiple_of(TILE_COLS) * 2;
    let tiles = rows.div_ceil(TILE_ROWS);
    let workers = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(tiles.div_ceil(64))
        .max(1);
    let per_worker = tiles.div_ceil(workers);
    std::thread::scope(|s| {
        for (w, chunk) in out.chunks_mut(per_worker * tile_bytes).enumerate() {
            s.spawn(move || {
                let first_tile = w * per_worker;
                for (i, tile) in chunk.chunks_mut(tile_bytes).enumerate() {
                    let t = first_tile + i;
                    if (t + 1) * TILE_ROWS > rows || !cols.is_multiple_of(TILE_COLS) {
                        tile.fill(0);
                    }
                    for rr in 0..TILE_ROWS {
                        let r = t * TILE_ROWS + rr;
                        if r >= rows {
                            break;
                        }
                        let src = row(r);
                        for k in (0..cols).step_by(CHUNK) {
                            // Offset within this tile (tile index 0 of a one-tile matrix).
                            let at = tiled_offset(rr, k, cols) * 2;
                            tile[at..at + 16].copy_from_slice(&src[k * 2..k * 2 + 16]);
                        }
                    }
                }
            });
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn element(m: &[u8], i: usize) -> u16 {
        u16::from_le_bytes([m[2 * i], m[2 * i + 1]])
    }

    #[test]
    fn every_weight_lands_where_the_kernel_loads_it() {
        // Odd shapes: a partial last tile and a partial last group; over 64 tiles (2,100 rows)
        // the tiles are shared out between threads. The output buffer is reused from the
        // previous shape, as at upload, so stale bytes would show in the padding.
        let mut tiled = vec![0xa5; 1 << 20];
        for (rows, cols, split) in [
            (40, 200, 7),
            (16, 64, 16),
            (300, 1024, 100),
            (2100, 160, 1000),
            (17, 8, 3),
        ] {
            let m: Vec<u8> = (0..rows * cols)
                .flat_map(|i| ((i * 7 + 3) as u16).to_le_bytes())
                .collect();
            let (a, b) = m.split_at(split * cols * 2);
            tile_rows(&[a, b], cols, &mut tiled);
            assert_eq!(tiled.len(), tiled_bytes(rows, cols));
            let mut seen = vec![false; tiled.len() / 2];
            for r in 0..rows {
                for k in 0..cols {
                    let at = tiled_offset(r, k, cols);
                    assert_eq!(element(&tiled, at), element(&m, r * cols + k), "({r}, {k})");
                    assert!(
                        !std::mem::replace(&mut seen[at], true),
                        "({r}, {k}) collides"
                    );
                }
            }
            let padding = seen.iter().enumerate().filter(|(_, s)| !**s);
            assert!(padding.into_iter().all(|(i, _)| element(&tiled, i) == 0));
        }
    }

    #[test]
    fn a_warp_load_is_512_contiguous_bytes() {
        // Lane (g, c) of load (h, q) in group 3 of tile 2: consecutive lanes, consecutive chunks.
        let cols = 4096;
        for (h, q) in [(0, 0), (0, 1), (1, 0), (1, 1)] {
            let first = tiled_offset(2 * 16 + 8 * h, 3 * 64 + 32 * q, cols);
            for lane in 0..32 {
                let (g, c) = (lane / 4, lane % 4);
                let at = tiled_offset(2 * 16 + 8 * h + g, 3 * 64 + 32 * q + 8 * c, cols);
                assert_eq!(at, first + lane * 8);
            }
        }
    }
}

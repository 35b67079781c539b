//! How each kernel is launched: the projections' variants, tiles, chain splits and grids
//! (`mma_launch`, `to_half_grid`), and the attention kernels' shapes and shared memory. Every
//! constant here mirrors one in `kernels/` (named beside it); none changes a result's bits.

use super::tuning::{GemmSplit, KernelTuning, WgStream, WideTiles};

/// Query tokens' attention span is cut into this many partial blocks per kv head (fixed, so
/// results never depend on the batch).
pub(super) const ATTN_SPLITS: u32 = 16;
/// Threads per attention block (`ATTN_THREADS` in kernels/attention.cu).
pub(super) const ATTN_THREADS: u32 = 256;
/// Threads per block of attn_decode_serial_pair (`ATTN_SERIAL_PAIR_THREADS`): two blocks per
/// SM (attn_decode_serial: ATTN_THREADS, one per SM).
pub(super) const ATTN_SERIAL_PAIR_THREADS: u32 = 128;
/// (token, query head) rows of one attn_prefill block: 16 per warp (attention.cu's
/// ATTN_PREFILL_ROWS).
pub(super) const ATTN_PREFILL_ROWS: usize = 128;
/// Dynamic shared memory of an attn_prefill block (`fold`: of attn_prefill_fold): the rows'
/// queries and the KV tiles it stages, keys and values, rows of head_dim + 8 16-bit elements
/// (attention.cu): two stages of one tile, or of two for the fold (PREFILL_TPI).
pub(super) fn attn_prefill_shared(head_dim: usize, fold: bool) -> u32 {
    let stages = if fold { 4 } else { 2 };
    ((ATTN_PREFILL_ROWS + stages * 2 * ATTN_TILE) * (head_dim + 8) * 2) as u32
}
/// Dynamic shared memory of an attn_prefill_wg block (head dim 128): from the first 1 KiB
/// boundary (the swizzle's period), the rows' queries and two stages of two tiles, keys and
/// values, in rows of 128 dims without padding (attention.cu's TileSwizzled).
pub(super) fn attn_prefill_wg_shared() -> u32 {
    (1024 + (ATTN_PREFILL_ROWS + 4 * 2 * ATTN_TILE) * 128 * 2) as u32
}
/// Dynamic shared memory of an attn_decode_serial block: one tile (keys and values) for each
/// computing warp, rows sized for the kernel's largest head dim (attention.cu's
/// ATTN_SERIAL_WARPS and ATTN_MAXD) of `threads`: every warp of the block up to head dim 128,
/// half of them past it, aligned for the tensor copies' swizzle.
pub(super) fn attn_serial_shared(head_dim: usize, threads: u32) -> u32 {
    let maxd = if matches!(head_dim, 64 | 128 | 256) {
        head_dim
    } else {
        ATTN_GENERAL_DIM
    };
    let warps = threads as usize / if maxd <= 128 { 32 } else { 64 };
    // Keys and values each rounded to 1 KiB, from the first 1 KiB boundary (the period of the
    // tensor copies' swizzle).
    let half = (ATTN_TILE * (maxd + 8) * 2).next_multiple_of(1024);
    (warps * 2 * half + 1024) as u32
}
/// Dynamic shared memory for attn_decode_serial's split partials (attention.cu's SharedPartials):
/// o, then (m, l), of every split of the block's `group` query heads.
pub(super) fn attn_serial_parts(group: usize, head_dim: usize) -> u32 {
    (group * ATTN_SPLITS as usize * (head_dim + 2) * 4) as u32
}
/// Blocks per (token group, kv head) of attn_prefill, each taking every so-many-th split: enough
/// for four blocks per SM (two run at once; the rest even out causal attention's unequal token
/// groups), no more than the splits. Which block runs a split changes none of its bits.
pub(super) fn prefill_split_blocks(group_blocks: usize, sms: usize) -> u32 {
    (4 * sms)
        .div_ceil(group_blocks.max(1))
        .clamp(1, ATTN_SPLITS as usize) as u32
}
/// Key/value positions per attention tile (attn_mma.cuh's ATTN_TILE).
pub(super) const ATTN_TILE: usize = 32;
/// Head dims of the general attention kernels (attention.cu's ATTN_GENERAL_DIM): multiples of
/// 16 up to this; 256 has its own.
pub(super) const ATTN_GENERAL_DIM: usize = 128;
/// The mma.cuh variants of a projection, in `mma_variant`'s numbering (kernel
/// `mma_{mode}_{dtype}_{variant}`), then the deep one-n-tile variant (`MMA_DEEP`), the
/// one-n-tile variant on prepared inputs (`MMA_HALF`), the token-split multi-tile ones and the
/// fixed-order GEMM (`MMA_GEMM`), then the one-n-tile variants' ring forms (`ring_variant`) and
/// persistent forms (`persistent_variant`), then `wgt` on 192- and 144-token tiles
/// (`MMA_WGT_WIDE`, `MMA_WGT_MID`).
pub const MMA_VARIANTS: [&str; 23] = [
    "n1", "n2", "n4", "n8m2", "n1d", "n1h", "n2s", "n4s", "n8m2s", "gemm", "gemm64", "wg", "wg64",
    "wgs", "wgt", "wg64s", "n1r", "n1dr", "n1hr", "n1p", "n1hp", "wgt192", "wgt144",
];
/// Index of the deep one-n-tile variant in `MMA_VARIANTS` (16 rows per block, like n1).
pub const MMA_DEEP: usize = 4;
/// Index of the one-n-tile variant on prepared inputs in `MMA_VARIANTS`.
pub const MMA_HALF: usize = 5;
/// Index of the first token-split variant (n2s, then n4s, n8m2s) in `MMA_VARIANTS`.
pub const MMA_SPLIT: usize = 6;
/// Index of the fixed-order GEMM in `MMA_VARIANTS` (128 rows × `MMA_GEMM_TOKENS` per block).
pub const MMA_GEMM: usize = 9;
/// Index of the GEMM on 64-token tiles in `MMA_VARIANTS`.
pub const MMA_GEMM_NARROW: usize = 10;
/// Index of the wgmma GEMM in `MMA_VARIANTS` (then its 64-token tiles): the GEMM's launches
/// where `KernelTuning::wgmma` holds.
pub const MMA_WG: usize = 11;
/// Index of the warp-specialized wgmma GEMM in `MMA_VARIANTS` (128-token tiles, a producer
/// warpgroup beside the two computing ones): `wg`'s launches where
/// `KernelTuning::wg_specialized` holds, with `MMA_WGS_THREADS` threads. (On 64-token tiles it
/// measured 2–6% slower than `wg64`: 2026-11-26 eleventh session.)
pub const MMA_WGS: usize = 13;
/// Index of the warp-specialized wgmma GEMM staged by tensor copies (TMA) in `MMA_VARIANTS`:
/// `wgs` with one producer thread issuing two bulk tensor copies per group (tiled weights
/// only; its launches take the two tensor maps of `tma::GemmMaps` after the GEMM's arguments),
/// the 128-token wgmma GEMM's launches where `KernelTuning::wg_tma` holds. (On 64-token tiles
/// it measured no faster than `wg64`, and in clusters of two blocks sharing the weights'
/// copies slower than alone: 2026-11-26 twelfth session.)
pub const MMA_WGT: usize = 14;
/// Index of the persistent 64-token wgmma GEMM in `MMA_VARIANTS` (`wg64s`): `wg64`'s launches
/// that `KernelTuning::wg_stream` picks, in `wg_stream_blocks` blocks that share the launch's
/// tiles chain by chain (mma.cuh's StreamShare), each streaming its groups through one pipeline.
pub const MMA_WG_STREAM: usize = 15;
/// Index in `MMA_VARIANTS` of the ring form of n1 (then of n1d and n1h): the same launch with
/// the weights streamed through shared memory (`KernelTuning::weight_ring`).
pub const MMA_RING: usize = 16;

/// Index in `MMA_VARIANTS` of the persistent form of n1 (then of n1h): each block walks the
/// row tiles b, b + blocks, ..., its weight loads running on from one tile into the next
/// (`KernelTuning::n1_persistent`).
pub const MMA_PERSIST: usize = 19;
/// Index in `MMA_VARIANTS` of `wgt` on 192-token tiles (`wgt192`): a third fewer weight bytes
/// staged per multiply than on 128-token tiles, in 3 stages instead of 5 (their 96 accumulators
/// and 96 sums per thread leave no room for more). Launched where
/// `KernelTuning::wg_wide_from` asks for it (`mma_launch`).
pub const MMA_WGT_WIDE: usize = 21;
/// Index in `MMA_VARIANTS` of `wgt` on 144-token tiles (`wgt144`): a ninth fewer weight bytes
/// staged per multiply than on 128-token tiles, in 4 stages. Launched instead of `wgt192` where
/// `KernelTuning::wg_wide_tokens` is 144.
pub const MMA_WGT_MID: usize = 22;

/// Blocks per SM of n1 and n1h (mma.cuh's MMA_MIN_BLOCKS: registers ≤ 85): one wave of them is
/// as many blocks as a persistent launch takes.
pub const MMA_N1_BLOCKS_PER_SM: usize = 3;

/// The persistent form of a one-n-tile launch of `variant` (n1 or n1h) over `tiles` row tiles
/// on `sms` SMs where `tuning` asks for it and the tiles are more than its blocks
/// (`persistent_blocks`); the variant itself otherwise.
pub fn persistent_variant(
    variant: usize,
    tiles: usize,
    sms: usize,
    tuning: &KernelTuning,
) -> usize {
    let more = tiles > persistent_blocks(tiles, sms, tuning) as usize;
    match variant {
        0 | MMA_HALF if tuning.n1_persistent && more => {
            MMA_PERSIST + usize::from(variant == MMA_HALF)
        }
        v => v,
    }
}

/// Blocks of a persistent one-n-tile launch over `tiles` row tiles: one wave
/// (`MMA_N1_BLOCKS_PER_SM` per SM) or `KernelTuning::n1_persistent_blocks`, at most the tiles.
pub fn persistent_blocks(tiles: usize, sms: usize, tuning: &KernelTuning) -> u32 {
    let wave = match tuning.n1_persistent_blocks {
        0 => MMA_N1_BLOCKS_PER_SM * sms,
        n => n as usize,
    };
    wave.min(tiles) as u32
}

/// The form a one-n-tile launch of `variant` (n1, n1d or n1h) over `tiles` row tiles takes
/// under `tuning`: its ring form (`ring_variant`), else its persistent form
/// (`persistent_variant`), else the variant itself. What the backend launches.
pub fn one_tile_form(variant: usize, tiles: usize, sms: usize, tuning: &KernelTuning) -> usize {
    persistent_variant(
        ring_variant(variant, tiles, sms, tuning),
        tiles,
        sms,
        tuning,
    )
}

/// The ring form of a one-n-tile launch of `variant` (n1, n1d or n1h) in `blocks` blocks on
/// `sms` SMs where `tuning` asks for it; the variant itself otherwise.
pub fn ring_variant(variant: usize, blocks: usize, sms: usize, tuning: &KernelTuning) -> usize {
    let (plain, deep) = (tuning.weight_ring, tuning.weight_ring_deep);
    match variant {
        0 if plain.takes(blocks, sms) => MMA_RING,
        MMA_DEEP if deep.takes(blocks, sms) => MMA_RING + 1,
        MMA_HALF if plain.takes(blocks, sms) => MMA_RING + 2,
        v => v,
    }
}

/// Dynamic shared memory of the ring forms of n1 and n1h (mma.cuh `MMA_RING`: 8 warps × 3
/// groups × 2 KiB; three blocks per SM, as their registers allow).
pub const MMA_RING_SHARED: u32 = 8 * 3 * 2048;
/// The same for n1d (`MMA_RING_DEEP`: 4 groups per warp; two blocks per SM).
pub const MMA_RING_DEEP_SHARED: u32 = 8 * 4 * 2048;
/// Per ring form (n1r, n1dr, n1hr: `MMA_VARIANTS[MMA_RING + i]`), its dynamic shared memory and
/// the blocks per SM its registers allow.
pub const MMA_RING_FORMS: [(u32, u32); 3] = [
    (MMA_RING_SHARED, 3),
    (MMA_RING_DEEP_SHARED, 2),
    (MMA_RING_SHARED, 3),
];

/// The shared-memory carveout (percent of the SM's shared memory and L1) that fits `blocks`
/// blocks of `dynamic` bytes of dynamic shared memory each (plus their static arrays and the
/// 1 KiB the system reserves per block) on compute capability `arch`, leaving the rest to L1,
/// which the projections' inputs are read through.
pub fn ring_carveout(arch: u32, blocks: u32, dynamic: u32) -> i32 {
    const STATIC_AND_RESERVED: u32 = 4096;
    let per_sm: u32 = match arch {
        90 => 228 << 10,
        80 | 87 => 164 << 10,
        _ => 100 << 10,
    };
    (blocks * (dynamic + STATIC_AND_RESERVED) * 100)
        .div_ceil(per_sm)
        .min(100) as i32
}

/// Threads per block of `MMA_WGS`, `MMA_WGT`, `MMA_WGT_WIDE` and `MMA_WGT_MID` (mma.cuh's
/// WGS_THREADS); every other variant runs 256.
pub const MMA_WGS_THREADS: u32 = 384;

/// Threads per block of a launch of `MMA_VARIANTS[variant]`.
pub const fn mma_threads(variant: usize) -> u32 {
    if matches!(variant, MMA_WGS | MMA_WGT | MMA_WGT_WIDE | MMA_WGT_MID) {
        MMA_WGS_THREADS
    } else {
        256
    }
}
/// Tokens per block of the GEMM (mma.cuh's BN of `gemm`).
pub const MMA_GEMM_TOKENS: usize = 128;
/// Tokens per block of the narrow GEMM (`gemm64`).
pub const MMA_GEMM_NARROW_TOKENS: usize = 64;
/// Tokens per block of `wgt192` (`MMA_WGT_WIDE`).
pub const MMA_GEMM_WIDE_TOKENS: usize = 192;
/// Tokens per block of `wgt144` (`MMA_WGT_MID`).
pub const MMA_GEMM_MID_TOKENS: usize = 144;

/// Tokens per tile of a GEMM launch of `MMA_VARIANTS[variant]`; None for the other variants.
pub const fn gemm_tile_tokens(variant: usize) -> Option<usize> {
    match variant {
        MMA_GEMM | MMA_WG | MMA_WGS | MMA_WGT => Some(MMA_GEMM_TOKENS),
        MMA_GEMM_NARROW | MMA_WG_STREAM => Some(MMA_GEMM_NARROW_TOKENS),
        v if v == MMA_WG + 1 => Some(MMA_GEMM_NARROW_TOKENS),
        MMA_WGT_WIDE => Some(MMA_GEMM_WIDE_TOKENS),
        MMA_WGT_MID => Some(MMA_GEMM_MID_TOKENS),
        _ => None,
    }
}

/// Dynamic shared memory of a GEMM launch of `tokens`-token tiles (mma.cuh's
/// `GemmTile<tokens>::SMEM`): 3 stages of 16 KiB of weights and tokens / 8 KiB of inputs, and
/// each thread's pair-opening chain (2 × tokens / 16 × 4 floats per thread of 256).
pub const fn mma_gemm_shared(tokens: usize) -> u32 {
    (3 * ((16 << 10) + (tokens / 8) * 1024) + 256 * 2 * (tokens / 16) * 4 * 4) as u32
}

/// Dynamic shared memory of a wgmma GEMM launch of `tokens`-token tiles (mma.cuh's
/// `WgTile<tokens>::SMEM`): its stages (8 on 64-token tiles, 4 on 144-token ones, 3 on 192,
/// else 5) of 16 KiB of weights and tokens × 128 bytes of inputs, one region for each thread's
/// pair-opening chain (tokens / 2 floats per thread of 256) or the finished 128 × (tokens +
/// 1)-float tile, and 1 KiB to align the stages: 225.5 KiB on 64- and 128-token tiles, 209.5 on
/// 144, 217.5 on 192.
pub const fn wg_gemm_shared(tokens: usize) -> u32 {
    let stages = match tokens {
        64 => 8,
        144 => 4,
        192 => 3,
        _ => 5,
    };
    let chains = 256 * (tokens / 2) * 4;
    let tile = 128 * (tokens + 1) * 4;
    (stages * ((16 << 10) + tokens * 128) + if chains > tile { chains } else { tile } + 1024) as u32
}

/// Dynamic shared memory of a `wg64s` launch (mma.cuh's `WgStreamTile::SMEM`): `wg64`'s 8
/// stages, one region for the pair-opening chains or the finished 128 × 65-float tile, and 1 KiB
/// to align the stages: 225.5 KiB.
pub const WG_STREAM_SHARED: u32 = {
    let chains = 256 * 32 * 4;
    let tile = 128 * 65 * 4;
    (8 * ((16 << 10) + 64 * 128) + if chains > tile { chains } else { tile } + 1024) as u32
};

/// Blocks of a `wg64s` launch over `tiles` tiles of 128 rows × 64 tokens: one per SM (or
/// `cap`, when not 0), no more than the tiles' chains (8 each). Its shared tiles (fewer than the
/// blocks) fit the split workspace and counters (`GEMM_SPLIT_MAX_BLOCKS_PER_SM` per SM).
pub fn wg_stream_blocks(tiles: usize, sms: usize, cap: u32) -> u32 {
    let most = if cap == 0 {
        sms
    } else {
        (cap as usize).min(sms)
    };
    (tiles * 8).min(most).max(1) as u32
}

/// Whether the persistent launch (`wg_stream_blocks` blocks) of `tiles` 64-token tiles beats
/// `wg64`'s `splits` blocks per tile on `sms` multiprocessors: the most chains one SM streams,
/// whole tiles' 8 each plus its share of the leftover tiles' chains, fewer than the block waves
/// × each block's chains. (Where they tie, sharing tiles only adds their slots and merges: on
/// qwen3-8b's o and down, 32 tiles that 4 splits spread over 128 SMs, the persistent launch
/// measured 14% slower, ncu, 2026-11-26 fourteenth session.)
pub fn wg_stream_gains(tiles: usize, splits: usize, sms: usize, blocks: usize) -> bool {
    let chains = 8usize;
    let split_cost = (tiles * splits).div_ceil(sms) * (chains / splits.max(1));
    let per = tiles / blocks;
    let stream_cost = per * chains + ((tiles - per * blocks) * chains).div_ceil(blocks);
    stream_cost < split_cost
}

/// The blocks of a persistent (`wg64s`) launch of `tiles` 64-token tiles that `wg64` would run
/// in `splits` blocks each, or None where `wg64` runs it: per `KernelTuning::wg_stream`, and
/// never under fixed splits (the bit-identity tests' `wg64` as asked).
pub fn wg_stream_launch(
    tiles: usize,
    splits: usize,
    sms: usize,
    tuning: &KernelTuning,
) -> Option<u32> {
    if tuning.gemm_split != GemmSplit::Auto {
        return None;
    }
    let blocks = wg_stream_blocks(tiles, sms, tuning.wg_stream_blocks);
    let on = match tuning.wg_stream {
        WgStream::Off => false,
        WgStream::Always => true,
        WgStream::Auto => wg_stream_gains(tiles, splits, sms, blocks as usize),
    };
    on.then_some(blocks)
}

/// Blocks of a warp-specialized wgmma GEMM launch (`wgs`, `wgt`) of `units` (tile, chain split)
/// units: one per unit, or under `KernelTuning::wg_persistent` at most one per SM (or
/// `wg_persistent_blocks` where that is not 0), block b walking units b, b + blocks, ...
pub fn wgs_blocks(units: usize, sms: usize, tuning: &KernelTuning) -> u32 {
    let cap = match (tuning.wg_persistent, tuning.wg_persistent_blocks) {
        (false, _) => units,
        (true, 0) => sms,
        (true, n) => n as usize,
    };
    units.min(cap).max(1) as u32
}

/// Dynamic shared memory of an `MMA_GEMM` launch: 160 KiB.
pub const MMA_GEMM_SHARED: u32 = mma_gemm_shared(MMA_GEMM_TOKENS);

/// Which of `MMA_VARIANTS` runs a launch of `t` tokens, and its rows per block. One pass reads
/// the weights once: up to 64 tokens do; past 32 the blocks take 32 rows so that fewer of them
/// re-read the prepared inputs, and past 64 they make one pass per 64 tokens. Past 8 tokens the
/// inputs come prepared by to_half.
pub fn mma_variant(t: usize) -> (usize, u32) {
    match t {
        0..=8 => (0, 16),
        9..=16 => (1, 16),
        17..=32 => (2, 16),
        _ => (3, 32),
    }
}

/// How a tensor-core projection launch is shaped (`mma_launch`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MmaLaunch {
    /// Index into `MMA_VARIANTS`.
    pub variant: usize,
    /// Weight rows per block.
    pub rows: u32,
    /// Blocks per row tile, each taking every `token_tiles`-th token tile (1: one block walks
    /// all tokens).
    pub token_tiles: u32,
    /// Inputs prepared by to_half first.
    pub prepared: bool,
    /// GEMM only: blocks per split tile sharing its chains (1, 4 or 8; `gemm_plan`).
    pub splits: u32,
    /// GEMM only: how many tiles come first in one block each, before the split ones (0: every
    /// tile split `splits` ways; `gemm_plan`).
    pub whole: u32,
}

impl MmaLaunch {
    /// The GEMM kernels' `split_plan` argument (mma.cuh's SplitUnit): `splits` in the low 4
    /// bits, `whole` above.
    pub fn split_plan(&self) -> i32 {
        (self.splits | self.whole << 4) as i32
    }

    /// Blocks (or a persistent launch's units) of a GEMM launch of `tiles` tiles: the whole
    /// ones, then `splits` per split tile.
    pub fn units(&self, tiles: u32) -> u32 {
        self.whole + (tiles - self.whole) * self.splits
    }
}

/// Most blocks a chain-split GEMM launch may have, per SM: the workspace (`Bufs::gemm_ws`) holds
/// one 128 × 128 f32 partial tile per block, 64 KiB each (on 192-token tiles, whose partials
/// take 96 KiB, two thirds as many: `gemm_plan`).
pub const GEMM_SPLIT_MAX_BLOCKS_PER_SM: usize = 8;

/// A block's time on one GEMM tile width: `per_k` µs per element of K it reduces (its share of
/// the chains) plus `fixed` µs (pipeline ramp, epilogue, a split's partial and merge), plus
/// `split` µs more where the block shares its tile. Fitted to qwen3-8b's o projection on the
/// H200 (`gpu_kernels`, 2026-11-26: per wave 119 µs unsplit and 55 µs in 4 splits on 128-token
/// tiles, 69 and 33.5 µs on 64-token tiles; the splits' exchange inside `fixed`); only the
/// ratios matter, to rank launch shapes.
const GEMM_BLOCK_US: [(usize, f64, f64, f64); 2] = [
    (MMA_GEMM_TOKENS, 0.0208, 33.7, 0.0),
    (MMA_GEMM_NARROW_TOKENS, 0.01156, 21.7, 0.0),
];

/// The wgmma GEMM's blocks on launches of at least `KernelTuning::gemm_prompt_fit_from` tokens
/// (prompt chunks and mixed steps), where its tiles run compute-bound: fitted to qwen3-8b's
/// 2,048-token projections on the H200 (`gpu_kernels`, 2026-11-27 twenty-fourth session: per
/// wave of 128-token tiles (`wgt`) 41.5 µs at K = 4,096 and 109.8 at 12,288; of 64-token ones
/// (`wg64`) 30.5 and 83.8;
/// o's and down's 28 tiles left past a wave at 576 tokens, in 4 splits each, took 26–30 µs,
/// which a split's exchange through the workspace, ~12 µs, brings the fit to).
/// `GEMM_BLOCK_US`, fitted to the mma.sync GEMM, ranks the 64-token tile too cheap there: it
/// put q|k|v at 512 tokens on `wg64` (94.7 µs) where `wgt` takes 76.7, and o at 576 (98.7
/// against 80.7). It ranks them as measured from 192 tokens on (H100, 2026-12-07 thirty-seventh
/// session, 128–1,024 tokens); below, the decode batches' launches read their weights from
/// memory once, and the mma.sync fit ranks them as measured.
/// The 144- and 192-token tiles (`wgt144`, `wgt192`) cost 1.13× and 1.53× a 128-token tile's
/// block (H100, 2026-12-08 thirty-ninth session, qwen3-8b's projections at 192–2,048 tokens:
/// per wave at K = 4,096 ~43.4 µs on 144 and ~60–62 on 192 against ~37.6–40.2 on 128), no
/// cheaper per token: they win only by fitting the tokens and the waves better. Priced so, the
/// four projections at 192, 320, 576, 640, 1,088 and 2,048 tokens took 4,647 µs in all where
/// the fastest tile of each took 4,617 and 128- and 64-token tiles alone 4,809.
const GEMM_WG_PROMPT_BLOCK_US: [(usize, f64, f64, f64); 4] = [
    (MMA_GEMM_TOKENS, 0.00834, 7.3, 12.0),
    (MMA_GEMM_NARROW_TOKENS, 0.0065, 3.9, 12.0),
    (MMA_GEMM_MID_TOKENS, 0.00834 * 1.13, 7.3 * 1.13, 12.0),
    (MMA_GEMM_WIDE_TOKENS, 0.00834 * 1.53, 7.3 * 1.53, 12.0),
];

/// The grid of a to_half launch over `m` token rows of `k` columns on `sms` multiprocessors:
/// (rows, slices per row, 1), enough slices for two blocks per SM where the rows are few, each
/// slice at least one 8-column chunk per thread (prefill.cu, 128 threads).
pub fn to_half_grid(m: usize, k: usize, sms: usize) -> (u32, u32, u32) {
    let most = (k / 8 / 128).max(1);
    let slices = (2 * sms).div_ceil(m.max(1)).clamp(1, most);
    (m as u32, slices as u32, 1)
}

/// Estimated time of a GEMM launch of `t` tokens over `r` rows and `k` columns on `sms`
/// multiprocessors (one block each at a time) with `tile`-token tiles, the first `whole` in one
/// block each and the rest in `splits` blocks each: block waves × one block's time, for the
/// whole tiles (whole waves, `gemm_plan`) and then the split ones; priced by
/// `GEMM_WG_PROMPT_BLOCK_US` where `prompt_fit` (the function of that name), else by
/// `GEMM_BLOCK_US`.
fn gemm_cost(
    t: usize,
    (r, k): (usize, usize),
    sms: usize,
    tile: usize,
    (splits, whole): (usize, usize),
    prompt_fit: bool,
) -> f64 {
    let table: &[(usize, f64, f64, f64)] = if prompt_fit {
        &GEMM_WG_PROMPT_BLOCK_US
    } else {
        &GEMM_BLOCK_US
    };
    let (_, per_k, fixed, split_us) = table
        .iter()
        .copied()
        .find(|g| g.0 == tile)
        .unwrap_or(table[0]);
    let block = |s: usize| per_k * k as f64 / s as f64 + fixed + if s > 1 { split_us } else { 0.0 };
    let split = (r.div_ceil(128) * t.div_ceil(tile) - whole) * splits;
    whole.div_ceil(sms) as f64 * block(1) + split.div_ceil(sms) as f64 * block(splits)
}

/// How much cheaper (`gemm_cost`) a tail plan must be than the launch's best plan that splits
/// every tile alike before `gemm_plan` takes it: the fits price a split's exchange through the
/// workspace roughly (the mma.sync one not at all), and a near tie would be left with little
/// else. (Decode batches, where the model ranks gate|up's tail plan 1.5% cheaper at 64 tokens,
/// measured it 0.7% slower: 2026-11-27 twenty-fourth session.)
const GEMM_TAIL_GAIN: f64 = 0.95;

/// How a GEMM launch of `tile`-token tiles shares its tiles' chains: (`splits`, `whole`) of
/// `MmaLaunch` (`prompt_fit`: which fit `gemm_cost` prices it by). Every tile in 1, 4 or 8
/// blocks alike; or, with `tail` (`KernelTuning::gemm_tail`), the tiles of whole waves (of the SMs, or of `tail`
/// tiles where not 0) in one block each and only the last partial wave's tiles in 4 or 8, whose
/// shorter blocks then spread over every SM instead of leaving most idle (qwen3-8b's down at 576
/// tokens, a 512-token prompt chunk beside 64 decode tokens: 160 tiles, one wave and 28 tiles).
/// Under `GemmSplit::Auto` the cheapest by `gemm_cost`, a tail plan only where it beats the
/// others by `GEMM_TAIL_GAIN`; under `Fixed(s)` s (in the tail plan where `tail` is set).
/// Always within the workspace (`GEMM_SPLIT_MAX_BLOCKS_PER_SM`). E.g. qwen3-8b's o at 128
/// tokens on 128-token tiles: 32 tiles, 4 blocks each in one wave.
pub fn gemm_plan(
    t: usize,
    (r, k): (usize, usize),
    sms: usize,
    (tile, prompt_fit): (usize, bool),
    split: GemmSplit,
    tail: Option<usize>,
) -> (u32, u32) {
    let tiles = r.div_ceil(128) * t.div_ceil(tile);
    // The split blocks' partial tiles within the workspace (those of 64-token tiles counted as
    // 128-token ones).
    let wider = tile.max(MMA_GEMM_TOKENS);
    let fits = |(s, w): (usize, usize)| {
        s == 1 || (tiles - w) * s * wider <= GEMM_SPLIT_MAX_BLOCKS_PER_SM * sms * MMA_GEMM_TOKENS
    };
    let cost = |p| gemm_cost(t, (r, k), sms, tile, p, prompt_fit);
    // The tail plans: whole waves, then the rest in s blocks each (none where nothing is left
    // over or no wave is whole).
    let whole = tail.map_or(0, |wave| {
        let wave = if wave == 0 { sms } else { wave };
        tiles / wave * wave
    });
    let tail_plan = |s: usize| (whole > 0 && whole < tiles && s > 1).then_some((s, whole));
    let pick = |p: (usize, usize)| (p.0 as u32, p.1 as u32);
    match split {
        GemmSplit::Fixed(s) => [tail_plan(s as usize), Some((s as usize, 0))]
            .into_iter()
            .flatten()
            .find(|&p| fits(p))
            .map_or((1, 0), pick),
        GemmSplit::Auto => {
            let alike = [1usize, 4, 8]
                .into_iter()
                .map(|s| (s, 0))
                .filter(|&p| fits(p))
                .min_by(|&a, &b| cost(a).total_cmp(&cost(b)))
                .unwrap_or((1, 0));
            let best_tail = [4usize, 8]
                .into_iter()
                .filter_map(tail_plan)
                .filter(|&p| fits(p))
                .min_by(|&a, &b| cost(a).total_cmp(&cost(b)));
            match best_tail {
                Some(p) if cost(p) < GEMM_TAIL_GAIN * cost(alike) => pick(p),
                _ => pick(alike),
            }
        }
    }
}

/// Whether a GEMM launch of `t` tokens over `k` columns is priced by the wgmma GEMM's prompt
/// fit (`GEMM_WG_PROMPT_BLOCK_US`): on wgmma (`KernelTuning::wgmma`, `k` a multiple of 64) from
/// `KernelTuning::gemm_prompt_fit_from` tokens.
pub fn prompt_fit(t: usize, k: usize, tuning: &KernelTuning) -> bool {
    tuning.wgmma && k.is_multiple_of(64) && t >= tuning.gemm_prompt_fit_from
}

/// The wider tiles a GEMM launch of `t` tokens over `k` columns may take instead of 128-token
/// ones, as (variant, tokens per tile), from `KernelTuning::wg_wide_from` tokens where `wgt`
/// runs it (tensor copies on wgmma, `k` a multiple of 64): the one `wg_wide_tiles` forces, else
/// both for `mma_launch` to price where the prompt fit prices the launch (none below it).
pub fn wide_forms(t: usize, k: usize, tuning: &KernelTuning) -> &'static [(usize, usize)] {
    const MID: (usize, usize) = (MMA_WGT_MID, MMA_GEMM_MID_TOKENS);
    const WIDE: (usize, usize) = (MMA_WGT_WIDE, MMA_GEMM_WIDE_TOKENS);
    let runs = tuning.wg_wide_from.is_some_and(|from| t >= from)
        && tuning.wgmma
        && tuning.wg_tma
        && k.is_multiple_of(64);
    match tuning.wg_wide_tiles {
        _ if !runs => &[],
        WideTiles::Priced if prompt_fit(t, k, tuning) => &[MID, WIDE],
        WideTiles::Priced => &[],
        WideTiles::Mid => &[MID],
        WideTiles::Wide => &[WIDE],
    }
}

/// The kernel a GEMM launch of `variant` (`MMA_GEMM` or `MMA_GEMM_NARROW`, as `mma_launch` picks
/// it) runs on where its inputs go to wgmma (`wg`): the 128-token tiles staged by tensor copies
/// (`KernelTuning::wg_tma`), else warp-specialized (`wg_specialized`), else `wg`; the 64-token
/// ones on `wg64` (the host may stream those instead: `wg_stream_launch`). Any other variant
/// (`MMA_WGT_WIDE` and `MMA_WGT_MID` included, which `mma_launch` picks only where they run), or
/// without wgmma, as it is.
pub fn gemm_form(variant: usize, wg: bool, tuning: &KernelTuning) -> usize {
    match variant {
        MMA_GEMM if wg && tuning.wg_tma => MMA_WGT,
        MMA_GEMM if wg && tuning.wg_specialized => MMA_WGS,
        v @ (MMA_GEMM | MMA_GEMM_NARROW) if wg => MMA_WG + (v - MMA_GEMM),
        v => v,
    }
}

/// Whether the tensor-core launches of `t` tokens read inputs prepared by to_half (past 8
/// tokens always, else from `KernelTuning::prepared_from`) rather than normalizing and rounding
/// their rows themselves: `MmaLaunch::prepared` of every launch of `t` tokens.
pub fn prepared_inputs(t: usize, tuning: &KernelTuning) -> bool {
    t > 8 || (tuning.prepared_from > 0 && t >= tuning.prepared_from)
}

/// The launch of `t` tokens over `r` weight rows on `sms` multiprocessors under `tuning`:
/// `mma_variant` by default; the deep one-n-tile variant for projections of at most
/// `deep_n1_blocks_per_sm` blocks per SM; prepared inputs from `prepared_from` tokens (for one
/// n-tile the prepared kernel, n1h, takes precedence over the deep one); and with
/// `token_split`, past 8 tokens the widest token tile (64, 32 or 16 tokens, more than half of
/// them used) whose blocks give every SM at least two, split over as many blocks per row tile
/// as the tokens need (else the 16-token tile). From `gemm_from` tokens (past 8) the GEMM
/// takes every launch (below 128 tokens only where `k` reaches `gemm_min_k`): blocks of 128 rows
/// and 128 tokens, or 64 with `gemm_narrow`, each tile's
/// chains in 1, 4 or 8 blocks, or the last partial wave's only (`gemm_plan`), whichever
/// `gemm_cost` ranks cheapest for the `r` × `k` matrix; where `wide_forms` offers them, 144-
/// or 192-token tiles instead of 128 where `gemm_cost` ranks them cheaper (or always, where
/// `KernelTuning::wg_wide_tiles` forces one), their chains split as `gemm_plan` plans them.
pub fn mma_launch(t: usize, r: usize, k: usize, sms: usize, tuning: &KernelTuning) -> MmaLaunch {
    let (variant, rows) = mma_variant(t);
    let prepared = prepared_inputs(t, tuning);
    let one = |variant, rows| MmaLaunch {
        variant,
        rows,
        token_tiles: 1,
        prepared,
        splits: 1,
        whole: 0,
    };
    let short_k = t < MMA_GEMM_TOKENS && k < tuning.gemm_min_k;
    if t > 8 && !short_k && tuning.gemm_from.is_some_and(|n| t >= n) {
        // Each tile width with its best plan that splits every tile alike (the tail plans
        // only refine the width chosen so); the narrow one only where strictly cheaper.
        // (The host runs it on wgmma where it can: `tuning.wgmma` holds only on sm_90.)
        let fit = prompt_fit(t, k, tuning);
        let shape = |variant, tile| {
            let (splits, whole) = gemm_plan(t, (r, k), sms, (tile, fit), tuning.gemm_split, None);
            let cost = gemm_cost(t, (r, k), sms, tile, (splits as usize, whole as usize), fit);
            (variant, tile, cost)
        };
        let base = shape(MMA_GEMM, MMA_GEMM_TOKENS);
        let narrow = shape(MMA_GEMM_NARROW, MMA_GEMM_NARROW_TOKENS);
        // The wider tiles: the cheapest where priced, the one asked for where forced.
        let forced = tuning.wg_wide_tiles != WideTiles::Priced;
        let widest = wide_forms(t, k, tuning)
            .iter()
            .map(|&(variant, tile)| shape(variant, tile))
            .fold(base, |a, b| if forced || b.2 < a.2 { b } else { a });
        let (variant, tile, _) = if tuning.gemm_narrow && narrow.2 < base.2.min(widest.2) {
            narrow
        } else {
            widest
        };
        let (splits, whole) = gemm_plan(
            t,
            (r, k),
            sms,
            (tile, fit),
            tuning.gemm_split,
            tuning.gemm_tail,
        );
        return MmaLaunch {
            variant,
            rows: 128,
            token_tiles: t.div_ceil(tile) as u32,
            prepared,
            splits,
            whole,
        };
    }
    if t <= 8 {
        if prepared {
            return one(MMA_HALF, 16);
        }
        let deep = tuning.deep_n1_blocks_per_sm > 0
            && r.div_ceil(16) <= tuning.deep_n1_blocks_per_sm * sms;
        return one(if deep { MMA_DEEP } else { variant }, rows);
    }
    if !tuning.token_split {
        return one(variant, rows);
    }
    // (variant without and with token tiles, rows per block, tokens per tile), widest first.
    const SHAPES: [(usize, usize, u32, usize); 3] = [
        (3, MMA_SPLIT + 2, 32, 64),
        (2, MMA_SPLIT + 1, 16, 32),
        (1, MMA_SPLIT, 16, 16),
    ];
    // A tile more than half full, whose blocks give every SM two.
    let fits = |&&(_, _, rows, tile): &&(usize, usize, u32, usize)| {
        2 * t > tile && r.div_ceil(rows as usize) * t.div_ceil(tile) >= 2 * sms
    };
    let &(plain, split, rows, tile) = SHAPES.iter().find(fits).unwrap_or(&SHAPES[2]);
    let token_tiles = t.div_ceil(tile) as u32;
    MmaLaunch {
        variant: if token_tiles == 1 { plain } else { split },
        rows,
        token_tiles,
        prepared,
        splits: 1,
        whole: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cuda::tuning::RingUse;

    const SMS: usize = 132;

    #[test]
    fn to_half_slices_fill_the_sms_with_whole_chunks_per_thread() {
        // qwen3-8b at 64 tokens: 4 slices of q|k|v's 4,096 columns (one 8-column chunk per
        // thread each), 5 of down's 12,288; prompt chunks and batch 1 keep one per row.
        assert_eq!(to_half_grid(64, 4096, SMS), (64, 4, 1));
        assert_eq!(to_half_grid(64, 12_288, SMS), (64, 5, 1));
        assert_eq!(to_half_grid(2048, 4096, SMS), (2048, 1, 1));
        assert_eq!(to_half_grid(1, 4096, SMS), (1, 4, 1));
        // A row shorter than one chunk per thread is never sliced.
        assert_eq!(to_half_grid(3, 512, SMS), (3, 1, 1));
        // Otherwise: at most one slice per 1,024 columns, and two blocks per SM where that
        // allows.
        for (m, k) in [(9, 1024), (32, 3072), (64, 2048), (300, 12_288)] {
            let (rows, slices, _) = to_half_grid(m, k, SMS);
            let most = (k / 1024).max(1);
            assert_eq!(rows as usize, m);
            assert!((1..=most).contains(&(slices as usize)));
            assert!(m * slices as usize >= (2 * SMS).min(m * most));
        }
    }

    #[test]
    fn the_persistent_gemm_fits_one_block_per_sm_and_its_workspace() {
        // 8 stages of 24 KiB and the 128 × 65-float tile: under the 227 KiB a block may opt in to.
        assert_eq!(WG_STREAM_SHARED, 230_912);
        const { assert!(WG_STREAM_SHARED <= 227 << 10) };
        // qwen3-8b at 64 tokens: gate|up's 192 tiles and down's 32 on every SM; a few tiles'
        // chains on as many blocks as chains; a cap below the SMs holds.
        assert_eq!(wg_stream_blocks(192, SMS, 0), 132);
        assert_eq!(wg_stream_blocks(32, SMS, 0), 132);
        assert_eq!(wg_stream_blocks(2, SMS, 0), 16);
        assert_eq!(wg_stream_blocks(192, SMS, 3), 3);
        assert_eq!(wg_stream_blocks(192, SMS, 1000), 132);
        // Fewer tiles are shared than there are blocks (tiles mod blocks), each with 8 slots of
        // 128 × 64 floats: within the split workspace of 8 blocks × 128 × 128 floats per SM.
        for tiles in [1usize, 2, 31, 132, 133, 192, 263, 1000] {
            let blocks = wg_stream_blocks(tiles, SMS, 0) as usize;
            let shared = tiles % blocks;
            assert!(shared < blocks);
            assert!(shared * 8 * 128 * 64 <= GEMM_SPLIT_MAX_BLOCKS_PER_SM * SMS * 128 * 128);
            assert!(shared <= GEMM_SPLIT_MAX_BLOCKS_PER_SM * SMS);
        }
    }

    #[test]
    fn the_persistent_gemm_runs_where_it_evens_out_the_waves() {
        let gains = |tiles: usize, splits: usize| {
            wg_stream_gains(tiles, splits, SMS, wg_stream_blocks(tiles, SMS, 0) as usize)
        };
        // qwen3-8b at 64 tokens: gate|up's 192 whole tiles take 2 waves of 8 chains (16) where
        // 132 blocks stream 12; q|k|v's 48 tiles in 4 splits 2 waves of 2 chains (4) against 3.
        assert!(gains(192, 1));
        assert!(gains(48, 4));
        // o and down: 32 tiles in 4 splits, one wave of 2 chains either way; the LM head's
        // 1,187 tiles: 9 waves of 8 against 8 whole tiles and 8 chains of the rest (72 both).
        assert!(!gains(32, 4));
        assert!(!gains(1187, 1));
        // With 12 SMs left free for the next kernel, gate|up still gains (13 chains against
        // 16), q|k|v no longer (4 against 4).
        let capped = |tiles, splits| {
            wg_stream_gains(
                tiles,
                splits,
                SMS,
                wg_stream_blocks(tiles, SMS, 120) as usize,
            )
        };
        assert!(capped(192, 1));
        assert!(!capped(48, 4));
        // The tuning's say: off by default, every launch when always, none under fixed splits.
        let d = KernelTuning::default();
        assert_eq!(wg_stream_launch(192, 1, SMS, &d), None);
        let auto = KernelTuning {
            wg_stream: WgStream::Auto,
            ..d
        };
        assert_eq!(wg_stream_launch(192, 1, SMS, &auto), Some(132));
        assert_eq!(wg_stream_launch(32, 4, SMS, &auto), None);
        let always = KernelTuning {
            wg_stream: WgStream::Always,
            wg_stream_blocks: 3,
            ..d
        };
        assert_eq!(wg_stream_launch(32, 4, SMS, &always), Some(3));
        let fixed = KernelTuning {
            gemm_split: GemmSplit::Fixed(4),
            ..always
        };
        assert_eq!(wg_stream_launch(32, 4, SMS, &fixed), None);
    }

    #[test]
    fn persistent_wgs_launches_one_block_per_sm_at_most() {
        let on = KernelTuning::default();
        assert!(on.wg_persistent);
        let off = KernelTuning {
            wg_persistent: false,
            ..on
        };
        assert_eq!(wgs_blocks(3072, SMS, &off), 3072);
        assert_eq!(wgs_blocks(3072, SMS, &on), SMS as u32);
        assert_eq!(wgs_blocks(100, SMS, &on), 100);
        let capped = KernelTuning {
            wg_persistent_blocks: 3,
            ..on
        };
        assert_eq!(wgs_blocks(16, SMS, &capped), 3);
    }

    #[test]
    fn baseline_tuning_launches_as_before() {
        let d = KernelTuning::baseline();
        for t in [1, 2, 8, 9, 16, 17, 32, 33, 64, 65, 128, 2048] {
            for r in [64, 1024, 4096, 24576, 151_936] {
                let (variant, rows) = mma_variant(t);
                let want = MmaLaunch {
                    variant,
                    rows,
                    token_tiles: 1,
                    prepared: t > 8,
                    splits: 1,
                    whole: 0,
                };
                assert_eq!(
                    mma_launch(t, r, 4096, SMS, &d),
                    want,
                    "{t} tokens, {r} rows"
                );
            }
        }
    }

    #[test]
    fn the_gemm_takes_every_launch_from_its_token_count() {
        let tuning = KernelTuning {
            gemm_from: Some(64),
            gemm_narrow: false,
            gemm_split: GemmSplit::Fixed(1),
            ..KernelTuning::default()
        };
        let gemm = |t: usize| MmaLaunch {
            variant: MMA_GEMM,
            rows: 128,
            token_tiles: t.div_ceil(MMA_GEMM_TOKENS) as u32,
            prepared: true,
            splits: 1,
            whole: 0,
        };
        assert_eq!(mma_launch(64, 4096, 4096, SMS, &tuning), gemm(64));
        assert_eq!(mma_launch(1000, 24_576, 4096, SMS, &tuning), gemm(1000));
        assert_ne!(mma_launch(63, 4096, 4096, SMS, &tuning).variant, MMA_GEMM);
        // One n-tile never: the register kernels read the weights at the bandwidth there.
        let always = KernelTuning {
            gemm_from: Some(1),
            ..tuning
        };
        assert_ne!(mma_launch(8, 4096, 4096, SMS, &always).variant, MMA_GEMM);
        assert_eq!(mma_launch(9, 4096, 4096, SMS, &always), gemm(9));
        assert_eq!(MMA_VARIANTS[MMA_GEMM], "gemm");
        assert_eq!(MMA_VARIANTS[MMA_WG], "wg");
        assert_eq!(MMA_VARIANTS[MMA_WGS], "wgs");
        assert_eq!(MMA_VARIANTS[MMA_WGT], "wgt");
        assert_eq!(
            (
                mma_threads(MMA_WG),
                mma_threads(MMA_WGS),
                mma_threads(MMA_WGT)
            ),
            (256, MMA_WGS_THREADS, MMA_WGS_THREADS)
        );
        assert_eq!(MMA_VARIANTS[MMA_GEMM_NARROW], "gemm64");
        assert_eq!(
            (MMA_GEMM_SHARED, mma_gemm_shared(MMA_GEMM_NARROW_TOKENS)),
            (160 << 10, 104 << 10)
        );
    }

    #[test]
    fn the_gemm_shape_is_the_cheapest_measured_one() {
        let d = KernelTuning::default();
        // (tile tokens, splits) the default picks for qwen3-8b's projections.
        let shape = |t, r, k| {
            let l = mma_launch(t, r, k, SMS, &d);
            let tile = gemm_tile_tokens(l.variant).expect("a GEMM launch");
            assert_eq!(l.token_tiles as usize, t.div_ceil(tile));
            (tile, l.splits)
        };
        let (qkv, o, gate_up, down) = ((6144, 4096), (4096, 4096), (24_576, 4096), (4096, 12_288));
        // Measured on the H200 (gpu_kernels, 2026-11-26), µs: the choice, then the runner-up.
        // 64 tokens: q|k|v 44 (64-token tiles in 8 blocks) vs 61 unsplit; o 34 vs 67; down 65
        // vs 173.
        assert_eq!(shape(64, qkv.0, qkv.1), (64, 4));
        assert_eq!(shape(64, o.0, o.1), (64, 4));
        assert_eq!(shape(64, down.0, down.1), (64, 4));
        // 128 tokens: o 56 (128-token tiles in 4 blocks) vs 66; down 103 vs 122; gate|up 172
        // (64-token tiles unsplit) vs 186.
        assert_eq!(shape(128, o.0, o.1), (128, 4));
        assert_eq!(shape(128, down.0, down.1), (128, 4));
        assert_eq!(shape(128, gate_up.0, gate_up.1), (64, 1));
        // 256 tokens: o 71 (64-token tiles unsplit) vs 109 (128 in 4 blocks).
        assert_eq!(shape(256, o.0, o.1), (64, 1));
        // 192–448 tokens, priced by the wgmma prompt fit (H100, 2026-12-07, µs): gate|up at
        // 192 on 128-token tiles 140 vs 153 on 64; down at 320 90 vs 116; q|k|v at 448 77 vs
        // 97; o and down at 192–256 stay on 64 (35 vs 41, 84 vs 104). With the wider tiles
        // (H100, 2026-12-08): gate|up at 320 on two 192-token tiles, 187 vs 201 on 2.5 of 128;
        // o, gate|up and down at 576 on four of 144 (52 vs 71, 260 vs 310, 114 vs 144).
        assert_eq!(shape(192, gate_up.0, gate_up.1), (128, 1));
        assert_eq!(shape(320, gate_up.0, gate_up.1), (192, 1));
        for (r, k) in [o, gate_up, down] {
            assert_eq!(shape(576, r, k), (144, 1));
        }
        assert_eq!(shape(320, down.0, down.1), (128, 1));
        assert_eq!(shape(448, qkv.0, qkv.1), (128, 1));
        assert_eq!(shape(192, o.0, o.1), (64, 1));
        assert_eq!(shape(256, down.0, down.1), (64, 1));
        // 2,048 tokens: every SM busy with 128-token tiles: gate|up 2,274 vs 2,616 on 64.
        assert_eq!(shape(2048, gate_up.0, gate_up.1), (128, 1));
        assert_eq!(shape(2048, qkv.0, qkv.1), (128, 1));
        // Without the narrow tile, only the 128-token one.
        let wide = KernelTuning {
            gemm_narrow: false,
            ..d
        };
        assert_eq!(mma_launch(256, 4096, 4096, SMS, &wide).variant, MMA_GEMM);
    }

    #[test]
    fn only_the_last_partial_wave_splits_where_that_saves_most() {
        // On 128-token tiles (the wider ones, where priced cheaper, fit 576 tokens in one wave).
        let d = KernelTuning {
            wg_wide_from: None,
            ..KernelTuning::default()
        };
        let (o, down, gate_up) = ((4096, 4096), (4096, 12_288), (24_576, 4096));
        let launch = |t, (r, k): (usize, usize), tuning: &KernelTuning| {
            let l = mma_launch(t, r, k, SMS, tuning);
            (l.variant, l.splits, l.whole)
        };
        // 64 decode tokens + a 512-token prompt chunk: o's and down's 160 tiles are one wave
        // and 28 tiles; the 28 split 4 ways (112 blocks). Measured on the H200 (gpu_kernels,
        // 2026-11-27 twenty-fourth session): o 80.7 → 71.2 µs, down 174.5 (all 160 in 4
        // splits: 640 blocks) → 137.8.
        assert_eq!(launch(576, down, &d), (MMA_GEMM, 4, 132));
        assert_eq!(launch(576, o, &d), (MMA_GEMM, 4, 132));
        let off = KernelTuning {
            gemm_tail: None,
            ..d
        };
        assert_eq!(launch(576, o, &off), (MMA_GEMM, 1, 0));
        // Prompt-sized launches on wgmma take 128-token tiles (q|k|v at 512 tokens: 76.7 µs
        // against 94.7 on 64-token ones); on the mma.sync GEMM the fit that ranks them is the
        // older one.
        assert_eq!(launch(512, (6144, 4096), &d), (MMA_GEMM, 1, 0));
        let sync = KernelTuning { wgmma: false, ..d };
        assert_eq!(launch(512, (6144, 4096), &sync).0, MMA_GEMM_NARROW);
        // Near ties keep every tile alike: gate|up's 960 tiles at 576 tokens (7 waves and 36
        // tiles), a 2,048-token prompt's 3,072 (23 and 36), a decode step's 192 at 64 tokens.
        assert_eq!(launch(576, gate_up, &d), (MMA_GEMM, 1, 0));
        assert_eq!(launch(2048, gate_up, &d), (MMA_GEMM, 1, 0));
        assert_eq!(launch(64, gate_up, &d), (MMA_GEMM_NARROW, 1, 0));
        // Whole waves of the SMs only: 512 tokens fill them (o's 128 tiles in one wave).
        assert_eq!(launch(512, o, &d), (MMA_GEMM, 1, 0));
        // Fixed splits with waves of 3 tiles (the bit-identity tests): 32 tiles of o at 128
        // tokens, 30 whole and 2 in 4 blocks each; where nothing is left over, all alike.
        let fixed = |s, wave, t| {
            gemm_plan(
                t,
                (4096, 4096),
                SMS,
                (MMA_GEMM_TOKENS, true),
                GemmSplit::Fixed(s),
                Some(wave),
            )
        };
        assert_eq!(fixed(4, 3, 128), (4, 30));
        assert_eq!(fixed(8, 3, 128), (8, 30));
        assert_eq!(fixed(4, 4, 128), (4, 0));
        assert_eq!(fixed(1, 3, 128), (1, 0));
        // The units: whole tiles, then the split ones' blocks.
        let l = MmaLaunch {
            variant: MMA_GEMM,
            rows: 128,
            token_tiles: 5,
            prepared: true,
            splits: 4,
            whole: 132,
        };
        assert_eq!((l.units(160), l.split_plan()), (132 + 28 * 4, 4 | 132 << 4));
        // Read back as mma.cuh's SplitUnit reads it, a plan's units cover every tile once whole
        // or in all of its splits, and the split tiles' slots count from 0.
        let unit = |plan: u32, u: u32| {
            let (s, whole) = (plan & 15, plan >> 4);
            if u < whole {
                (u, 0, 1, 0)
            } else {
                let slot = (u - whole) / s;
                (whole + slot, (u - whole) % s, s, slot)
            }
        };
        for (tiles, splits, whole) in [(160, 4, 132), (288, 8, 264), (32, 4, 0), (7, 8, 3)] {
            let l = MmaLaunch { splits, whole, ..l };
            let mut seen = vec![Vec::new(); tiles as usize];
            for u in 0..l.units(tiles) {
                let (tile, split, s, slot) = unit(l.split_plan() as u32, u);
                assert_eq!(s, if tile < whole { 1 } else { splits });
                assert_eq!(slot, tile.saturating_sub(whole));
                seen[tile as usize].push(split);
            }
            for (tile, got) in seen.iter().enumerate() {
                let s = if (tile as u32) < whole { 1 } else { splits };
                assert_eq!(*got, (0..s).collect::<Vec<_>>(), "tile {tile}");
            }
        }
        // The split tiles stay within the workspace at any token count.
        for t in (9..=4096).step_by(37) {
            for (r, k) in [o, down, gate_up, (6144, 4096), (151_936, 4096)] {
                let l = mma_launch(t, r, k, SMS, &d);
                let tiles = r.div_ceil(128) * l.token_tiles as usize;
                if l.variant >= MMA_GEMM && l.splits > 1 {
                    assert!(
                        (tiles - l.whole as usize) * l.splits as usize
                            <= GEMM_SPLIT_MAX_BLOCKS_PER_SM * SMS
                    );
                }
            }
        }
    }

    #[test]
    fn gemm_chains_split_only_within_the_workspace() {
        let fit = |t| prompt_fit(t, 4096, &KernelTuning::default());
        let split = |t, s| gemm_plan(t, (4096, 4096), SMS, (MMA_GEMM_TOKENS, fit(t)), s, None).0;
        // o at 128 tokens: 32 tiles; at 2,048: 512, where 8 splits would pass the workspace.
        assert_eq!(split(128, GemmSplit::Auto), 4);
        assert_eq!(split(2048, GemmSplit::Auto), 1);
        assert_eq!(split(128, GemmSplit::Fixed(8)), 8);
        assert_eq!(split(2048, GemmSplit::Fixed(8)), 1);
        assert_eq!(split(128, GemmSplit::Fixed(1)), 1);
    }

    #[test]
    fn attention_blocks_and_shared_memory_follow_the_kernels() {
        // qwen3-8b (4 query heads per kv head): a 2,048-token prompt is 64 token groups × 8 kv
        // heads, two splits per block give four blocks per SM; 512 tokens need five; a huge
        // step one; never more than the splits.
        assert_eq!(prefill_split_blocks(64 * 8, SMS), 2);
        assert_eq!(prefill_split_blocks(16 * 8, SMS), 5);
        assert_eq!(prefill_split_blocks(1 << 20, SMS), 1);
        assert_eq!(prefill_split_blocks(1, SMS), ATTN_SPLITS);
        // Queries of 128 rows and two stages of 32 keys + 32 values, rows padded by 8 (68 KiB:
        // two blocks fit an SM on sm_80+); the fold's four (102 KiB, one block per SM).
        assert_eq!(attn_prefill_shared(128, false), (128 + 128) * 136 * 2);
        assert_eq!(attn_prefill_shared(128, true), (128 + 256) * 136 * 2);
        assert_eq!(attn_prefill_wg_shared(), 1024 + 32 * 1024 + 64 * 1024);
        // One tile per computing warp (all of the block's up to head dim 128, half past it;
        // the general kernel is sized for 128), keys and values each in whole KiB: about 145
        // KiB for 8 warps, so the block fits beside its static shared memory on sm_80+, and
        // about 74 KiB for 4, so two do on sm_80 and sm_90.
        assert_eq!(
            attn_serial_shared(128, ATTN_THREADS),
            8 * 2 * 9 * 1024 + 1024
        );
        assert_eq!(
            attn_serial_shared(128, ATTN_SERIAL_PAIR_THREADS),
            4 * 2 * 9 * 1024 + 1024
        );
        assert_eq!(attn_serial_shared(16, 256), attn_serial_shared(128, 256));
        // qwen3-8b's group of 4 heads of 128 dims: 33 KiB of partials, which two pair blocks
        // per SM still hold beside their tiles on sm_90 (228 KiB).
        assert_eq!(attn_serial_parts(4, 128), 4 * 16 * 130 * 4);
        assert!(
            2 * (attn_serial_shared(128, ATTN_SERIAL_PAIR_THREADS) + attn_serial_parts(4, 128))
                + 2 * (8 << 10)
                <= 228 << 10
        );
        for hd in [16, 64, 128, 256] {
            assert!(
                attn_serial_shared(hd, ATTN_THREADS) <= 150 << 10,
                "head dim {hd}"
            );
            let pair = attn_serial_shared(hd, ATTN_SERIAL_PAIR_THREADS);
            assert!(pair <= 76 << 10, "head dim {hd}");
        }
    }

    #[test]
    fn the_deep_one_tile_kernel_runs_only_where_blocks_are_few() {
        let tuning = KernelTuning {
            deep_n1_blocks_per_sm: 2,
            ..KernelTuning::baseline()
        };
        // qwen3-8b o_proj / down_proj: 256 blocks of 16 rows, under 2 per SM.
        assert_eq!(mma_launch(1, 4096, 4096, SMS, &tuning).variant, MMA_DEEP);
        assert_eq!(mma_launch(8, 4096, 4096, SMS, &tuning).variant, MMA_DEEP);
        // q|k|v (384 blocks) and gate|up keep n1; past one n-tile nothing changes.
        assert_eq!(mma_launch(1, 6144, 4096, SMS, &tuning).variant, 0);
        assert_eq!(mma_launch(1, 24_576, 4096, SMS, &tuning).variant, 0);
        assert_eq!(mma_launch(9, 4096, 4096, SMS, &tuning).variant, 1);
    }

    #[test]
    fn persistent_one_tile_launches_take_more_tiles_than_one_wave() {
        let on = KernelTuning {
            n1_persistent: true,
            ..KernelTuning::baseline()
        };
        let wave = MMA_N1_BLOCKS_PER_SM * SMS;
        // qwen3-8b gate|up (1,536 tiles) and the LM head run persistent in one wave of blocks;
        // q|k|v (384 tiles) fits one wave as it is.
        for (tiles, variant) in [(1536, 0), (9496, 0), (1536, MMA_HALF)] {
            let p = persistent_variant(variant, tiles, SMS, &on);
            assert_eq!(MMA_VARIANTS[p], if variant == 0 { "n1p" } else { "n1hp" });
            assert_eq!(persistent_blocks(tiles, SMS, &on) as usize, wave);
        }
        assert_eq!(persistent_variant(0, 384, SMS, &on), 0);
        assert_eq!(persistent_variant(0, wave, SMS, &on), 0);
        // Only n1 and n1h; on by default.
        assert_eq!(persistent_variant(MMA_DEEP, 1536, SMS, &on), MMA_DEEP);
        assert_eq!(persistent_variant(MMA_RING, 1536, SMS, &on), MMA_RING);
        let d = KernelTuning::default();
        assert_eq!(persistent_variant(0, 1536, SMS, &d), MMA_PERSIST);
        let off = KernelTuning {
            n1_persistent: false,
            ..d
        };
        assert_eq!(persistent_variant(0, 1536, SMS, &off), 0);
        // A set block count (the bit-identity test's): persistent past it, never more blocks
        // than tiles.
        let five = KernelTuning {
            n1_persistent_blocks: 5,
            ..on
        };
        assert_eq!(persistent_variant(0, 6, SMS, &five), MMA_PERSIST);
        assert_eq!(persistent_variant(0, 5, SMS, &five), 0);
        assert_eq!(persistent_blocks(3, SMS, &five), 3);
    }

    #[test]
    fn inputs_are_prepared_from_the_chosen_token_count() {
        let tuning = KernelTuning {
            prepared_from: 3,
            ..KernelTuning::baseline()
        };
        assert!(!mma_launch(2, 4096, 4096, SMS, &tuning).prepared);
        let l = mma_launch(3, 4096, 4096, SMS, &tuning);
        assert_eq!((l.variant, l.prepared), (MMA_HALF, true));
        assert!(mma_launch(9, 4096, 4096, SMS, &KernelTuning::baseline()).prepared);
        // prepared_inputs (which the residual adds ask before writing the norm sums) says the
        // same for every launch of that many tokens, whatever its matrix.
        for tuning in [tuning, KernelTuning::default(), KernelTuning::baseline()] {
            for t in 1..=300 {
                for (r, k) in [(4096, 4096), (6144, 4096), (4096, 12288), (1024, 1024)] {
                    let l = mma_launch(t, r, k, SMS, &tuning);
                    assert_eq!(prepared_inputs(t, &tuning), l.prepared, "{t} tokens");
                }
            }
        }
    }

    #[test]
    fn the_defaults_are_the_measured_variants() {
        let d = KernelTuning::default();
        // qwen3-8b at batch 1: o_proj deep, gate|up not; 3 tokens on prepared inputs.
        assert_eq!(mma_launch(1, 4096, 4096, SMS, &d).variant, MMA_DEEP);
        assert_eq!(mma_launch(1, 24_576, 4096, SMS, &d).variant, 0);
        assert_eq!(mma_launch(3, 24_576, 4096, SMS, &d).variant, MMA_HALF);
        assert!(mma_launch(24, 4096, 4096, SMS, &d).token_tiles > 1);
        // Serial attention from 4 tokens (qwen3-8b, 512-token prompts: batch 8 5.85 → 5.13 ms
        // per step, 16 8.34 → 6.18; at 2 it loses, 4.99 → 5.34).
        assert_eq!(d.serial_attention_from, Some(4));
        assert!(d.tiled_weights && !d.cluster_attention);
        assert_eq!(mma_launch(1024, 24_576, 4096, SMS, &d).variant, MMA_GEMM);
        assert_eq!(mma_launch(64, 4096, 4096, SMS, &d).variant, MMA_GEMM_NARROW);
        // From 32 tokens (qwen3-8b batch 32 on the wgmma GEMM: 9.8 against 11.8 ms per step).
        assert_eq!(mma_launch(32, 4096, 4096, SMS, &d).variant, MMA_GEMM_NARROW);
        assert!(mma_launch(31, 4096, 4096, SMS, &d).variant < MMA_GEMM);
        assert!(d.wgmma);
        // A short K (qwen3-0.6b: 1,024 to 3,072 columns) keeps the register kernels below 128
        // tokens (batch 64 on the H200: 10,598 tok/s against 9,604 with the GEMM).
        assert!(mma_launch(64, 4096, 3072, SMS, &d).variant < MMA_GEMM);
        assert!(mma_launch(128, 4096, 1024, SMS, &d).variant >= MMA_GEMM);
        assert_eq!(d.l2_prefetch_bytes, 0);
        // On wgmma the 128-token tiles run staged by tensor copies, the 64-token ones on wg64.
        assert_eq!(gemm_form(MMA_GEMM, true, &d), MMA_WGT);
        assert_eq!(gemm_form(MMA_GEMM_NARROW, true, &d), MMA_WG + 1);
        assert_eq!(gemm_form(MMA_GEMM, false, &d), MMA_GEMM);
        let specialized = KernelTuning {
            wg_tma: false,
            wg_specialized: true,
            ..d
        };
        assert_eq!(gemm_form(MMA_GEMM, true, &specialized), MMA_WGS);
        assert_eq!(gemm_form(MMA_HALF, true, &d), MMA_HALF);
    }

    #[test]
    fn token_split_fills_the_sms_with_the_widest_tile() {
        let tuning = KernelTuning {
            token_split: true,
            ..KernelTuning::baseline()
        };
        let launch = |variant, rows, token_tiles| MmaLaunch {
            variant,
            rows,
            token_tiles,
            prepared: true,
            splits: 1,
            whole: 0,
        };
        // qwen3-8b o_proj at 64 tokens: 128 blocks of 32 rows leave SMs idle; 32-token tiles over
        // 16-row blocks give 512.
        assert_eq!(
            mma_launch(64, 4096, 4096, SMS, &tuning),
            launch(MMA_SPLIT + 1, 16, 2)
        );
        // gate|up at 64 tokens: 768 blocks of one 64-token tile already.
        assert_eq!(mma_launch(64, 24_576, 4096, SMS, &tuning), launch(3, 32, 1));
        // A long prompt: 64-token tiles, a block each.
        assert_eq!(
            mma_launch(2048, 24_576, 4096, SMS, &tuning),
            launch(MMA_SPLIT + 2, 32, 32)
        );
        // Rows too few for any tile to fill the SMs: 16-token tiles.
        assert_eq!(
            mma_launch(20, 64, 4096, SMS, &tuning),
            launch(MMA_SPLIT, 16, 2)
        );
        // One 16-token tile is the plain n2.
        assert_eq!(mma_launch(12, 1024, 4096, SMS, &tuning), launch(1, 16, 1));
        // Up to 8 tokens, one n-tile as without the split.
        assert_eq!(mma_launch(8, 64, 4096, SMS, &tuning).token_tiles, 1);
    }

    #[test]
    fn the_weight_ring_replaces_only_the_one_tile_kernels_it_is_asked_for() {
        let names = |t: &KernelTuning, blocks| {
            [0, MMA_DEEP, MMA_HALF, 1, MMA_GEMM]
                .map(|v| MMA_VARIANTS[ring_variant(v, blocks, SMS, t)])
        };
        let off = KernelTuning {
            weight_ring: RingUse::Off,
            weight_ring_deep: RingUse::Off,
            ..KernelTuning::default()
        };
        assert_eq!(names(&off, 64), ["n1", "n1d", "n1h", "n2", "gemm"]);
        // The default: the deep ring below one wave only.
        let default = KernelTuning::default();
        assert_eq!(names(&default, SMS - 1)[1], "n1dr");
        assert_eq!(names(&default, SMS)[1], "n1d");
        let deep = KernelTuning {
            weight_ring_deep: RingUse::Always,
            ..off
        };
        assert_eq!(names(&deep, 256), ["n1", "n1dr", "n1h", "n2", "gemm"]);
        let both = KernelTuning {
            weight_ring: RingUse::Always,
            ..deep
        };
        assert_eq!(names(&both, 256), ["n1r", "n1dr", "n1hr", "n2", "gemm"]);
        // Below one wave: only launches of fewer blocks than the SMs.
        let short = KernelTuning {
            weight_ring: RingUse::BelowOneWave,
            weight_ring_deep: RingUse::BelowOneWave,
            ..off
        };
        assert_eq!(
            names(&short, SMS - 1),
            ["n1r", "n1dr", "n1hr", "n2", "gemm"]
        );
        assert_eq!(names(&short, SMS), ["n1", "n1d", "n1h", "n2", "gemm"]);
    }

    #[test]
    fn wide_tiles_run_where_asked_within_their_shared_memory_and_workspace() {
        // wgt192: 3 stages of 40 KiB, the 128 × 193-float tile, 1 KiB of alignment.
        assert_eq!(wg_gemm_shared(MMA_GEMM_WIDE_TOKENS), 222_720);
        const { assert!(wg_gemm_shared(MMA_GEMM_WIDE_TOKENS) <= 227 << 10) };
        // The 64- and 128-token tiles keep their 225.5 KiB.
        assert_eq!(wg_gemm_shared(MMA_GEMM_TOKENS), 230_912);
        assert_eq!(wg_gemm_shared(MMA_GEMM_NARROW_TOKENS), 230_912);
        assert_eq!(MMA_VARIANTS[MMA_WGT_WIDE], "wgt192");
        assert_eq!(mma_threads(MMA_WGT_WIDE), MMA_WGS_THREADS);
        assert_eq!(gemm_tile_tokens(MMA_WGT_WIDE), Some(192));
        assert_eq!(gemm_tile_tokens(MMA_WGT), Some(128));
        assert_eq!(gemm_tile_tokens(MMA_WGT_MID), Some(144));
        assert_eq!(MMA_VARIANTS[MMA_WGT_MID], "wgt144");
        assert_eq!(mma_threads(MMA_WGT_MID), MMA_WGS_THREADS);
        // wgt144: 4 stages of 34 KiB beside the 128 × 145-float tile.
        assert_eq!(wg_gemm_shared(MMA_GEMM_MID_TOKENS), 214_528);
        assert_eq!(gemm_tile_tokens(MMA_WG + 1), Some(64));
        assert_eq!(gemm_tile_tokens(MMA_WG_STREAM), Some(64));
        assert_eq!(gemm_tile_tokens(MMA_HALF), None);
        assert_eq!(gemm_tile_tokens(MMA_PERSIST), None);
        let d = KernelTuning::default();
        assert_eq!(
            (d.wg_wide_from, d.wg_wide_tiles),
            (Some(192), WideTiles::Priced)
        );
        // Priced (the default): qwen3-8b's o, gate|up and down at 576 tokens (a 512-token chunk
        // beside 64 decode tokens) on four 144-token tiles per row block instead of 4.5 of 128;
        // its q|k|v there (two waves either way), and every projection at 2,048 tokens (16 ×
        // 128), on 128; gate|up at 320 tokens on two 192-token tiles instead of 2.5 of 128.
        for (r, k) in [(4096, 4096), (24_576, 4096), (4096, 12_288)] {
            let l = mma_launch(576, r, k, SMS, &d);
            assert_eq!((l.variant, l.token_tiles, l.rows), (MMA_WGT_MID, 4, 128));
        }
        assert_eq!(mma_launch(576, 6144, 4096, SMS, &d).variant, MMA_GEMM);
        for (r, k) in [(6144, 4096), (4096, 4096), (24_576, 4096), (4096, 12_288)] {
            assert_eq!(mma_launch(2048, r, k, SMS, &d).variant, MMA_GEMM);
        }
        let l = mma_launch(320, 24_576, 4096, SMS, &d);
        assert_eq!((l.variant, l.token_tiles), (MMA_WGT_WIDE, 2));
        // Below the prompt fit, none.
        let off = KernelTuning {
            wg_wide_from: None,
            ..d
        };
        assert!(wide_forms(191, 4096, &d).is_empty());
        assert_eq!(wide_forms(192, 4096, &d).len(), 2);
        // Forced where asked (the A/Bs; the bit-identity test from 9 tokens).
        let wide = KernelTuning {
            wg_wide_from: Some(256),
            wg_wide_tiles: WideTiles::Wide,
            ..d
        };
        let l = mma_launch(576, 4096, 12_288, SMS, &wide);
        assert_eq!((l.variant, l.token_tiles, l.rows), (MMA_WGT_WIDE, 3, 128));
        assert_eq!(gemm_form(l.variant, true, &wide), MMA_WGT_WIDE);
        let mid = KernelTuning {
            wg_wide_tiles: WideTiles::Mid,
            ..wide
        };
        let l = mma_launch(576, 6144, 4096, SMS, &mid);
        assert_eq!((l.variant, l.token_tiles), (MMA_WGT_MID, 4));
        assert_eq!(wide_forms(576, 4096, &mid), [(MMA_WGT_MID, 144)]);
        assert_eq!(wide_forms(576, 4096, &wide), [(MMA_WGT_WIDE, 192)]);
        // Below the threshold, without the tensor copies or wgmma, or K not a multiple of 64:
        // what the launch takes without them.
        assert_eq!(
            mma_launch(255, 4096, 12_288, SMS, &wide),
            mma_launch(255, 4096, 12_288, SMS, &off)
        );
        for asked in [wide, d] {
            for no in [
                KernelTuning {
                    wg_tma: false,
                    ..asked
                },
                KernelTuning {
                    wgmma: false,
                    ..asked
                },
            ] {
                let plain = KernelTuning {
                    wg_wide_from: None,
                    ..no
                };
                let l = mma_launch(576, 4096, 12_288, SMS, &no);
                assert_eq!(l, mma_launch(576, 4096, 12_288, SMS, &plain));
                assert!(!matches!(l.variant, MMA_WGT_WIDE | MMA_WGT_MID));
            }
            assert_eq!(
                mma_launch(576, 4096, 4100, SMS, &asked),
                mma_launch(576, 4096, 4100, SMS, &off)
            );
            assert!(wide_forms(576, 4100, &asked).is_empty());
        }
        // Their split blocks' 96 KiB (72 KiB) partials stay within the workspace of 8 × 64 KiB
        // per SM: every plan, over the token counts and matrices a step meets.
        for (t, tile) in [9, 64, 200, 576, 1024, 2048]
            .into_iter()
            .flat_map(|t| [(t, MMA_GEMM_WIDE_TOKENS), (t, MMA_GEMM_MID_TOKENS)])
        {
            for (r, k) in [(6144, 4096), (4096, 4096), (24_576, 4096), (4096, 12_288)] {
                for split in [GemmSplit::Auto, GemmSplit::Fixed(4), GemmSplit::Fixed(8)] {
                    for tail in [None, Some(0)] {
                        let (s, whole) = gemm_plan(t, (r, k), SMS, (tile, true), split, tail);
                        let tiles = r.div_ceil(128) * t.div_ceil(tile);
                        let partials = if s > 1 {
                            (tiles - whole as usize) * s as usize * 128 * tile * 4
                        } else {
                            0
                        };
                        assert!(
                            partials <= GEMM_SPLIT_MAX_BLOCKS_PER_SM * SMS * (64 << 10),
                            "{t} tokens on {tile}, {r} × {k}, {split:?}, {tail:?}: {partials} B"
                        );
                    }
                }
            }
        }
        // The 128-token tiles' plans are as before: o at 128 tokens, 32 tiles in 4 splits.
        assert_eq!(
            gemm_plan(128, (4096, 4096), SMS, (128, false), GemmSplit::Auto, None),
            (4, 0)
        );
    }

    #[test]
    fn the_ring_carveout_fits_its_blocks_and_leaves_the_rest_to_l1() {
        // Three 48 KiB rings on a Hopper SM (228 KiB): 156 KiB, 69%.
        assert_eq!(ring_carveout(90, 3, MMA_RING_SHARED), 69);
        assert_eq!(ring_carveout(90, 2, MMA_RING_DEEP_SHARED), 60);
        // More than the SM holds asks for all of it.
        assert_eq!(ring_carveout(86, 3, MMA_RING_DEEP_SHARED), 100);
    }
}

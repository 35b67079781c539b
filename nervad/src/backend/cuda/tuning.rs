//! Kernel variants that change speed only (`KernelTuning`): which kernel serves each launch,
//! with the defaults the GPU machines measured faster and environment overrides for A/B runs.

/// Kernel variants that give the same bits as the kernels they stand in for (GPU test
/// `kernel_variants_give_identical_bits`), so choosing one changes only speed. The defaults are
/// the ones the device measured faster (BENCHMARKS.md, 2026-11-25 fifth session);
/// `NERVA_MMA_DEEP`, `NERVA_ATTN_SERIAL`, `NERVA_ATTN_CLUSTER`, `NERVA_MMA_PREPARED`,
/// `NERVA_MMA_SPLIT` and `NERVA_TILED_WEIGHTS` override them for a process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelTuning {
    /// One-n-tile tensor-core projections (1–8 tokens) with at most this many 16-row blocks
    /// per multiprocessor run the deep variant (`mma_*_n1d`: four weight groups in flight per
    /// warp, two blocks per SM); 0 never.
    pub deep_n1_blocks_per_sm: usize,
    /// Decode-only steps of at least this many tokens run attention as one block per (token,
    /// kv head) that computes and merges its splits itself (`attn_decode_serial`); None never.
    pub serial_attention_from: Option<usize>,
    /// Serial attention launches of at least this many (token, kv head) blocks per SM run as
    /// blocks of 4 warps, two per SM (`attn_decode_serial_pair`), the others as blocks of 8;
    /// 0 always, None never. Default 1, measured (2026-11-26 fourteenth session, H200, qwen3-8b
    /// over 512-token prompts, against 8-warp blocks throughout): batch 32 7.35 → 7.08 ms per
    /// step, 64 8.90 → 8.57; batch 8 (64 blocks, 8-warp shape either way) unchanged, where the
    /// pair shape alone had cost 6%.
    pub serial_pairs_per_sm: Option<usize>,
    /// attn_decode_serial keeps its splits' partials in its own shared memory for its merge,
    /// where that still fits as many blocks per SM as its shape is for (else, and off, in global
    /// memory: the same values). Default on, measured (2026-11-28 thirty-fifth session, H200,
    /// qwen3-8b over 512-token prompts): batch 8 4.791 → 4.735 ms per step, 32 6.560 → 6.433,
    /// 64 7.911 → 7.587 (−4.1%).
    pub serial_parts_shared: bool,
    /// Decode attention's split blocks of a (token, kv head) run as one thread-block cluster
    /// and merge through each other's shared memory (`attn_decode_cluster`, sm_90+; elsewhere,
    /// or where the device cannot hold such a cluster, the default kernel runs).
    pub cluster_attention: bool,
    /// Launches of at least this many tokens read inputs prepared by to_half (one-n-tile
    /// launches through `mma_*_n1h`); at most 9 (past 8 tokens they always are), 0 for 9.
    pub prepared_from: usize,
    /// Past 8 tokens, split a launch's tokens over several blocks per row tile where one block
    /// per row tile would leave SMs idle (`mma_launch`).
    pub token_split: bool,
    /// Store the projection weights in the tensor-core kernels' tiled layout (`weight_tiles`,
    /// `mma_tiled.cu`): every warp-wide load reads 512 contiguous bytes. Only where nothing
    /// else reads them (`Projections::Tensor` without `fast_prefill`: the GEMV and cuBLAS read
    /// row-major weights).
    pub tiled_weights: bool,
    /// Decode attention of at most `l2_prefetch_until` tokens asks L2 for the first this many
    /// bytes of the weights read after it (o, gate|up, down, the next layer's q|k|v or the LM
    /// head), which it would otherwise leave HBM idle while it runs (`l2_prefetch`,
    /// kernels/common.cuh; sm_90+); 0 never.
    pub l2_prefetch_bytes: usize,
    /// The largest decode step (tokens) whose attention prefetches (past it attention reads
    /// enough KV to keep HBM busy itself).
    pub l2_prefetch_until: usize,
    /// Launches of at least this many tokens (past 8) run the fixed-order GEMM (`mma_*_gemm`:
    /// 128-row × 128-token tiles staged in shared memory) instead of the register kernels;
    /// None never.
    pub gemm_from: Option<usize>,
    /// The GEMM takes 64-token tiles (`mma_*_gemm64`) where its 128-token grid would leave
    /// SMs idle for longer (`mma_launch`).
    pub gemm_narrow: bool,
    /// How many blocks share a GEMM tile's chains (mma.cuh, chain splits): `GemmSplit::Auto`
    /// picks 1, 4 or 8 per launch by block waves (`gemm_plan`).
    pub gemm_split: GemmSplit,
    /// Chain splits for the last partial wave of a GEMM launch's tiles only (`gemm_plan`):
    /// whole waves of tiles in one block each, then the leftover tiles in 4 or 8 blocks each
    /// (the same bits), where `gemm_cost` ranks that cheapest. `Some(0)`: waves of the SMs;
    /// `Some(n)`: waves of n tiles (the bit-identity tests, whose small models have few tiles);
    /// None: off. Prompt chunks beside a step's decode tokens (64 + 512 tokens: 5 token tiles
    /// where 512 take 4) leave o and down a second wave of 28 tiles on 132 SMs. On: measured
    /// (2026-11-27 twenty-fourth session, H200, qwen3-8b, with the wgmma prompt fit of
    /// `launch_shape`) o 80.7 → 71.7 µs and down 174.5 → 143.3 at 576 tokens, a 64 + 512-token
    /// step 27.8 → 25.7 ms, 64 closed-loop streams +2.8%; forced on decode batches' gate|up
    /// (which the cost model declines) 0.7% slower per step.
    pub gemm_tail: Option<usize>,
    /// Launches of fewer than `MMA_GEMM_TOKENS` tokens take the GEMM (from `gemm_from`) only
    /// for matrices of at least this many columns: with a shorter K a block's fixed cost
    /// outweighs its share of the chains and the register kernels win; 0 always.
    pub gemm_min_k: usize,
    /// From how many tokens the wgmma GEMM's launch shapes are ranked by its prompt fit
    /// (launch_shape.rs's `GEMM_WG_PROMPT_BLOCK_US`, compute-bound tiles) instead of the
    /// mma.sync GEMM's (`GEMM_BLOCK_US`, fitted where the weights stream from memory once).
    /// Only the launch shape changes, never a result's bits. From 512 down to 192 (H100,
    /// 2026-12-07 thirty-seventh session, `gpu_kernels` at 128–1,024 tokens): the prompt fit
    /// picks each projection's fastest measured launch at 192–448 tokens where the other picked
    /// `wg64` (gate|up at 320 tokens 245 → 202 µs, down at 320 116 → 90, q|k|v at 448 97 → 77),
    /// and at 128 tokens it would not (gate|up on `wgt`, 3% slower); a mixed step of 64 decode
    /// tokens and a 256-token chunk 20.8 → 18.6 ms, of 64 and 384 21.9 → 21.2 ms.
    pub gemm_prompt_fit_from: usize,
    /// Steps with prompt tokens run attention as `attn_prefill` (a block's tokens of one
    /// sequence share each KV tile) instead of one block per token (`attn_split`); head dims 64
    /// and 128.
    pub prefill_attention: bool,
    /// Prompt launches of at least this many rows run `attn_prefill_fold` (with
    /// `prefill_attention`): one block takes all of its rows' splits and folds them into their
    /// merge itself, so no partial goes through memory and no attn_combine follows. Fewer rows
    /// keep the splits spread over several blocks per token group (parallelism for short
    /// prompts). The same bits either way.
    pub prefill_fold_from: Option<usize>,
    /// `attn_prefill_fold` runs on Hopper's warpgroup MMA (`attn_prefill_wg`, sm_90a, head dim
    /// 128: each warpgroup's scores and values as wgmma over tiles staged with the 128-byte
    /// swizzle; the same chains, softmax and bits) where the device is compute capability 9.0.
    /// Off: measured (2026-11-27 twenty-fifth session, H200, qwen3-8b, ncu at the card's clocks)
    /// 289–293 µs per launch over a 2,048-token prompt either way and 40.5–41.5 → 41.8–43.1 over
    /// 512 (274–277 at 2,048 before the proxy fence that the tensor cores' reads of cp.async
    /// data need); whole prompts within 1%. The fold is bound by its softmax, fold and staging
    /// instructions and its barriers, not by its products.
    pub prefill_wgmma: bool,
    /// In steps that mix decode tokens with prompt chunks, the decode tokens' attention runs
    /// through the decode kernels (as in decode-only steps) and only the prompt rows through
    /// rope_append, attn_prefill and attn_combine. Off, attn_prefill takes every row, and its
    /// blocks of decode tokens (one sequence each) walk their sequences' tiles one sequence
    /// after another.
    pub mixed_decode_attention: bool,
    /// The fixed-order GEMM runs on Hopper's warpgroup MMA (`mma_*_wg`, `mma_*_wg64`, sm_90a:
    /// the same tiles, chains and bits, the tensor-core work issued asynchronously) where the
    /// device is compute capability 9.0 and K is a multiple of 64; elsewhere the mma.sync GEMM.
    pub wgmma: bool,
    /// The wgmma GEMM's 128-token tiles run warp-specialized (`mma_*_wgs`: a producer
    /// warpgroup stages the groups through per-slot barriers, the two computing warpgroups only
    /// wait for their data; the same bits). Off: measured on the same binary (2026-11-26
    /// eleventh session, qwen3-8b, 2,048 tokens) it gained 1.5–6% per projection and 3% per
    /// prompt on an H200 but lost 7% on gate|up and nothing overall on an H100.
    pub wg_specialized: bool,
    /// The wgmma GEMM's 128-token tiles over tiled weights run warp-specialized with their
    /// stages delivered by tensor copies (`mma_*_wgt`: one producer thread, two TMA copies per
    /// group, no copy instructions or proxy fence in the computing warps; the same bits). Takes
    /// precedence over `wg_specialized`. On: measured on the same binary (2026-11-26 twelfth
    /// session, H100, qwen3-8b) 5–19% faster per projection from 256 to 2,048 tokens and
    /// 10–13% per 512- to 2,048-token prompt; on 64-token tiles it was no faster than `wg64`,
    /// so those stay on `wg64`.
    pub wg_tma: bool,
    /// From this many tokens (and `gemm_prompt_fit_from`) the GEMM launches `wgt` would run may
    /// take wider tiles (`wg_wide_tiles`): `wgt144` (m64 × n144 wgmma, 4 stages) and `wgt192`
    /// (m64 × n192, 3 stages), the same bits. Wider tiles stage no fewer bytes per token; they
    /// win where the token count fits them better (576 = 4 × 144 tokens, not 4.5 × 128) and
    /// their tiles fill the SMs' waves better (2026-12-08 thirty-ninth session, H100, qwen3-8b:
    /// o, gate|up and down at 576 tokens 16–27% faster on 144-token tiles, a 64 + 512-token
    /// mixed step 27.0 → 22.6 ms; at 2,048 tokens they lose).
    pub wg_wide_from: Option<usize>,
    /// Which wider tiles `wg_wide_from` lets a launch take.
    pub wg_wide_tiles: WideTiles,
    /// Whether the wgmma GEMM's 64-token tiles (decode batches of 32–64) run persistent
    /// (`mma_*_wg64s`): one block per SM (at most `wg_stream_blocks` where that is not 0), each
    /// taking an even share of the launch's chains (whole tiles, then the leftover tiles'
    /// chains, merged in the one order by the last to finish) through one pipeline from tile to
    /// tile; the same bits. Only under `GemmSplit::Auto` (fixed splits keep `wg64`, for the
    /// bit-identity tests). Off: measured (2026-11-26 fourteenth session, H200, qwen3-8b batch
    /// 64) each launch `Auto` picks (gate|up and q|k|v at 64 tokens) ran alone 6–10% faster (ncu
    /// at the card's clocks: gate|up 71.3 → 67.3 µs, q|k|v 28.4 → 25.7), but whole decode steps
    /// did not follow (batch 32 7.126 → 7.101 ms, 48 8.32 → 8.37, 64 8.60 → 8.65); `Always`
    /// (o and down too) lost 5%.
    pub wg_stream: WgStream,
    /// The one-n-tile projections without the deep prefetch (n1, n1h: decode steps of 1–8
    /// tokens) stream their weights through a ring in shared memory (`n1r`, `n1hr`; mma.cuh
    /// `MMA_RING`: cp.async, 3 groups ahead per warp) instead of holding 2 groups in registers:
    /// more bytes in flight per SM and more of a block's weights asked for before it waits for
    /// the previous kernel. The same operands, the same bits. Off: measured (2026-11-28
    /// twenty-sixth session, H200, batch 1) it slows qwen3-8b's step 8% and qwen3-0.6b's 2%.
    pub weight_ring: RingUse,
    /// The same for the deep one-n-tile projections (`n1dr`: 4 groups per warp in shared
    /// memory instead of 4 in registers). On every launch (twenty-sixth session, H200, same
    /// binary) qwen3-0.6b's batch-1 step ran 5% faster (0.922 → 0.873 ms) but qwen3-8b's 6%
    /// slower (4.498 → 4.749 ms), although the 8B's down projection alone runs 15% faster on
    /// it (32.4 → 27.4 µs): within a step its blocks do not overlap the neighbouring kernels
    /// the way the register form's do. Default: below one wave (2026-11-28 twenty-seventh
    /// session, H200, same binary): qwen3-0.6b's o and down (64 blocks) take it, 0.913 →
    /// 0.878–0.882 ms per step, and qwen3-8b's launches (256 blocks and more) keep n1d,
    /// 4.485 ms either way.
    pub weight_ring_deep: RingUse,
    /// One shared-memory carveout (percent of each SM's L1 and shared memory) asked for every
    /// kernel instead of each kernel's own (the driver's choice, or the ring's), to test whether
    /// kernels asking for different splits lose their overlap across programmatic launches (an
    /// SM changes its split only once it is empty). None, the default: each kernel's own.
    /// Measured (2026-11-28 twenty-seventh session, H200, batch 1, same binary): 0%, 60% and
    /// 100% slowed qwen3-8b's step 12%, 6% and 8% (qwen3-0.6b's 9%, 1% and 3%); under 60% the
    /// deep ring on every launch ran as fast as the register form, not faster than the defaults.
    pub carveout: Option<i32>,
    /// Most blocks of a `wg64s` launch (0: one per SM): fewer than the SMs leave some free for
    /// the next kernel's early blocks; the bit-identity test sets a few so that tiles are
    /// shared in odd places.
    pub wg_stream_blocks: u32,
    /// The warp-specialized wgmma GEMM (`wgs`, `wgt`) runs persistent: at most one block per SM
    /// (`wgs_blocks`), each walking the launch's tiles b, b + blocks, ... through one stage ring,
    /// so that a tile's first groups are staged while the tile before ends (its last groups, its
    /// epilogue) instead of after its block has left the SM; the same bits. On: a step of 64
    /// decode tokens and a 512-token prompt chunk (the daemon's steady state under load) ran
    /// 1.8–2.2% faster on qwen3-8b in five same-binary pairs on H200s (2026-11-28 thirtieth
    /// session, twice; thirty-first session, three times: 25.74 → 25.17 GPU ms), with decode-only
    /// steps and lone 2,048-token prompts unchanged (±0.3%). The twenty-third session had
    /// measured lone 2,048-token prompts +0.9–1.3% on an H100 (77.58 → 78.32 ms), on the GEMM
    /// of that time (before its tail plans); not measured on an H100 since.
    pub wg_persistent: bool,
    /// Most blocks of a persistent `wgs`/`wgt` launch (0: one per SM); the bit-identity test
    /// sets a few so that every block walks several tiles.
    pub wg_persistent_blocks: u32,
    /// A step with prompt rows whose q|k|v projection runs `wgt` (head dims 64 and 128) rotates
    /// and appends its heads in that GEMM's epilogue (`mma_rope_*_wgt`, mma.cuh MEPI_ROPE:
    /// rope_append's operations on the finished tile, the same bits) instead of storing the
    /// f32 projection for a rope_append launch to read back: one launch and a round trip of the
    /// projection through memory fewer per layer. Off: measured (2026-11-28 thirtieth session,
    /// H200, qwen3-8b, same binary alternating three times) prompts of 512–2,048 tokens within
    /// ±0.4% (2,048: 75.86 → 75.53 GPU ms) and a step of 64 decode tokens with a 512-token
    /// chunk 1.6% slower (25.67 → 26.08): the epilogue, latency-bound on each unit's table
    /// loads, costs the tiles about what rope_append cost on its own.
    pub rope_epilogue: bool,
    /// One-n-tile projections (n1, n1h) of more row tiles than one wave of their blocks run
    /// persistent (`n1p`, `n1hp`): `persistent_blocks` blocks, each walking the row tiles
    /// b, b + blocks, ..., its weight loads running on from one tile into the next wherever
    /// every warp takes a multiple of its groups in flight per tile, so that the next tile's
    /// first weights are in flight while this one merges and stores; the same bits. On:
    /// qwen3-8b's batch-1 step 4.404 → 4.316 ms and batch 8 4.580 → 4.558 on an H200 (gate|up
    /// and the LM head persistent; same binary alternating twice, 2026-11-28 thirty-second
    /// session), qwen3-0.6b batch 1 0.878 → 0.872 (its LM head alone 98.4 → 81.1 µs), batch 8
    /// unchanged.
    pub n1_persistent: bool,
    /// Blocks of a persistent one-n-tile launch (0: `MMA_N1_BLOCKS_PER_SM` per SM); the
    /// bit-identity test sets a few so that every block walks many tiles.
    pub n1_persistent_blocks: u32,
    /// The one-tile residual adds (o, down) of token counts whose next norm prologue reads its
    /// own rows (1–2 tokens by default) also store each 8-row chunk's sum of squares per token
    /// (`bufs.ssq`), and that prologue (gate|up, the next q|k|v, the LM head) adds those
    /// instead of reading its rows back chunk by chunk: one round trip instead of hidden /
    /// 1,024 (4 at qwen3-8b's 4,096), in the same order, so the same bits
    /// (`CudaBackend::norm_sums`). For hidden sizes of at least this many columns (by default
    /// where the prologue's 128 threads take more than one chunk each, so more than one round
    /// trip); None never. Measured (2026-11-28 thirty-fourth session, H200, same binary
    /// alternating twice, on two machines): qwen3-8b's batch-1 step 4.394 → 4.334 ms (−1.4%),
    /// llama3-1b's 0.992 → 0.984 (−0.9%), batch 8 unchanged.
    pub norm_sums_from: Option<usize>,
}

/// Which 64-token wgmma GEMM launches run persistent (`KernelTuning::wg_stream`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WgStream {
    /// None: `wg64` runs them.
    Off,
    /// Those where it evens out the block waves (`wg_stream_gains`).
    Auto,
    /// Every one (the bit-identity tests).
    Always,
}

/// Which one-n-tile launches run the weight ring (`KernelTuning::weight_ring`, `_deep`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RingUse {
    /// None: the register forms run them.
    Off,
    /// Those of fewer blocks than the SMs (one partial wave: qwen3-0.6b's o and down), where
    /// the blocks' bytes in flight, not the SMs' shares, set the speed.
    BelowOneWave,
    /// Every one.
    Always,
}

impl RingUse {
    /// Whether a launch of `blocks` blocks on `sms` SMs runs the ring.
    pub fn takes(self, blocks: usize, sms: usize) -> bool {
        match self {
            RingUse::Off => false,
            RingUse::BelowOneWave => blocks < sms,
            RingUse::Always => true,
        }
    }
}

/// The wider tiles of the wgmma GEMM's prompt launches (`KernelTuning::wg_wide_tiles`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WideTiles {
    /// Per launch, 128-, 144- or 192-token tiles, whichever `gemm_cost` prices cheapest.
    Priced,
    /// Always 144-token tiles (`wgt144`): for the A/Bs and the bit-identity test.
    Mid,
    /// Always 192-token tiles (`wgt192`): the same.
    Wide,
}

/// Chain splits of the fixed-order GEMM: blocks per 128-row × tile-token tile, each running a
/// share of the eight k-chains, merged in the one fixed order by the last to finish.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GemmSplit {
    /// Per launch, by block waves (`gemm_plan`).
    Auto,
    /// Always this many (1, 4 or 8): 1 is off; 4 and 8 exist for the bit-identity tests.
    Fixed(u32),
}

impl Default for KernelTuning {
    /// Measured on the H100 (qwen3-0.6b and qwen3-8b, batch 1 to 64, BENCHMARKS.md): the deep
    /// one-n-tile kernel where a projection gives at most 2 blocks per SM, serial attention
    /// from 32 decode tokens (4 since the tenth session, below), prepared inputs from 3 tokens,
    /// token splitting, tiled weights and the fixed-order GEMM from 64 tokens (from 128 where K < 4096) with its chains split over
    /// blocks where the tiles are few and 64-token tiles where cheaper, prompt attention over
    /// shared KV tiles (H200, 2026-11-26: qwen3-8b batch 64 18.4 → 16.0 ms per step and a
    /// 2,048-token prompt 567 → 426 ms; qwen3-0.6b batch 64 lost 10% with the GEMM from 64
    /// tokens, hence the K bound). Cluster attention lost at every batch size past 1;
    /// the L2 prefetch during attention gained 2% at batch 8 and lost up to 6% at batch 1.
    /// The GEMM on wgmma (H200, 2026-11-26 eighth session) took qwen3-8b batch 64 from 15.9 to
    /// 13.7 ms per step and a 2,048-token prompt from 359 to 282 ms, and starting it at 32
    /// tokens instead of 64 took batch 32 from 11.8 to 9.8 ms (at 16 it lost: 7.6 → 9.9 ms).
    /// Serial attention from 4 tokens instead of 32 (H200, 2026-11-26 tenth session, after its
    /// tile staging took one page lookup per position): qwen3-8b batch 8 5.36 → 4.74 ms per
    /// step and 16 7.32 → 5.79 over 128-token prompts, 5.85 → 5.13 and 8.34 → 6.18 over 512;
    /// batch 4 +0.6–3%; from 2 tokens batch 2 lost 2–7%. The 128-token GEMM tiles staged by
    /// tensor copies (H100, 2026-11-26 twelfth session): a 2,048-token prompt 101.9 → 91.8 ms.
    /// Prompt attention folded in its blocks from one row (H200, 2026-11-27 nineteenth
    /// session): a 2,048-token prompt 91.1 → 84.9 ms, 512 tokens 22.2 → 20.4, 64 closed-loop
    /// streams +2%.
    fn default() -> Self {
        KernelTuning {
            deep_n1_blocks_per_sm: 2,
            serial_attention_from: Some(4),
            serial_pairs_per_sm: Some(1),
            serial_parts_shared: true,
            cluster_attention: false,
            prepared_from: 3,
            token_split: true,
            tiled_weights: true,
            l2_prefetch_bytes: 0,
            l2_prefetch_until: 8,
            gemm_from: Some(32),
            gemm_narrow: true,
            gemm_split: GemmSplit::Auto,
            gemm_tail: Some(0),
            gemm_min_k: 4096,
            gemm_prompt_fit_from: 192,
            prefill_attention: true,
            prefill_fold_from: Some(1),
            prefill_wgmma: false,
            mixed_decode_attention: true,
            wgmma: true,
            wg_specialized: false,
            wg_tma: true,
            wg_wide_from: Some(192),
            wg_wide_tiles: WideTiles::Priced,
            wg_stream: WgStream::Off,
            weight_ring: RingUse::Off,
            weight_ring_deep: RingUse::BelowOneWave,
            carveout: None,
            wg_stream_blocks: 0,
            wg_persistent: true,
            wg_persistent_blocks: 0,
            rope_epilogue: false,
            n1_persistent: true,
            n1_persistent_blocks: 0,
            norm_sums_from: Some(2048),
        }
    }
}

impl KernelTuning {
    /// The variants of the kernels as they were before any was measured (every variant off,
    /// row-major weights): the baseline of the A/B runs.
    pub fn baseline() -> Self {
        KernelTuning {
            deep_n1_blocks_per_sm: 0,
            serial_attention_from: None,
            serial_pairs_per_sm: None,
            serial_parts_shared: false,
            cluster_attention: false,
            prepared_from: 0,
            token_split: false,
            tiled_weights: false,
            l2_prefetch_bytes: 0,
            l2_prefetch_until: 0,
            gemm_from: None,
            gemm_narrow: false,
            gemm_split: GemmSplit::Fixed(1),
            gemm_tail: None,
            gemm_min_k: 0,
            gemm_prompt_fit_from: 512,
            prefill_attention: false,
            prefill_fold_from: None,
            prefill_wgmma: false,
            mixed_decode_attention: false,
            wgmma: false,
            wg_specialized: false,
            wg_tma: false,
            wg_wide_from: None,
            wg_wide_tiles: WideTiles::Priced,
            wg_stream: WgStream::Off,
            weight_ring: RingUse::Off,
            weight_ring_deep: RingUse::Off,
            carveout: None,
            wg_stream_blocks: 0,
            wg_persistent: false,
            wg_persistent_blocks: 0,
            rope_epilogue: false,
            n1_persistent: false,
            n1_persistent_blocks: 0,
            norm_sums_from: None,
        }
    }

    /// The defaults, with `NERVA_MMA_DEEP=<blocks per SM>`, `NERVA_ATTN_SERIAL=<tokens>`,
    /// `NERVA_ATTN_SERIAL_PAIRS=<blocks per SM>`, `NERVA_ATTN_SERIAL_PARTS=1`,
    /// `NERVA_ATTN_CLUSTER=1`, `NERVA_MMA_PREPARED=<tokens>`, `NERVA_MMA_SPLIT=1`,
    /// `NERVA_TILED_WEIGHTS=1`, `NERVA_L2_PREFETCH_MIB=<MiB>`, `NERVA_L2_PREFETCH_UNTIL=<tokens>`
    /// `NERVA_MMA_GEMM=<tokens>`, `NERVA_MMA_GEMM_NARROW=1`, `NERVA_MMA_GEMM_SPLIT=<1, 4, 8;
    /// 0 auto>`, `NERVA_MMA_GEMM_TAIL=<0 off, 1 waves of the SMs, n > 1 waves of n tiles>`,
    /// `NERVA_MMA_GEMM_MIN_K=<columns>`, `NERVA_ATTN_PREFILL=1`,
    /// `NERVA_ATTN_FOLD=<tokens>`, `NERVA_ATTN_WGMMA=1`, `NERVA_ATTN_MIXED=1`,
    /// `NERVA_WGMMA=1`, `NERVA_MMA_RING=<0 off, 1 always, 2 below one wave>`,
    /// `NERVA_MMA_RING_DEEP=<the same>`, `NERVA_CARVEOUT=<percent>`,
    /// `NERVA_WG_SPECIALIZED=1`, `NERVA_WG_TMA=1`, `NERVA_WG_WIDE=<tokens>`,
    /// `NERVA_WG_WIDE_TILES=<0 priced, 144 or 192 always>`,
    /// `NERVA_WG_STREAM=<0 off, 1 auto, 2 always>` and `NERVA_WG_STREAM_BLOCKS=<blocks>`, `NERVA_ROPE_EPILOGUE=1`, `NERVA_MMA_PERSISTENT=1`,
    /// `NERVA_MMA_PERSISTENT_BLOCKS=<blocks>` and `NERVA_NORM_SUMS=<columns>` applied (`0` turns a variant off;
    /// `NERVA_KERNEL_BASELINE=1` starts from `baseline` instead of the defaults).
    pub fn from_env() -> Self {
        let var = |name: &str| {
            std::env::var(name)
                .ok()
                .and_then(|v| v.trim().parse::<usize>().ok())
        };
        let d = if var("NERVA_KERNEL_BASELINE").is_some_and(|v| v != 0) {
            KernelTuning::baseline()
        } else {
            KernelTuning::default()
        };
        // A token count from which a variant runs: `0` never, unset the default.
        let from = |name: &str, default: Option<usize>| match var(name) {
            Some(0) => None,
            Some(n) => Some(n),
            None => default,
        };
        let ring = |name: &str, default: RingUse| match var(name) {
            Some(0) => RingUse::Off,
            Some(1) => RingUse::Always,
            Some(2) => RingUse::BelowOneWave,
            Some(n) => {
                tracing::warn!("{name}={n} is not 0, 1 or 2: ignored");
                default
            }
            None => default,
        };
        KernelTuning {
            deep_n1_blocks_per_sm: var("NERVA_MMA_DEEP").unwrap_or(d.deep_n1_blocks_per_sm),
            serial_attention_from: from("NERVA_ATTN_SERIAL", d.serial_attention_from),
            serial_pairs_per_sm: from("NERVA_ATTN_SERIAL_PAIRS", d.serial_pairs_per_sm),
            serial_parts_shared: var("NERVA_ATTN_SERIAL_PARTS")
                .map_or(d.serial_parts_shared, |v| v != 0),
            cluster_attention: var("NERVA_ATTN_CLUSTER").map_or(d.cluster_attention, |v| v != 0),
            prepared_from: var("NERVA_MMA_PREPARED").unwrap_or(d.prepared_from),
            token_split: var("NERVA_MMA_SPLIT").map_or(d.token_split, |v| v != 0),
            tiled_weights: var("NERVA_TILED_WEIGHTS").map_or(d.tiled_weights, |v| v != 0),
            l2_prefetch_bytes: var("NERVA_L2_PREFETCH_MIB")
                .map_or(d.l2_prefetch_bytes, |mib| mib << 20),
            l2_prefetch_until: var("NERVA_L2_PREFETCH_UNTIL").unwrap_or(d.l2_prefetch_until),
            gemm_from: from("NERVA_MMA_GEMM", d.gemm_from),
            gemm_narrow: var("NERVA_MMA_GEMM_NARROW").map_or(d.gemm_narrow, |v| v != 0),
            gemm_split: match var("NERVA_MMA_GEMM_SPLIT") {
                Some(0) => GemmSplit::Auto,
                Some(n @ (1 | 4 | 8)) => GemmSplit::Fixed(n as u32),
                Some(n) => {
                    tracing::warn!("NERVA_MMA_GEMM_SPLIT={n} is not 0, 1, 4 or 8: ignored");
                    d.gemm_split
                }
                None => d.gemm_split,
            },
            gemm_tail: match var("NERVA_MMA_GEMM_TAIL") {
                Some(0) => None,
                Some(1) => Some(0),
                Some(n) => Some(n),
                None => d.gemm_tail,
            },
            gemm_min_k: var("NERVA_MMA_GEMM_MIN_K").unwrap_or(d.gemm_min_k),
            gemm_prompt_fit_from: var("NERVA_MMA_GEMM_PROMPT_FIT")
                .unwrap_or(d.gemm_prompt_fit_from),
            prefill_attention: var("NERVA_ATTN_PREFILL").map_or(d.prefill_attention, |v| v != 0),
            prefill_fold_from: from("NERVA_ATTN_FOLD", d.prefill_fold_from),
            prefill_wgmma: var("NERVA_ATTN_WGMMA").map_or(d.prefill_wgmma, |v| v != 0),
            mixed_decode_attention: var("NERVA_ATTN_MIXED")
                .map_or(d.mixed_decode_attention, |v| v != 0),
            wgmma: var("NERVA_WGMMA").map_or(d.wgmma, |v| v != 0),
            wg_specialized: var("NERVA_WG_SPECIALIZED").map_or(d.wg_specialized, |v| v != 0),
            wg_tma: var("NERVA_WG_TMA").map_or(d.wg_tma, |v| v != 0),
            wg_wide_from: from("NERVA_WG_WIDE", d.wg_wide_from),
            wg_wide_tiles: match var("NERVA_WG_WIDE_TILES") {
                Some(0) => WideTiles::Priced,
                Some(144) => WideTiles::Mid,
                Some(192) => WideTiles::Wide,
                Some(n) => {
                    tracing::warn!("NERVA_WG_WIDE_TILES={n} is not 0, 144 or 192: ignored");
                    d.wg_wide_tiles
                }
                None => d.wg_wide_tiles,
            },
            wg_stream: match var("NERVA_WG_STREAM") {
                Some(0) => WgStream::Off,
                Some(1) => WgStream::Auto,
                Some(2) => WgStream::Always,
                Some(n) => {
                    tracing::warn!("NERVA_WG_STREAM={n} is not 0, 1 or 2: ignored");
                    d.wg_stream
                }
                None => d.wg_stream,
            },
            weight_ring: ring("NERVA_MMA_RING", d.weight_ring),
            weight_ring_deep: ring("NERVA_MMA_RING_DEEP", d.weight_ring_deep),
            carveout: match var("NERVA_CARVEOUT") {
                Some(p @ 0..=100) => Some(p as i32),
                Some(p) => {
                    tracing::warn!("NERVA_CARVEOUT={p} is not a percentage: ignored");
                    d.carveout
                }
                None => d.carveout,
            },
            wg_stream_blocks: var("NERVA_WG_STREAM_BLOCKS")
                .map_or(d.wg_stream_blocks, |v| v as u32),
            wg_persistent: var("NERVA_WG_PERSISTENT").map_or(d.wg_persistent, |v| v != 0),
            wg_persistent_blocks: var("NERVA_WG_PERSISTENT_BLOCKS")
                .map_or(d.wg_persistent_blocks, |v| v as u32),
            rope_epilogue: var("NERVA_ROPE_EPILOGUE").map_or(d.rope_epilogue, |v| v != 0),
            n1_persistent: var("NERVA_MMA_PERSISTENT").map_or(d.n1_persistent, |v| v != 0),
            n1_persistent_blocks: var("NERVA_MMA_PERSISTENT_BLOCKS")
                .map_or(d.n1_persistent_blocks, |v| v as u32),
            norm_sums_from: from("NERVA_NORM_SUMS", d.norm_sums_from),
        }
    }
}

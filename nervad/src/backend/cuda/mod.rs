//! The CUDA backend: exact BF16/F16 decode on one GPU.
//!
//! - Everything is allocated once at start, in one device arena sized from `--gpu-memory`:
//!   weights (q|k|v and gate|up concatenated so each is one projection), the paged KV pool
//!   (what the rest leaves), activations, attention partials, logits, sampler state, step
//!   metadata, and a ring of pinned staging buffers. After construction nothing is allocated.
//! - A step enqueues: embedding → per layer [RMSNorm+q|k|v projection, QK-norm+RoPE+KV append,
//!   split-KV attention, combine, o_proj+residual, RMSNorm+gate|up projection,
//!   silu·mul+down_proj+residual] → final norm+LM head over the rows that need logits →
//!   sampling. Pure decode steps replay one CUDA graph captured per batch-size bucket at start.
//! - Device-first tokens: a decode entry marked `from_last_sample` reads its input token from
//!   the device token ring the previous step's sampler wrote, so the host never has to know it
//!   before launching the next step. The host learns sampled tokens from a pinned copy after an
//!   event: `launch` enqueues, `collect` waits for the oldest launched step.
//! - Activations are f32 (as in the CPU reference); weights and KV stay in the checkpoint's
//!   16-bit type; every reduction has one fixed order per output element (batch-invariant).

pub mod blas;
pub mod driver;
pub mod kernels;
pub mod launch_shape;
pub mod prebuild;
pub mod step_ledger;
pub mod swap;
pub mod tma;
pub mod tuning;
pub mod weight_tiles;

use std::collections::VecDeque;

use crate::backend::SamplingParams;
use crate::model::{DType, ModelConfig, ModelWeights, Tensor};

use super::cpu::rope::RopeTable;
use super::sampling::{check_fork, check_start};
use super::{
    Backend, BackendError, BackendInfo, BackendLimits, BackendOptions, MAX_TOP_LOGPROBS,
    SampledToken, SeqStep, StepOutput, StepReport, validate_step,
};
use blas::Blas;
use driver::{Args, DevBuf, DriverCounters, Event, Gpu, Graph, Kernel, Pinned};
use step_ledger::{CounterMark, DeviceClock};

use launch_shape::{
    ATTN_GENERAL_DIM, ATTN_PREFILL_ROWS, ATTN_SERIAL_PAIR_THREADS, ATTN_SPLITS, ATTN_THREADS,
    attn_prefill_shared, attn_prefill_wg_shared, attn_serial_parts, attn_serial_shared,
    prefill_split_blocks, prepared_inputs,
};
pub use launch_shape::{
    GEMM_SPLIT_MAX_BLOCKS_PER_SM, MMA_DEEP, MMA_GEMM, MMA_GEMM_MID_TOKENS, MMA_GEMM_NARROW,
    MMA_GEMM_NARROW_TOKENS, MMA_GEMM_SHARED, MMA_GEMM_TOKENS, MMA_GEMM_WIDE_TOKENS, MMA_HALF,
    MMA_PERSIST, MMA_RING, MMA_RING_FORMS, MMA_SPLIT, MMA_VARIANTS, MMA_WG, MMA_WG_STREAM, MMA_WGS,
    MMA_WGS_THREADS, MMA_WGT, MMA_WGT_MID, MMA_WGT_WIDE, MmaLaunch, WG_STREAM_SHARED, gemm_form,
    gemm_plan, gemm_tile_tokens, mma_gemm_shared, mma_launch, mma_threads, mma_variant,
    one_tile_form, persistent_blocks, persistent_variant, prompt_fit, ring_carveout, ring_variant,
    to_half_grid, wg_gemm_shared, wg_stream_launch, wgs_blocks,
};
pub use tma::GemmMaps;
pub use tuning::{GemmSplit, KernelTuning, RingUse, WgStream, WideTiles};

/// Must match `kernels/attention.cu`.
const ATTN_MAX_GROUP: usize = 8;
const ATTN_MAX_DIM: usize = 256;
/// Heads (one warp each) per rope_append block; must match `kernels/rope_kv.cu`.
const ROPE_WARPS: u32 = 8;
/// Tokens per rope_append warp; must match `kernels/rope_kv.cu`.
const ROPE_TOKENS: u32 = 2;
/// Must match `SlotParams` / `SampleRecord` in `kernels/sampling.cu`.
const SLOT_PARAMS_BYTES: usize = 48;
const RECORD_BYTES: usize = 176;
/// Vocabulary chunks per sampled row in `logits_prepare` (kernels/sampling.cu).
const PREP_CHUNKS: usize = 64;
/// Fewest prefill tokens in a step that go through cuBLAS: below, the GEMV tiles are as fast
/// (kernels bench: cuBLAS wins from 8 tokens on, by 1.6-10x at 8).
const GEMM_MIN_TOKENS: usize = 8;
/// `Projections::Mixed`: the GEMV up to this many tokens (`gpu_kernels`, H100, qwen3-8b
/// shapes: at 1 token the GEMV is faster on every projection, mma at 0.86–0.95× its speed; at
/// 2 on all but q|k|v; at 8 mma is 1.24–2.6× faster; BENCHMARKS.md, 2026-11-23 third session).
const GEMV_MAX_TOKENS: usize = 2;
/// `Projections::Blas`: cuBLAS takes every projection launch of at least this many tokens
/// (decode batches and prompt chunks alike), the tensor-core kernels the smaller ones.
const BLAS_MIN_TOKENS: usize = 16;
/// Steps that may be launched and not yet collected.
const RING: usize = 4;
/// Marks a decode token read from the device token ring (kernels/common.cuh).
const FROM_SLOT: u32 = 0x8000_0000;
/// Programmatic dependent launch on devices that have it (sm_90+) under drivers that capture it
/// into graphs as programmatic edges (CUDA 12.3+), unless `NERVA_PDL=0` turns it off for a
/// comparison.
fn use_programmatic_launch(arch: u32, driver: (i32, i32)) -> bool {
    arch >= 90 && driver >= (12, 3) && std::env::var_os("NERVA_PDL").is_none_or(|v| v != "0")
}

/// How much device memory the backend may take.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum GpuMemory {
    /// A fraction of the memory free at start.
    Fraction(f64),
    /// Exactly this many bytes.
    Bytes(usize),
}

impl std::str::FromStr for GpuMemory {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.trim();
        if let Ok(f) = s.parse::<f64>()
            && f > 0.0
            && f <= 1.0
            && s.contains('.')
        {
            return Ok(GpuMemory::Fraction(f));
        }
        crate::backend::parse_bytes(s)
            .map(GpuMemory::Bytes)
            .map_err(|e| format!("{e} (or a fraction of free memory such as 0.9)"))
    }
}

/// CUDA-specific construction options.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CudaOptions {
    /// Device ordinal.
    pub device: usize,
    /// Device memory budget.
    pub memory: GpuMemory,
    /// Prefill projections through cuBLAS instead of the tensor-core decode kernels: prompts
    /// about twice as fast, but cuBLAS sums in an order of its own that depends on the number
    /// of rows, so a prompt's numbers then depend on how it was chunked and batched. Without
    /// it a prompt's numbers are bit-identical to decoding the same tokens one by one.
    /// Implied by `Projections::Gemv`, `Projections::Mixed` and `Projections::Blas` (speed
    /// modes: the GEMV is no prefill kernel).
    pub fast_prefill: bool,
    /// Which kernels run the projections of decode tokens (and of prefill, unless
    /// `fast_prefill`).
    pub projections: Projections,
    /// Kernel variants that change speed only (`KernelTuning`).
    pub tuning: KernelTuning,
}

/// The kernels of the per-token projections.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Projections {
    /// Tensor cores (mma.cuh) for every batch size: inputs rounded to 16 bits, one reduction
    /// order per output element whatever the batch, so results are batch-invariant, and the
    /// weights are read once per step up to 64 tokens.
    #[default]
    Tensor,
    /// CUDA-core GEMV (gemv.cu) with f32 inputs; reads the weights once per 8 tokens. Also
    /// batch-invariant; the fastest at one token per step.
    Gemv,
    /// The GEMV up to 2 tokens, the tensor cores above: the fastest at every batch size, but
    /// NOT batch-invariant (a sequence's numbers change when its step crosses 2 tokens).
    Mixed,
    /// cuBLAS for every launch of `BLAS_MIN_TOKENS` tokens or more (decode batches and prompt
    /// chunks in one GEMM each, the weights read once per step), the tensor cores below: the
    /// throughput mode for large batches, NOT batch-invariant (cuBLAS sums in an order that
    /// depends on the number of rows).
    Blas,
}

impl std::str::FromStr for Projections {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "tensor" => Ok(Projections::Tensor),
            "gemv" => Ok(Projections::Gemv),
            "mixed" => Ok(Projections::Mixed),
            "blas" => Ok(Projections::Blas),
            other => Err(format!(
                "unknown projection kernels {other:?} (tensor, gemv, mixed or blas)"
            )),
        }
    }
}

impl Default for CudaOptions {
    fn default() -> Self {
        CudaOptions {
            device: 0,
            memory: GpuMemory::Fraction(0.9),
            fast_prefill: false,
            projections: Projections::Tensor,
            tuning: KernelTuning::from_env(),
        }
    }
}

/// Can this process use CUDA device `device`? `Ok(description)` or why not (auto mode falls
/// back to the CPU with this reason).
pub fn probe(device: usize) -> Result<String, BackendError> {
    if !driver::driver_library_present() {
        return Err(BackendError::Device(
            "no CUDA driver (libcuda.so) on this host".into(),
        ));
    }
    let (major, minor) = driver::driver_version()?;
    if major < 12 {
        return Err(BackendError::Device(format!(
            "the CUDA driver supports CUDA {major}.{minor}; nervad needs 12.0 or newer"
        )));
    }
    let count = cudarc::driver::CudaContext::device_count()?;
    if count == 0 {
        return Err(BackendError::Device(
            "the CUDA driver sees no device".into(),
        ));
    }
    if device as i32 >= count {
        return Err(BackendError::Device(format!(
            "--device {device}: the driver sees {count} device(s)"
        )));
    }
    kernels::nvrtc_available()?;
    Ok(format!("CUDA {major}.{minor}, {count} device(s)"))
}

/// Per-layer device weights.
#[derive(Debug, Clone, Copy)]
struct LayerBufs {
    qkv: DevBuf,
    qkv_bias: DevBuf,
    o: DevBuf,
    o_bias: DevBuf,
    gate_up: DevBuf,
    gate_up_bias: DevBuf,
    down: DevBuf,
    down_bias: DevBuf,
    in_norm: DevBuf,
    post_norm: DevBuf,
    q_norm: DevBuf,
    k_norm: DevBuf,
}

/// Ring form `form` of a one-n-tile projection (`MMA_VARIANTS[MMA_RING + form]`) set up to
/// launch: its ring's dynamic shared memory and a carveout that fits the blocks per SM its
/// registers allow, leaving the rest to L1 (a warning where the driver fits fewer), or the
/// carveout every kernel asks for (`KernelTuning::carveout`).
pub fn ring_form(
    gpu: &Gpu,
    k: Kernel,
    form: usize,
    arch: u32,
    carveout: Option<i32>,
) -> Result<Kernel, BackendError> {
    let (bytes, blocks) = MMA_RING_FORMS[form];
    let k = gpu.with_dynamic_shared(k, bytes)?;
    let percent = carveout.unwrap_or_else(|| ring_carveout(arch, blocks, bytes));
    gpu.prefer_shared_memory(k, percent)?;
    let fit = gpu.blocks_per_sm(k, 256)?;
    if fit < blocks as i32 {
        tracing::warn!(
            arch,
            "a weight ring of {bytes} bytes leaves {fit} blocks per SM, not {blocks}"
        );
    }
    Ok(k)
}

/// The kernels, looked up once.
#[derive(Debug, Clone, Copy)]
struct Kernels {
    /// RMSNorm + projection; 4 and 2 rows per block.
    gemv_rms: [GemvFamily; 2],
    /// Projection + residual add; 4 and 2 rows per block.
    gemv_plain_add: [GemvFamily; 2],
    /// RMSNorm + gate|up (rows interleaved in pairs) + silu(gate)·up; 4 rows per block.
    gemv_glu: [GemvFamily; 1],
    /// The tensor-core projections (mma.cuh, built as mma.cu or mma_tiled.cu): rms, plain_add, glu.
    mma: [MmaFamily; 3],
    /// The q|k|v projection's `wgt` with the rope epilogue (`KernelTuning::rope_epilogue`).
    qkv_rope: Kernel,
    embed: Kernel,
    rope_append: Kernel,
    attn_split: Kernel,
    attn_combine: Kernel,
    attn_decode: Kernel,
    /// attn_decode's arithmetic with one block per (token, kv head) (`KernelTuning`), in
    /// blocks of 8 warps (one per SM) and of 4 (two per SM).
    attn_decode_serial: Kernel,
    attn_decode_serial_pair: Kernel,
    /// attn_decode's arithmetic with the split blocks in one cluster (`KernelTuning`, sm_90+).
    attn_decode_cluster: Kernel,
    /// attn_split for prompt chunks, KV tiles shared by a block's tokens (head dims 64 and
    /// 128, 1, 2, 4 or 8 query heads per kv head).
    attn_prefill: Option<Kernel>,
    /// attn_prefill with every split of a block's rows folded into their merge in the block
    /// (no partials, no attn_combine), where attn_prefill is built.
    attn_prefill_fold: Option<Kernel>,
    /// attn_prefill_fold on wgmma (head dim 128, sm_90a; `KernelTuning::prefill_wgmma`).
    attn_prefill_wg: Option<Kernel>,
    prepare: Kernel,
    sample: Kernel,
    read_bandwidth: Kernel,
    /// Prefill: projection inputs prepared and rounded for cuBLAS (rms, plain, silu).
    to_half: [Kernel; 3],
    add_bias: Kernel,
}

/// Byte offsets of the step metadata arrays (one upload per step).
#[derive(Debug, Clone, Copy)]
struct MetaLayout {
    token: usize,
    position: usize,
    token_seq: usize,
    seq_slot: usize,
    counts: usize,
    /// The counts of a mixed step's prompt rows seen on their own (`meta_from`): [0] the
    /// tokens past the step's decode tokens.
    chunk_counts: usize,
    lrow_token: usize,
    lrow_seq: usize,
    lrow_sample: usize,
    token_slot: usize,
    bytes: usize,
}

impl MetaLayout {
    fn new(tokens: usize, seqs: usize) -> Self {
        let mut at = 0;
        let mut take = |n: usize| {
            let o = at;
            at += n * 4;
            o
        };
        let token = take(tokens);
        let position = take(tokens);
        let token_seq = take(tokens);
        let seq_slot = take(seqs);
        let counts = take(4);
        let chunk_counts = take(4);
        let lrow_token = take(tokens);
        let lrow_seq = take(tokens);
        let lrow_sample = take(tokens);
        let token_slot = take(tokens);
        MetaLayout {
            token,
            position,
            token_seq,
            seq_slot,
            counts,
            chunk_counts,
            lrow_token,
            lrow_seq,
            lrow_sample,
            token_slot,
            bytes: at,
        }
    }
}

/// The kernels' `StepMeta` (kernels/common.cuh): device pointers, passed by value.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct StepMetaArg {
    token: u64,
    position: u64,
    token_seq: u64,
    seq_slot: u64,
    counts: u64,
    lrow_token: u64,
    lrow_seq: u64,
    lrow_sample: u64,
    token_slot: u64,
}

/// Attention kernel arguments fixed by the model: query and kv heads, head dim, the QK-norm's
/// epsilon, the sliding window (0: none) and the score scale 1/√head_dim.
#[derive(Debug, Clone, Copy)]
struct AttnScalars {
    heads: i32,
    kv_heads: i32,
    head_dim: i32,
    eps: f32,
    window: i32,
    scale: f32,
}

/// The kernels' `KvGeometry` (kernels/kv.cuh).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct KvGeometryArg {
    layers: i32,
    layer: i32,
    page_tokens: i32,
    kv_dim: i32,
    max_pages: i32,
}

/// The kernels' `RopeEpilogue` (kernels/mma.cuh), passed by value to `mma_rope_*_wgt`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct RopeEpilogueArg {
    meta: StepMetaArg,
    q_out: u64,
    kv: u64,
    tables: u64,
    geo: KvGeometryArg,
    heads: i32,
    kv_heads: i32,
    head_dim: i32,
    from: i32,
    q_norm: u64,
    k_norm: u64,
    eps: f32,
    cos: u64,
    sin: u64,
}
// The C struct's size (mma.cuh asserts the same there).
const _: () = assert!(std::mem::size_of::<RopeEpilogueArg>() == 176);

/// The kernels' `L2Prefetch` (kernels/common.cuh): address ranges asked into L2.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct L2PrefetchArg {
    ptr: [u64; L2_RANGES],
    bytes: [u32; L2_RANGES],
}

/// Ranges an `L2PrefetchArg` holds (kernels/common.cuh's L2_RANGES).
const L2_RANGES: usize = 4;

impl L2PrefetchArg {
    /// The first `budget` bytes of `bufs` in order (each range cut to a multiple of 16 bytes).
    fn first_bytes(bufs: [DevBuf; L2_RANGES], mut budget: usize) -> Self {
        let mut pf = L2PrefetchArg::default();
        for (i, b) in bufs.iter().enumerate() {
            let take = b.bytes.min(budget).min(u32::MAX as usize) & !15;
            if b.ptr == 0 || take == 0 {
                continue;
            }
            pf.ptr[i] = b.ptr;
            pf.bytes[i] = take as u32;
            budget -= take;
        }
        pf
    }
}

/// Device buffers other than weights.
#[derive(Debug, Clone, Copy)]
struct Bufs {
    embed: DevBuf,
    lm_head: DevBuf,
    final_norm: DevBuf,
    cos: DevBuf,
    sin: DevBuf,
    kv: DevBuf,
    x: DevBuf,
    qkv: DevBuf,
    q: DevBuf,
    attn: DevBuf,
    /// gate|up projection of prefill rows that went through cuBLAS (rows interleaved in pairs).
    gu: DevBuf,
    /// silu(gate)·up, the down projection's input.
    act: DevBuf,
    part_o: DevBuf,
    part_ml: DevBuf,
    /// Prefill projection inputs rounded to 16 bits for cuBLAS, and its workspace.
    xa: DevBuf,
    /// A projection's inputs prepared in 16 bits by the kernel before it (`Proj::half_out`);
    /// apart from `xa`, which that kernel may be reading.
    xb: DevBuf,
    /// Per x row, each 8-value chunk's sum of squares (f64) as the norm prologues add them:
    /// written by the one-tile residual adds, read by the next norm prologue
    /// (`CudaBackend::ssq_rows`).
    ssq: DevBuf,
    blas_ws: DevBuf,
    /// Per (token, kv head): split blocks of attn_decode done so far (back to 0 after each).
    attn_done: DevBuf,
    /// The chain-split GEMM's partial tiles, and per tile its blocks done so far (back to 0
    /// after each launch).
    gemm_ws: DevBuf,
    gemm_done: DevBuf,
    logits: DevBuf,
    weights: DevBuf,
    meta: DevBuf,
    tables: DevBuf,
    params: DevBuf,
    counts: DevBuf,
    prompt_bits: DevBuf,
    sampled: DevBuf,
    records: DevBuf,
    sink: DevBuf,
    chunk_stats: DevBuf,
}

/// What one launched, not yet collected step needs at collect time.
struct InFlight {
    ring: usize,
    seqs: usize,
    /// Batch entries that sample (by batch index).
    sample: [bool; 1024],
    /// The step's figures so far (its launch's share; collect adds the rest).
    report: StepReport,
}

/// Staging of one ring entry.
struct Stage {
    meta: Pinned,
    records: Pinned,
    done: Event,
    start: Event,
    end: Event,
}

/// Cumulative figures of the backend (the token ledger reads these).
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct CudaStats {
    /// Driver counters (launches, graph replays and nodes, syncs, copies, allocations).
    pub driver: DriverCounters,
    /// Steps run.
    pub steps: u64,
    /// Steps that replayed a captured graph.
    pub graph_steps: u64,
    /// Device time of all steps, ms.
    pub gpu_ms: f64,
    /// Device time of the last collected step, ms.
    pub last_gpu_ms: f32,
    /// Host time inside launch and collect of the collected steps, ns.
    pub host_ns: u64,
}

/// A projection kernel for token tiles of 1, 2, 4 and 8, with the rows each block takes.
#[derive(Debug, Clone, Copy)]
struct GemvFamily {
    tiles: [Kernel; 4],
    rows: u32,
}

impl GemvFamily {
    fn new(k: &[Kernel], rows: u32) -> Self {
        GemvFamily {
            tiles: [k[0], k[1], k[2], k[3]],
            rows,
        }
    }
}

/// A tensor-core projection kernel per token-tile width: one n-tile (1–8 tokens, input
/// prepared in the kernel), then 2, 4 n-tiles and 8 n-tiles × 2 row tiles (inputs prepared by
/// to_half), and the one-n-tile kernel with deeper prefetch for projections of few blocks
/// (`KernelTuning::deep_n1_blocks_per_sm`). Every variant gives the same bits for a token.
#[derive(Debug, Clone, Copy)]
struct MmaFamily {
    n1: Kernel,
    n2: Kernel,
    n4: Kernel,
    n8m2: Kernel,
    n1_deep: Kernel,
    /// One n-tile reading inputs prepared by to_half.
    n1_half: Kernel,
    /// n2, n4, n8m2 taking token tiles from the launch.
    split: [Kernel; 3],
    /// The fixed-order GEMM (with its dynamic shared memory).
    gemm: Kernel,
    /// The same on 64-token tiles.
    gemm_narrow: Kernel,
    /// The GEMM on wgmma (sm_90a), 128- and 64-token tiles.
    wg: Kernel,
    wg_narrow: Kernel,
    /// The 128-token wgmma GEMM, warp-specialized (`MMA_WGS_THREADS` threads).
    wg_specialized: Kernel,
    /// The same staged by tensor copies (tiled weights; two tensor maps per launch).
    wg_tma: Kernel,
    /// The same on 192- and 144-token tiles (`KernelTuning::wg_wide_from`, `wg_wide_tiles`).
    wg_tma_wide: Kernel,
    wg_tma_mid: Kernel,
    /// The 64-token wgmma GEMM, persistent (one block per SM sharing the launch's tiles).
    wg_stream: Kernel,
    /// n1, n1d and n1h streaming their weights through shared memory (`ring_variant`).
    ring: [Kernel; 3],
    /// n1 and n1h persistent (`persistent_variant`).
    persistent: [Kernel; 2],
}

impl MmaFamily {
    fn kernel(&self, variant: usize) -> Kernel {
        match variant {
            0 => self.n1,
            1 => self.n2,
            2 => self.n4,
            3 => self.n8m2,
            MMA_DEEP => self.n1_deep,
            MMA_HALF => self.n1_half,
            MMA_GEMM => self.gemm,
            MMA_GEMM_NARROW => self.gemm_narrow,
            MMA_WG => self.wg,
            v if v == MMA_WG + 1 => self.wg_narrow,
            MMA_WGS => self.wg_specialized,
            MMA_WGT => self.wg_tma,
            MMA_WGT_WIDE => self.wg_tma_wide,
            MMA_WGT_MID => self.wg_tma_mid,
            MMA_WG_STREAM => self.wg_stream,
            v if v >= MMA_PERSIST => self.persistent[v - MMA_PERSIST],
            v if v >= MMA_RING => self.ring[v - MMA_RING],
            v => self.split[v - MMA_SPLIT],
        }
    }
}

/// Projections with at most this many 4-row blocks per multiprocessor run 2 rows per block
/// instead, so that every multiprocessor gets work. Measured (`gpu_kernels`, H100,
/// lab/gpu/results/s4/kernels_two_rows.log): 2 rows win only below 2 blocks per SM (qwen3-0.6b
/// o_proj and down_proj, 256 blocks: 35.6% vs 31.9% and 43.2% vs 39.1% of the bandwidth) and
/// lose above (qwen3-8b q|k|v, 1,536 blocks: 66.9% vs 76.4%). Both give the same bits.
const FEW_ROWS_PER_SM: usize = 2;

/// The kind of a layer projection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Input {
    /// RMSNorm of x, then the matrix; writes y (q|k|v).
    Rms,
    /// x as it is; adds into y (o_proj into the residual stream).
    PlainAdd,
    /// RMSNorm of x, then gate|up with rows interleaved in pairs. The GEMV writes silu(gate)·up
    /// to y; the cuBLAS rows write gate|up itself to gemm_y.
    RmsGlu,
    /// down_proj, adding into y: the GEMV reads the activation x; the cuBLAS rows compute it
    /// from gate|up in gemm_x.
    GluAdd,
}

/// One projection: y[t] (= or +=) input(x[rows[t]]) · Wᵀ (+ bias). `rows` gathers x rows (0:
/// row t); `gemm_x` / `gemm_y` are where the cuBLAS rows of a layer projection read and write
/// (the same as x / y except for the MLP's GLU).
#[derive(Debug, Clone, Copy)]
struct Proj {
    input: Input,
    w: DevBuf,
    bias: DevBuf,
    x: u64,
    x_stride: i32,
    rows: u64,
    norm: DevBuf,
    k: usize,
    r: usize,
    y: u64,
    y_stride: i32,
    gemm_x: u64,
    gemm_x_stride: i32,
    gemm_y: u64,
    gemm_y_stride: i32,
    /// The tensor-core GLU epilogue writes its output rounded to 16 bits in `xb` instead of
    /// f32 in `y`, in the order down_proj's launch reads prepared inputs (Some(true): the
    /// wgmma GEMM's), so that launch needs no to_half (`prepared_order`) and reads only `xb`.
    half_out: Option<bool>,
    /// This projection's inputs were prepared in `xb` by the kernel before it, in this order.
    prepared: Option<bool>,
    /// The q|k|v projection of layer `.0` in a step whose prompt rows start at row `.1`: where
    /// it runs `wgt`, its epilogue rotates and appends those rows' heads
    /// (`KernelTuning::rope_epilogue`) and `mma` says so.
    rope: Option<(usize, usize)>,
}

/// A projection kernel's parameters in their C types: gemv.cu and mma.cu take the same list,
/// mma with the prepared inputs `xh` after `x_stride`.
struct ProjParams {
    w: u64,
    bias: u64,
    x: u64,
    x_stride: i32,
    rows: u64,
    norm: u64,
    eps: f32,
    k: i32,
    r: i32,
    t: i32,
    y: u64,
    y_stride: i32,
    /// mma.cu only: blocks per row tile (`MmaLaunch::token_tiles`).
    token_tiles: i32,
}

impl ProjParams {
    fn new(p: &Proj, t: usize, eps: f32) -> Self {
        ProjParams {
            w: p.w.ptr,
            bias: p.bias.ptr,
            x: p.x,
            x_stride: p.x_stride,
            rows: p.rows,
            norm: p.norm.ptr,
            eps,
            k: p.k as i32,
            r: p.r as i32,
            t: t as i32,
            y: p.y,
            y_stride: p.y_stride,
            token_tiles: 1,
        }
    }

    /// The kernel's argument list, with `xh` (and the token tiles) for mma.cu.
    fn args<'a>(&'a self, xh: Option<&'a u64>) -> Args<'a> {
        let a = Args::new()
            .arg(&self.w)
            .arg(&self.bias)
            .arg(&self.x)
            .arg(&self.x_stride);
        let a = match xh {
            Some(xh) => a.arg(xh),
            None => a,
        };
        let a = a
            .arg(&self.rows)
            .arg(&self.norm)
            .arg(&self.eps)
            .arg(&self.k)
            .arg(&self.r)
            .arg(&self.t)
            .arg(&self.y)
            .arg(&self.y_stride);
        if xh.is_some() {
            a.arg(&self.token_tiles)
        } else {
            a
        }
    }
}

/// Everything a decode graph bucket needs.
struct Bucket {
    seqs: usize,
    graph: Graph,
}

/// The CUDA backend.
pub struct CudaBackend {
    config: ModelConfig,
    limits: BackendLimits,
    dtype: DType,
    device_name: String,
    arch: u32,
    /// Multiprocessors (projection block shapes are chosen by it).
    sms: u32,
    layers: Vec<LayerBufs>,
    bufs: Bufs,
    k: Kernels,
    meta: MetaLayout,
    stages: Vec<Stage>,
    logits_stage: Pinned,
    next_stage: usize,
    in_flight: VecDeque<InFlight>,
    buckets: Vec<Bucket>,
    /// Host mirror of the device block tables, `[max_seqs, max_pages]`, and each row's length.
    tables: Vec<i32>,
    table_len: Vec<usize>,
    /// Scratch for a slot's prompt bitset.
    bits: Vec<u32>,
    weight_bytes: usize,
    kv_page_bytes: usize,
    arena_bytes: usize,
    stats: CudaStats,
    /// Prefill projections through cuBLAS (None: the decode kernels take them, or no
    /// libcublas).
    blas: Option<Blas>,
    /// The kernels of the decode projections.
    projections: Projections,
    /// Page-locked host memory for swapped-out KV pages (`swap`).
    swap: swap::SwapArea,
    /// Where the next step's share of the driver counters starts (`step_ledger`).
    mark: CounterMark,
    /// Device event times on the host clock (when a step finished).
    clock: DeviceClock,
    /// `NERVA_CUDA_SYNC=1`: wait for every step at launch (asynchronous errors surface at the
    /// step that caused them, as with `CUDA_LAUNCH_BLOCKING`), counted as debug syncs.
    sync_each_step: bool,
    /// Kernel variants in use (`CudaOptions::tuning`).
    tuning: KernelTuning,
    /// The KV pool's tensor map for attn_decode_serial (`tma::kv_pool_map`), and 1 where it
    /// exists (sm_90 and a pool whose tiles are whole page boxes), 0 for cp.async staging.
    kv_map: cudarc::driver::sys::CUtensorMap,
    kv_tma: i32,
    /// 1 where attn_decode_serial (8 warps, then the pair shape) keeps its splits' partials in
    /// its shared memory (room for them granted at load), 0 for global memory.
    serial_parts: [i32; 2],
    /// Whether `bufs.ssq` holds the chunk sums of squares of every row of x the step has: the
    /// last launch that wrote x was a one-tile residual add that also wrote them
    /// (`KernelTuning::norm_sums_from`), so the next norm prologue over x may read them instead of
    /// the rows. Host state of the launch sequence being enqueued (or captured).
    ssq_rows: bool,
    /// Last: dropped after every handle above that belongs to its context.
    gpu: Gpu,
}

impl std::fmt::Debug for CudaBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaBackend")
            .field("device", &self.device_name)
            .field("limits", &self.limits)
            .finish()
    }
}

/// `out` = rows of `a` and `b` (each `row` bytes, equally many, an even count) interleaved in
/// pairs: a0 a1 b0 b1 a2 a3 b2 b3 ...
fn interleave_pairs(a: &[u8], b: &[u8], row: usize, out: &mut Vec<u8>) {
    debug_assert_eq!(a.len(), b.len());
    out.clear();
    out.reserve(2 * a.len());
    for (pa, pb) in a.chunks(2 * row).zip(b.chunks(2 * row)) {
        out.extend_from_slice(pa);
        out.extend_from_slice(pb);
    }
}

fn unsupported(msg: String) -> BackendError {
    BackendError::Unsupported(msg)
}

fn f32_bytes(v: &[f32]) -> &[u8] {
    // SAFETY: f32 has no padding and every byte of it is initialized; the view covers exactly
    // the slice.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
}

fn i32_bytes(v: &[i32]) -> &[u8] {
    // SAFETY: as for f32.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
}

fn u32_bytes(v: &[u32]) -> &[u8] {
    // SAFETY: as for f32.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
}

fn put_u32(buf: &mut [u8], offset: usize, index: usize, v: u32) {
    let at = offset + index * 4;
    buf[at..at + 4].copy_from_slice(&v.to_ne_bytes());
}

/// Bytes of the arena, in carve order (a plan computed before allocating anything).
struct Plan {
    sizes: Vec<usize>,
}

impl Plan {
    fn total(&self) -> usize {
        self.sizes.iter().map(|s| s.next_multiple_of(256)).sum()
    }
}

impl CudaBackend {
    /// Build the backend on `cuda.device` for `config`/`weights`.
    pub fn new(
        config: &ModelConfig,
        weights: &ModelWeights,
        options: BackendOptions,
        cuda: CudaOptions,
    ) -> Result<Self, BackendError> {
        let c = config;
        let dtype = weights.embed_tokens.dtype();
        if !matches!(dtype, DType::BF16 | DType::F16) {
            return Err(unsupported(format!(
                "the CUDA backend runs BF16 and F16 checkpoints; this one is {dtype:?} \
                 (use --backend cpu)"
            )));
        }
        let (h, qd, kvd, inter, vocab) = (
            c.hidden_size,
            c.q_dim(),
            c.kv_dim(),
            c.intermediate_size,
            c.vocab_size,
        );
        let hd = c.head_dim;
        if c.num_key_value_heads == 0
            || !c.num_attention_heads.is_multiple_of(c.num_key_value_heads)
        {
            return Err(unsupported(format!(
                "{} heads over {} kv heads",
                c.num_attention_heads, c.num_key_value_heads
            )));
        }
        // The tensor-core attention takes the head dims 16 at a time.
        let dim_ok = hd.is_multiple_of(16) && (hd <= ATTN_GENERAL_DIM || hd == ATTN_MAX_DIM);
        if c.gqa_group() > ATTN_MAX_GROUP || !dim_ok {
            return Err(unsupported(format!(
                "the CUDA attention kernel takes head_dim a multiple of 16 up to \
                 {ATTN_GENERAL_DIM}, or {ATTN_MAX_DIM}, and up to {ATTN_MAX_GROUP} query heads \
                 per kv head; the model has head_dim {hd}, {} per kv head",
                c.gqa_group()
            )));
        }
        for (what, k) in [
            ("hidden_size", h),
            ("q_dim", qd),
            // (Also makes gate|up's row count divisible into the GLU's pairs.)
            ("intermediate_size", inter),
        ] {
            if !k.is_multiple_of(8) {
                return Err(unsupported(format!(
                    "{what} {k} is not a multiple of 8 (16-byte weight loads)"
                )));
            }
        }
        if options.max_seqs == 0 || options.max_step_tokens == 0 || options.page_tokens == 0 {
            return Err(BackendError::Limits(
                "max_seqs, max_step_tokens and page_tokens must be > 0".into(),
            ));
        }
        if options.max_seqs > 1024 {
            return Err(BackendError::Limits(
                "the CUDA backend runs at most 1024 sequences".into(),
            ));
        }
        if options.max_context == 0 || options.max_context > c.max_position_embeddings {
            return Err(BackendError::Limits(format!(
                "max context {} outside 1..={}",
                options.max_context, c.max_position_embeddings
            )));
        }
        let all_matrices = std::iter::once(&weights.embed_tokens)
            .chain(std::iter::once(&weights.lm_head))
            .chain(weights.layers.iter().flat_map(|l| {
                [
                    &l.self_attn.q_proj.weight,
                    &l.self_attn.k_proj.weight,
                    &l.self_attn.v_proj.weight,
                    &l.self_attn.o_proj.weight,
                    &l.mlp.gate_proj.weight,
                    &l.mlp.up_proj.weight,
                    &l.mlp.down_proj.weight,
                ]
            }));
        for t in all_matrices {
            if t.dtype() != dtype {
                return Err(unsupported(format!(
                    "mixed weight dtypes ({:?} and {dtype:?})",
                    t.dtype()
                )));
            }
        }
        if weights.layers.len() != c.num_hidden_layers {
            return Err(unsupported(format!(
                "{} layers in the weights, {} in the config",
                weights.layers.len(),
                c.num_hidden_layers
            )));
        }

        let (mut gpu, facts) = Gpu::open(cuda.device)?;
        if facts.capability.0 < 8 {
            return Err(BackendError::Device(format!(
                "{} is sm_{}{}; the CUDA backend needs sm_80 (Ampere) or newer",
                facts.name, facts.capability.0, facts.capability.1
            )));
        }
        let arch = (facts.capability.0 * 10 + facts.capability.1) as u32;
        // Whether only the tensor-core kernels read the projection weights: then there is no
        // cuBLAS (prompts too run on them) and the weights may be tiled (the GEMV and cuBLAS
        // read rows).
        let mma_only = cuda.projections == Projections::Tensor && !cuda.fast_prefill;
        let tiled = cuda.tuning.tiled_weights && mma_only;
        let mma_module = if tiled { "mma_tiled.cu" } else { "mma.cu" };
        let compiled = kernels::build(
            arch,
            &[
                "gemv.cu",
                "embedding.cu",
                "rope_kv.cu",
                "attention.cu",
                "sampling.cu",
                "bench.cu",
                "prefill.cu",
                mma_module,
            ],
        )?;
        gpu.set_programmatic(use_programmatic_launch(arch, driver::driver_version()?));
        let from_cache = compiled.iter().filter(|m| m.cached).count();
        tracing::info!(arch, modules = compiled.len(), from_cache, "kernels ready");

        // The arena plan: everything but the KV pool, then the KV pool from what is left.
        let wb = dtype.size();
        let s = options.max_seqs;
        let t = options.max_step_tokens;
        let max_pages = options.max_context.div_ceil(options.page_tokens);
        let z = ATTN_SPLITS as usize;
        // Chain-split GEMM launches stay within this many blocks (`gemm_plan`), one partial
        // tile of 128 rows × 128 tokens each. Every projection mode may launch the GEMM (mixed
        // runs the tensor cores past 2 tokens), so the workspace is always there.
        let gemm_split_blocks = GEMM_SPLIT_MAX_BLOCKS_PER_SM * facts.sms as usize;
        let tied = std::ptr::eq(
            weights.lm_head.bytes().as_ptr(),
            weights.embed_tokens.bytes().as_ptr(),
        );
        // A matrix of 16-bit weights as stored: tiled (padded) or row-major.
        let matrix = |rows: usize, cols: usize| {
            if tiled {
                weight_tiles::tiled_bytes(rows, cols)
            } else {
                rows * cols * wb
            }
        };
        let layer_sizes = |l: &crate::model::DecoderLayer| -> Vec<usize> {
            vec![
                matrix(qd + 2 * kvd, h),
                if l.self_attn.q_proj.bias.is_some() {
                    (qd + 2 * kvd) * 4
                } else {
                    0
                },
                matrix(h, qd),
                if l.self_attn.o_proj.bias.is_some() {
                    h * 4
                } else {
                    0
                },
                matrix(2 * inter, h),
                if l.mlp.gate_proj.bias.is_some() {
                    2 * inter * 4
                } else {
                    0
                },
                matrix(h, inter),
                if l.mlp.down_proj.bias.is_some() {
                    h * 4
                } else {
                    0
                },
                h * 4,
                h * 4,
                if l.self_attn.q_norm.is_some() {
                    hd * 4
                } else {
                    0
                },
                if l.self_attn.k_norm.is_some() {
                    hd * 4
                } else {
                    0
                },
            ]
        };
        let meta = MetaLayout::new(t, s);
        let mut fixed = Plan { sizes: Vec::new() };
        for l in &weights.layers {
            fixed.sizes.extend(layer_sizes(l));
        }
        let head_sizes = vec![
            matrix(vocab, h),                              // embed
            if tied { 0 } else { matrix(vocab, h) },       // lm_head
            h * 4,                                         // final norm
            options.max_context * (hd / 2) * 4,            // cos
            options.max_context * (hd / 2) * 4,            // sin
            t * h * 4,                                     // x
            t * (qd + 2 * kvd) * 4,                        // qkv
            t * qd * 4,                                    // q
            t * qd * 4,                                    // attn
            t * 2 * inter * 4,                             // gu
            t * inter * 4,                                 // act
            t * c.num_attention_heads * z * hd * 4,        // part_o
            t * c.num_attention_heads * z * 2 * 4,         // part_ml
            t * c.num_key_value_heads * 4,                 // attn_done
            gemm_split_blocks * 128 * MMA_GEMM_TOKENS * 4, // gemm_ws
            gemm_split_blocks * 4,                         // gemm_done
            t * h.max(qd).max(inter) * wb,                 // xa
            t * h.max(qd).max(inter) * wb,                 // xb
            t * h.div_ceil(8) * 8,                         // ssq: per x row, h / 8 f64
            blas::WORKSPACE_BYTES,                         // cuBLAS workspace
            s * vocab * 4,                                 // logits
            s * vocab * 4,                                 // sampling weights
            meta.bytes,                                    // meta
            s * max_pages * 4,                             // tables
            s * SLOT_PARAMS_BYTES,                         // params
            s * vocab * 4,                                 // counts
            s * vocab.div_ceil(32) * 4,                    // prompt bits
            s * 4,                                         // sampled
            s * RECORD_BYTES,                              // records
            256,                                           // sink
            s * PREP_CHUNKS * 16,                          // chunk statistics of sampled rows
        ];
        fixed.sizes.extend(head_sizes.iter().copied());
        let fixed_bytes = fixed.total();
        let budget = match cuda.memory {
            GpuMemory::Fraction(f) => (facts.free as f64 * f) as usize,
            GpuMemory::Bytes(b) => b,
        };
        let page_bytes = c.num_hidden_layers * 2 * options.page_tokens * kvd * wb;
        let gib = |b: usize| b as f64 / (1u64 << 30) as f64;
        if fixed_bytes + page_bytes > budget {
            return Err(BackendError::Device(format!(
                "the model needs {:.2} GiB of device memory (weights, activations, sampler) plus \
                 KV pages; --gpu-memory gives {:.2} GiB ({} free of {:.2} GiB on {}): {:.2} GiB \
                 missing",
                gib(fixed_bytes),
                gib(budget),
                format_args!("{:.2} GiB", gib(facts.free)),
                gib(facts.total),
                facts.name,
                gib(fixed_bytes + page_bytes - budget)
            )));
        }
        // No more pages than max_seqs full-context sequences can use.
        let num_pages = ((budget - fixed_bytes - 256) / page_bytes)
            .min(s * max_pages)
            .max(1);
        let kv_bytes = num_pages * page_bytes;
        let arena_bytes = fixed_bytes + kv_bytes.next_multiple_of(256) + 256;
        gpu.allocate_arena(arena_bytes)?;

        // Carve and upload, in plan order.
        let mut layers = Vec::with_capacity(c.num_hidden_layers);
        let mut weight_bytes = 0usize;
        let mut pair_rows = Vec::new();
        // Host staging of tiled matrices, reused (it grows to the largest: the LM head's).
        let mut staged = Vec::new();
        // A matrix of `cols` columns stacked from `parts` (whole rows each), as stored.
        let mut upload_matrix = |gpu: &mut Gpu, to: DevBuf, parts: &[&[u8]], cols: usize| {
            if tiled {
                weight_tiles::tile_rows(parts, cols, &mut staged);
                return gpu.upload(to.ptr, &staged);
            }
            let mut at = 0;
            for p in parts {
                gpu.upload(to.at(at), p)?;
                at += p.len();
            }
            Ok(())
        };
        for (i, l) in weights.layers.iter().enumerate() {
            let sz = layer_sizes(l);
            let mut carve = |n: usize| -> Result<DevBuf, BackendError> {
                if n == 0 {
                    Ok(DevBuf::NULL)
                } else {
                    gpu.carve(n)
                }
            };
            let lb = LayerBufs {
                qkv: carve(sz[0])?,
                qkv_bias: carve(sz[1])?,
                o: carve(sz[2])?,
                o_bias: carve(sz[3])?,
                gate_up: carve(sz[4])?,
                gate_up_bias: carve(sz[5])?,
                down: carve(sz[6])?,
                down_bias: carve(sz[7])?,
                in_norm: carve(sz[8])?,
                post_norm: carve(sz[9])?,
                q_norm: carve(sz[10])?,
                k_norm: carve(sz[11])?,
            };
            let a = &l.self_attn;
            let m = &l.mlp;
            let p = |name: &str| format!("model.layers.{i}.{name}");
            let shape = |name: String, t: &Tensor, want: &[usize]| -> Result<(), BackendError> {
                if t.shape() != want {
                    return Err(unsupported(format!(
                        "{name} has shape {:?}, expected {want:?}",
                        t.shape()
                    )));
                }
                Ok(())
            };
            shape(p("self_attn.q_proj.weight"), &a.q_proj.weight, &[qd, h])?;
            shape(p("self_attn.k_proj.weight"), &a.k_proj.weight, &[kvd, h])?;
            shape(p("self_attn.v_proj.weight"), &a.v_proj.weight, &[kvd, h])?;
            shape(p("self_attn.o_proj.weight"), &a.o_proj.weight, &[h, qd])?;
            shape(p("mlp.gate_proj.weight"), &m.gate_proj.weight, &[inter, h])?;
            shape(p("mlp.up_proj.weight"), &m.up_proj.weight, &[inter, h])?;
            shape(p("mlp.down_proj.weight"), &m.down_proj.weight, &[h, inter])?;
            let qkv = [&a.q_proj.weight, &a.k_proj.weight, &a.v_proj.weight].map(|t| t.bytes());
            upload_matrix(&mut gpu, lb.qkv, &qkv, h)?;
            if lb.qkv_bias.bytes > 0 {
                let mut bias = Vec::with_capacity(qd + 2 * kvd);
                for b in [&a.q_proj.bias, &a.k_proj.bias, &a.v_proj.bias] {
                    match b {
                        Some(b) => bias.extend(b.to_f32_vec()),
                        None => return Err(unsupported(p("q/k/v biases: some but not all"))),
                    }
                }
                gpu.upload(lb.qkv_bias.ptr, f32_bytes(&bias))?;
            }
            upload_matrix(&mut gpu, lb.o, &[a.o_proj.weight.bytes()], qd)?;
            if let Some(b) = &a.o_proj.bias {
                gpu.upload(lb.o_bias.ptr, f32_bytes(&b.to_f32_vec()))?;
            }
            // gate|up with rows interleaved in pairs (gate 2i, 2i+1, up 2i, 2i+1): one
            // projection block then holds both halves of two outputs (kernels/gemv.cu GLU).
            interleave_pairs(
                m.gate_proj.weight.bytes(),
                m.up_proj.weight.bytes(),
                h * wb,
                &mut pair_rows,
            );
            upload_matrix(&mut gpu, lb.gate_up, &[&pair_rows], h)?;
            if lb.gate_up_bias.bytes > 0 {
                let (Some(g), Some(u)) = (&m.gate_proj.bias, &m.up_proj.bias) else {
                    return Err(unsupported(p("gate/up biases: one but not both")));
                };
                let mut bias = Vec::new();
                interleave_pairs(
                    f32_bytes(&g.to_f32_vec()),
                    f32_bytes(&u.to_f32_vec()),
                    4,
                    &mut bias,
                );
                gpu.upload(lb.gate_up_bias.ptr, &bias)?;
            }
            upload_matrix(&mut gpu, lb.down, &[m.down_proj.weight.bytes()], inter)?;
            if let Some(b) = &m.down_proj.bias {
                gpu.upload(lb.down_bias.ptr, f32_bytes(&b.to_f32_vec()))?;
            }
            gpu.upload(lb.in_norm.ptr, f32_bytes(&l.input_layernorm.to_f32_vec()))?;
            gpu.upload(
                lb.post_norm.ptr,
                f32_bytes(&l.post_attention_layernorm.to_f32_vec()),
            )?;
            if let Some(n) = &a.q_norm {
                gpu.upload(lb.q_norm.ptr, f32_bytes(&n.to_f32_vec()))?;
            }
            if let Some(n) = &a.k_norm {
                gpu.upload(lb.k_norm.ptr, f32_bytes(&n.to_f32_vec()))?;
            }
            weight_bytes += ((qd + 2 * kvd) * h + h * qd + 2 * inter * h + h * inter) * wb;
            layers.push(lb);
            // Uploads of pageable memory are staged by the driver; keep the host from racing
            // far ahead of the copy engine on multi-GB checkpoints.
            if i % 8 == 7 {
                gpu.synchronize()?;
            }
        }
        let embed = gpu.carve(head_sizes[0])?;
        upload_matrix(&mut gpu, embed, &[weights.embed_tokens.bytes()], h)?;
        let lm_head = if tied {
            embed
        } else {
            let b = gpu.carve(head_sizes[1])?;
            upload_matrix(&mut gpu, b, &[weights.lm_head.bytes()], h)?;
            b
        };
        weight_bytes += vocab * h * wb;
        let final_norm = gpu.carve(head_sizes[2])?;
        gpu.upload(final_norm.ptr, f32_bytes(&weights.norm.to_f32_vec()))?;
        let rope = RopeTable::new(c, options.max_context);
        let (cos_t, sin_t) = rope.tables();
        let cos = gpu.carve(head_sizes[3])?;
        gpu.upload(cos.ptr, f32_bytes(cos_t))?;
        let sin = gpu.carve(head_sizes[4])?;
        gpu.upload(sin.ptr, f32_bytes(sin_t))?;
        let mut next = head_sizes[5..].iter();
        let mut carve_next = || gpu.carve(*next.next().expect("plan covers every buffer"));
        let x = carve_next()?;
        let qkv = carve_next()?;
        let q = carve_next()?;
        let attn = carve_next()?;
        let gu = carve_next()?;
        let act = carve_next()?;
        let part_o = carve_next()?;
        let part_ml = carve_next()?;
        let attn_done = carve_next()?;
        let gemm_ws = carve_next()?;
        let gemm_done = carve_next()?;
        let xa = carve_next()?;
        let xb = carve_next()?;
        let ssq = carve_next()?;
        let blas_ws = carve_next()?;
        let logits = carve_next()?;
        let weights_buf = carve_next()?;
        let meta_buf = carve_next()?;
        let tables = carve_next()?;
        let params = carve_next()?;
        let counts = carve_next()?;
        let prompt_bits = carve_next()?;
        let sampled = carve_next()?;
        let records = carve_next()?;
        let sink = carve_next()?;
        let chunk_stats = carve_next()?;
        let kv = gpu.carve(kv_bytes)?;
        let bufs = Bufs {
            embed,
            lm_head,
            final_norm,
            cos,
            sin,
            kv,
            x,
            qkv,
            q,
            attn,
            gu,
            act,
            part_o,
            part_ml,
            attn_done,
            gemm_ws,
            gemm_done,
            xa,
            xb,
            ssq,
            blas_ws,
            logits,
            weights: weights_buf,
            meta: meta_buf,
            tables,
            params,
            counts,
            prompt_bits,
            sampled,
            records,
            sink,
            chunk_stats,
        };
        // Activations start at zero: rows a padded graph bucket computes but never uses must
        // not hold NaN patterns that a debugger would trip over.
        for b in [
            x,
            qkv,
            q,
            attn,
            gu,
            act,
            xb,
            attn_done,
            gemm_done,
            tables,
            counts,
            prompt_bits,
            sampled,
            meta_buf,
            params,
        ] {
            gpu.zero(b.ptr, b.bytes)?;
        }

        let mut module_kernels = Vec::new();
        let dt = if dtype == DType::BF16 { "bf16" } else { "f16" };
        for m in &compiled {
            let names: Vec<String> = match m.name {
                "gemv.cu" => ["rms", "rms@r2", "plain_add", "plain_add@r2", "glu"]
                    .iter()
                    .flat_map(|mode| {
                        let (mode, rows) = mode.split_once('@').unwrap_or((mode, ""));
                        let suffix = if rows.is_empty() {
                            String::new()
                        } else {
                            format!("_{rows}")
                        };
                        [1, 2, 4, 8].map(move |t| format!("gemv_{mode}_{dt}_t{t}{suffix}"))
                    })
                    .collect(),
                "embedding.cu" => vec![if tiled {
                    format!("embed_tiled_{dt}")
                } else {
                    format!("embed_{dt}")
                }],
                "rope_kv.cu" => vec![format!("rope_append_{dt}")],
                "attention.cu" => {
                    // Head dimensions with a compiled-in size, else the general kernels.
                    let d = match c.head_dim {
                        64 | 128 | 256 => format!("_d{}", c.head_dim),
                        _ => String::new(),
                    };
                    let mut names = vec![
                        format!("attn_split_{dt}{d}"),
                        format!("attn_combine_{dt}{d}"),
                        format!("attn_decode_{dt}{d}"),
                        format!("attn_decode_serial_{dt}{d}"),
                        format!("attn_decode_cluster_{dt}{d}"),
                        format!("attn_decode_serial_pair_{dt}{d}"),
                    ];
                    let group = c.num_attention_heads / c.num_key_value_heads.max(1);
                    if matches!(c.head_dim, 64 | 128) && matches!(group, 1 | 2 | 4 | 8) {
                        names.push(format!("attn_prefill_{dt}_d{}_g{group}", c.head_dim));
                        names.push(format!("attn_prefill_fold_{dt}_d{}_g{group}", c.head_dim));
                        if c.head_dim == 128 {
                            names.push(format!("attn_prefill_wg_{dt}_d128_g{group}"));
                        }
                    }
                    names
                }
                "sampling.cu" => vec!["logits_prepare".into(), "sample_rows".into()],
                "bench.cu" => vec!["read_bandwidth".into()],
                "prefill.cu" => ["rms", "plain", "glu"]
                    .iter()
                    .map(|m| format!("to_half_{m}_{dt}"))
                    .chain(["add_bias".to_string()])
                    .collect(),
                "mma.cu" | "mma_tiled.cu" => ["rms", "plain_add", "glu"]
                    .iter()
                    .flat_map(|mode| MMA_VARIANTS.map(move |v| format!("mma_{mode}_{dt}_{v}")))
                    .chain([format!("mma_rope_{dt}_wgt")])
                    .collect(),
                other => return Err(BackendError::Device(format!("unexpected module {other}"))),
            };
            let refs: Vec<&str> = names.iter().map(String::as_str).collect();
            let loaded = gpu.load(&m.cubin, &refs)?;
            // One carveout for every kernel where asked (`KernelTuning::carveout`).
            if let Some(percent) = cuda.tuning.carveout {
                for &k in &loaded {
                    gpu.prefer_shared_memory(k, percent)?;
                }
            }
            module_kernels.push(loaded);
        }
        let g = &module_kernels[0];
        let mut k = Kernels {
            gemv_rms: [GemvFamily::new(&g[0..4], 4), GemvFamily::new(&g[4..8], 2)],
            gemv_plain_add: [
                GemvFamily::new(&g[8..12], 4),
                GemvFamily::new(&g[12..16], 2),
            ],
            gemv_glu: [GemvFamily::new(&g[16..20], 4)],
            embed: module_kernels[1][0],
            rope_append: module_kernels[2][0],
            attn_split: module_kernels[3][0],
            attn_combine: module_kernels[3][1],
            attn_decode: module_kernels[3][2],
            attn_decode_serial: module_kernels[3][3],
            attn_decode_cluster: module_kernels[3][4],
            attn_decode_serial_pair: module_kernels[3][5],
            attn_prefill: module_kernels[3].get(6).copied(),
            attn_prefill_fold: module_kernels[3].get(7).copied(),
            attn_prefill_wg: module_kernels[3].get(8).copied(),
            prepare: module_kernels[4][0],
            sample: module_kernels[4][1],
            read_bandwidth: module_kernels[5][0],
            to_half: [
                module_kernels[6][0],
                module_kernels[6][1],
                module_kernels[6][2],
            ],
            add_bias: module_kernels[6][3],
            qkv_rope: module_kernels[7][3 * MMA_VARIANTS.len()],
            mma: [0, 1, 2].map(|mode| {
                let n = MMA_VARIANTS.len();
                let m = &module_kernels[7][mode * n..(mode + 1) * n];
                MmaFamily {
                    gemm: m[MMA_GEMM],
                    gemm_narrow: m[MMA_GEMM_NARROW],
                    wg: m[MMA_WG],
                    wg_narrow: m[MMA_WG + 1],
                    wg_specialized: m[MMA_WGS],
                    wg_tma: m[MMA_WGT],
                    wg_tma_wide: m[MMA_WGT_WIDE],
                    wg_tma_mid: m[MMA_WGT_MID],
                    wg_stream: m[MMA_WG_STREAM],
                    n1: m[0],
                    n2: m[1],
                    n4: m[2],
                    n8m2: m[3],
                    n1_deep: m[MMA_DEEP],
                    n1_half: m[MMA_HALF],
                    split: [m[MMA_SPLIT], m[MMA_SPLIT + 1], m[MMA_SPLIT + 2]],
                    ring: [m[MMA_RING], m[MMA_RING + 1], m[MMA_RING + 2]],
                    persistent: [m[MMA_PERSIST], m[MMA_PERSIST + 1]],
                }
            }),
        };
        let mut tuning = cuda.tuning;
        tuning.tiled_weights = tiled;
        // Each family's pair of GEMM kernels (128- and 64-token tiles) granted its dynamic shared
        // memory, or the device's refusal.
        let grant = |k: &mut Kernels,
                     pair: fn(&mut MmaFamily) -> (&mut Kernel, &mut Kernel),
                     shared: fn(usize) -> u32|
         -> Result<(), BackendError> {
            for f in k.mma.iter_mut() {
                let (wide, narrow) = pair(f);
                *wide = gpu.with_dynamic_shared(*wide, shared(MMA_GEMM_TOKENS))?;
                *narrow = gpu.with_dynamic_shared(*narrow, shared(MMA_GEMM_NARROW_TOKENS))?;
            }
            Ok(())
        };
        // The same for one kernel per family, of `bytes`.
        let grant_one = |k: &mut Kernels,
                         one: fn(&mut MmaFamily) -> &mut Kernel,
                         bytes: u32|
         -> Result<(), BackendError> {
            for f in k.mma.iter_mut() {
                let kernel = one(f);
                *kernel = gpu.with_dynamic_shared(*kernel, bytes)?;
            }
            Ok(())
        };
        // The GEMM needs 160 KiB of shared memory per block (sm_80 and sm_90 have it; sm_86 and
        // sm_89 allow 99 KiB): where the device refuses, the register kernels take its launches.
        if tuning.gemm_from.is_some()
            && let Err(e) = grant(
                &mut k,
                |f| (&mut f.gemm, &mut f.gemm_narrow),
                mma_gemm_shared,
            )
        {
            tracing::warn!(
                arch,
                "the fixed-order GEMM needs {MMA_GEMM_SHARED} bytes of shared memory per block \
                 ({e}); the register kernels run its launches"
            );
            tuning.gemm_from = None;
        }
        // attn_prefill keeps its rows' queries and its KV stages in dynamic shared memory;
        // where the device refuses, attn_split takes its launches (the same partials).
        if let (Some(kp), Some(kf)) = (k.attn_prefill, k.attn_prefill_fold) {
            let hd = config.head_dim;
            match (
                gpu.with_dynamic_shared(kp, attn_prefill_shared(hd, false)),
                gpu.with_dynamic_shared(kf, attn_prefill_shared(hd, true)),
            ) {
                (Ok(kp), Ok(kf)) => {
                    k.attn_prefill = Some(kp);
                    k.attn_prefill_fold = Some(kf);
                }
                (Err(e), _) | (_, Err(e)) => {
                    tracing::warn!(arch, "attn_prefill cannot run ({e}); attn_split does");
                    k.attn_prefill = None;
                    k.attn_prefill_fold = None;
                }
            }
        }
        // attn_prefill_wg: sm_90a code (compute capability 9.0 only), beside the fold it
        // replaces; where the device refuses its shared memory, the fold runs its launches.
        tuning.prefill_wgmma &= arch == 90 && k.attn_prefill_fold.is_some();
        k.attn_prefill_wg = match k.attn_prefill_wg.filter(|_| tuning.prefill_wgmma) {
            Some(kw) => match gpu.with_dynamic_shared(kw, attn_prefill_wg_shared()) {
                Ok(kw) => Some(kw),
                Err(e) => {
                    tracing::warn!(
                        arch,
                        "attn_prefill_wg cannot run ({e}); attn_prefill_fold does"
                    );
                    None
                }
            },
            None => None,
        };
        tuning.prefill_wgmma = k.attn_prefill_wg.is_some();
        // attn_decode_serial streams each warp's tiles through one tile of dynamic shared
        // memory; where the device refuses, the split blocks (attn_decode) run its launches, and
        // where it refuses the pair shape, the 8-warp blocks run those (the same bits). Each
        // shape also keeps its splits' partials there where that still fits as many blocks per
        // SM as the shape is for (one of 8 warps, two of 4), else in global memory (the same
        // values either way).
        let group = config.num_attention_heads / config.num_key_value_heads.max(1);
        let parts = attn_serial_parts(group, config.head_dim);
        let serial_shared = |k: Kernel, threads: u32, per_sm: i32| -> Result<_, BackendError> {
            let tiles = attn_serial_shared(config.head_dim, threads);
            if tuning.serial_parts_shared
                && let Ok(kp) = gpu.with_dynamic_shared(k, tiles + parts)
                && gpu.blocks_per_sm(kp, threads)? >= per_sm
            {
                return Ok((kp, 1));
            }
            Ok((gpu.with_dynamic_shared(k, tiles)?, 0))
        };
        let mut serial_parts = [0; 2];
        if tuning.serial_attention_from.is_some() {
            match serial_shared(k.attn_decode_serial, ATTN_THREADS, 1) {
                Ok((ks, p)) => (k.attn_decode_serial, serial_parts[0]) = (ks, p),
                Err(e) => {
                    tracing::warn!(
                        arch,
                        "attn_decode_serial cannot run ({e}); attn_decode does"
                    );
                    tuning.serial_attention_from = None;
                }
            }
        }
        if tuning.serial_attention_from.is_some() && tuning.serial_pairs_per_sm.is_some() {
            match serial_shared(k.attn_decode_serial_pair, ATTN_SERIAL_PAIR_THREADS, 2) {
                Ok((ks, p)) => (k.attn_decode_serial_pair, serial_parts[1]) = (ks, p),
                Err(e) => {
                    tracing::warn!(
                        arch,
                        "attn_decode_serial_pair cannot run ({e}); attn_decode_serial does"
                    );
                    tuning.serial_pairs_per_sm = None;
                }
            }
        }
        // The weight ring of the one-n-tile projections: their shared memory, and a carveout
        // that fits three blocks per SM (two of n1d, as their registers allow) and leaves the
        // rest to L1; where refused, the register form (the same bits).
        if tuning.weight_ring != RingUse::Off || tuning.weight_ring_deep != RingUse::Off {
            let mut ringed = k;
            let granted = ringed.mma.iter_mut().try_for_each(|f| {
                for (form, kernel) in f.ring.iter_mut().enumerate() {
                    *kernel = ring_form(&gpu, *kernel, form, arch, tuning.carveout)?;
                }
                Ok::<(), BackendError>(())
            });
            match granted {
                Ok(()) => k = ringed,
                Err(e) => {
                    tracing::warn!(arch, "the projections' weight ring cannot run ({e})");
                    tuning.weight_ring = RingUse::Off;
                    tuning.weight_ring_deep = RingUse::Off;
                }
            }
        }
        // The wgmma GEMM: compute capability 9.0 only (its kernels are sm_90a code) and 225 KiB
        // of shared memory per block; where either fails the mma.sync GEMM runs its launches.
        tuning.wgmma &= arch == 90 && tuning.gemm_from.is_some();
        if tuning.wgmma
            && let Err(e) = grant(&mut k, |f| (&mut f.wg, &mut f.wg_narrow), wg_gemm_shared)
        {
            tracing::warn!(
                arch,
                "the wgmma GEMM cannot run ({e}); the mma.sync GEMM does"
            );
            tuning.wgmma = false;
        }
        // Its warp-specialized 128-token tiles need the same shared memory; where refused, `wg`
        // runs them (the same bits).
        let wg_bytes = wg_gemm_shared(MMA_GEMM_TOKENS);
        tuning.wg_specialized &= tuning.wgmma;
        if tuning.wg_specialized
            && let Err(e) = grant_one(&mut k, |f| &mut f.wg_specialized, wg_bytes)
        {
            tracing::warn!(arch, "the warp-specialized wgmma GEMM cannot run ({e})");
            tuning.wg_specialized = false;
        }
        // Its stages by tensor copies read the tiled layout only.
        tuning.wg_tma &= tuning.wgmma && tuning.tiled_weights;
        if tuning.wg_tma
            && let Err(e) = grant_one(&mut k, |f| &mut f.wg_tma, wg_bytes)
        {
            tracing::warn!(arch, "the wgmma GEMM with tensor copies cannot run ({e})");
            tuning.wg_tma = false;
        }
        // Its wider tiles: their own shared memory; where either is refused, the 128-token
        // tiles run every launch.
        if !tuning.wg_tma {
            tuning.wg_wide_from = None;
        }
        let mid: fn(&mut MmaFamily) -> &mut Kernel = |f| &mut f.wg_tma_mid;
        let wide: fn(&mut MmaFamily) -> &mut Kernel = |f| &mut f.wg_tma_wide;
        let wide_kernels = [
            (
                MMA_GEMM_MID_TOKENS,
                tuning.wg_wide_tiles != WideTiles::Wide,
                mid,
            ),
            (
                MMA_GEMM_WIDE_TOKENS,
                tuning.wg_wide_tiles != WideTiles::Mid,
                wide,
            ),
        ];
        for (tokens, used, kernel) in wide_kernels {
            if used
                && tuning.wg_wide_from.is_some()
                && let Err(e) = grant_one(&mut k, kernel, wg_gemm_shared(tokens))
            {
                tracing::warn!(
                    arch,
                    "the wgmma GEMM's {tokens}-token tiles cannot run ({e})"
                );
                tuning.wg_wide_from = None;
            }
        }
        // Its rope epilogue: the same shared memory; where refused, rope_append runs.
        tuning.rope_epilogue &= tuning.wg_tma && matches!(config.head_dim, 64 | 128);
        if tuning.rope_epilogue {
            match gpu.with_dynamic_shared(k.qkv_rope, wg_bytes) {
                Ok(kernel) => k.qkv_rope = kernel,
                Err(e) => {
                    tracing::warn!(arch, "the q|k|v GEMM's rope epilogue cannot run ({e})");
                    tuning.rope_epilogue = false;
                }
            }
        }
        // The persistent 64-token tiles: the same bits as wg64, which runs them where refused.
        if !tuning.wgmma {
            tuning.wg_stream = WgStream::Off;
        }
        if tuning.wg_stream != WgStream::Off
            && let Err(e) = grant_one(&mut k, |f| &mut f.wg_stream, WG_STREAM_SHARED)
        {
            tracing::warn!(arch, "the persistent wgmma GEMM cannot run ({e})");
            tuning.wg_stream = WgStream::Off;
        }
        if tuning.cluster_attention {
            let fits = if arch >= 90 {
                gpu.allow_large_clusters(k.attn_decode_cluster)?;
                let cluster = (1, 1, ATTN_SPLITS);
                gpu.max_active_clusters(k.attn_decode_cluster, ATTN_THREADS, cluster)? > 0
            } else {
                false
            };
            if !fits {
                tracing::warn!(
                    arch,
                    "cluster attention needs sm_90+ and room for {ATTN_SPLITS}-block clusters; \
                     the default attention kernel runs"
                );
                tuning.cluster_attention = false;
            }
        }
        let blas = if mma_only {
            None
        } else if !Blas::present() {
            tracing::warn!(
                projections = ?cuda.projections,
                "libcublas not found: the projections cuBLAS would take (prompt rows, and under \
                 --projections blas every step of {BLAS_MIN_TOKENS} tokens or more) run on the \
                 decode projections' kernels instead (slower); add the CUDA toolkit's lib64 to \
                 the loader path for cuBLAS"
            );
            None
        } else {
            Some(Blas::new(&gpu, bufs.blas_ws, dtype)?)
        };

        let mut stages = Vec::with_capacity(RING);
        for _ in 0..RING {
            stages.push(Stage {
                meta: gpu.pinned(meta.bytes)?,
                records: gpu.pinned(s * RECORD_BYTES)?,
                done: gpu.event(false)?,
                start: gpu.event(true)?,
                end: gpu.event(true)?,
            });
        }
        let logits_stage = gpu.pinned(s * vocab * 4)?;
        let swap = swap::SwapArea::new(&mut gpu, options.swap.pages(page_bytes)?, page_bytes)?;
        gpu.synchronize()?;
        let clock = DeviceClock::new(&mut gpu)?;

        // attn_decode_serial's tensor copies see the pool through this map (sm_90 only).
        let kv_map = if arch >= 90 {
            tma::kv_pool_map(
                bufs.kv.ptr,
                num_pages,
                c.num_hidden_layers,
                options.page_tokens,
                c.kv_dim(),
                c.head_dim,
            )?
        } else {
            None
        };
        let limits = BackendLimits {
            max_seqs: s,
            max_step_tokens: t,
            page_tokens: options.page_tokens,
            num_pages,
            max_context: options.max_context,
            swap_pages: swap.pages(),
        };
        let mut backend = CudaBackend {
            config: c.clone(),
            limits,
            dtype,
            device_name: format!(
                "{} (sm_{}{}, {} SMs, {:.1} GiB)",
                facts.name,
                facts.capability.0,
                facts.capability.1,
                facts.sms,
                gib(facts.total)
            ),
            arch,
            sms: facts.sms as u32,
            layers,
            bufs,
            k,
            meta,
            stages,
            logits_stage,
            next_stage: 0,
            in_flight: VecDeque::with_capacity(RING),
            buckets: Vec::new(),
            tables: vec![0; s * max_pages],
            table_len: vec![0; s],
            bits: vec![0; vocab.div_ceil(32)],
            weight_bytes,
            kv_page_bytes: page_bytes,
            arena_bytes,
            stats: CudaStats::default(),
            blas,
            projections: cuda.projections,
            swap,
            mark: CounterMark::new(DriverCounters::default()),
            clock,
            sync_each_step: std::env::var_os("NERVA_CUDA_SYNC").is_some_and(|v| v == "1"),
            tuning,
            kv_tma: i32::from(kv_map.is_some()),
            serial_parts,
            kv_map: kv_map.unwrap_or(cudarc::driver::sys::CUtensorMap { opaque: [0; 16] }),
            ssq_rows: false,
            gpu,
        };
        backend.capture_buckets()?;
        // Start-up work (weights, capture) belongs to no step.
        backend.mark = CounterMark::new(backend.gpu.counters);
        tracing::info!(
            device = %backend.device_name,
            arena_gib = gib(arena_bytes),
            weight_gib = gib(weight_bytes),
            kv_pages = num_pages,
            graphs = backend.buckets.len(),
            "CUDA backend ready"
        );
        Ok(backend)
    }

    /// Bytes of weights one decode step reads (every layer matrix plus the LM head).
    pub fn weight_bytes_per_token(&self) -> usize {
        self.weight_bytes
    }

    /// Bytes of one KV page (all layers, k and v).
    pub fn kv_page_bytes(&self) -> usize {
        self.kv_page_bytes
    }

    /// Bytes of the device arena.
    pub fn arena_bytes(&self) -> usize {
        self.arena_bytes
    }

    /// The kernel variants in use (`CudaOptions::tuning`, less what the device or the
    /// projection mode ruled out).
    pub fn tuning(&self) -> KernelTuning {
        self.tuning
    }

    /// The device's compute capability as a number (e.g. 90 for sm_90).
    pub fn arch(&self) -> u32 {
        self.arch
    }

    /// Cumulative statistics.
    pub fn stats(&self) -> CudaStats {
        let mut s = self.stats;
        s.driver = self.gpu.counters;
        s
    }

    /// Kernel nodes of the decode graph for `seqs` sequences, if one was captured.
    pub fn graph_nodes(&self, seqs: usize) -> Option<usize> {
        self.buckets
            .iter()
            .find(|b| b.seqs >= seqs)
            .map(|b| b.graph.nodes)
    }

    /// Measure the device's streaming read bandwidth over the first `bytes` of the device arena
    /// (the kernel only reads, so what the arena holds does not matter). Returns bytes per
    /// second (median of `reps`). Over the arena rather than the KV pool: a pool sized for a few
    /// short sequences is a few hundred MB, over which a pass measured ~10% below the card's
    /// streaming rate (H200: 4.16 against 4.65 TB/s over 8 GiB, thirty-fifth session).
    pub fn measure_read_bandwidth(
        &mut self,
        bytes: usize,
        reps: usize,
    ) -> Result<f64, BackendError> {
        self.gpu.bind()?;
        let arena = self.gpu.arena();
        let bytes = bytes.min(arena.bytes) / 16 * 16;
        let n = (bytes / 16) as u64;
        let start = self.gpu.event(true)?;
        let end = self.gpu.event(true)?;
        let mut times = Vec::with_capacity(reps);
        let src = arena.ptr;
        let sink = self.bufs.sink.ptr;
        for rep in 0..reps + 1 {
            self.gpu.record(&start)?;
            // SAFETY: read_bandwidth(const uint4*, size_t, unsigned*): n uint4 lie inside the
            // arena (only read), sink is 256 bytes.
            unsafe {
                self.gpu.launch(
                    self.k.read_bandwidth,
                    (1024 * 8, 1, 1),
                    512,
                    Args::new().arg(&src).arg(&n).arg(&sink),
                )
            }?;
            self.gpu.record(&end)?;
            self.gpu.wait(&end, true)?;
            if rep > 0 {
                times.push(self.gpu.elapsed_ms(&start, &end)? as f64);
            }
        }
        times.sort_by(f64::total_cmp);
        let ms = times[times.len() / 2];
        Ok(bytes as f64 / (ms / 1e3))
    }

    fn geometry(&self, layer: usize) -> KvGeometryArg {
        KvGeometryArg {
            layers: self.config.num_hidden_layers as i32,
            layer: layer as i32,
            page_tokens: self.limits.page_tokens as i32,
            kv_dim: self.config.kv_dim() as i32,
            max_pages: self.limits.max_pages_per_seq() as i32,
        }
    }

    fn meta_arg(&self) -> StepMetaArg {
        let b = self.bufs.meta;
        let m = self.meta;
        StepMetaArg {
            token: b.at(m.token),
            position: b.at(m.position),
            token_seq: b.at(m.token_seq),
            seq_slot: b.at(m.seq_slot),
            counts: b.at(m.counts),
            lrow_token: b.at(m.lrow_token),
            lrow_seq: b.at(m.lrow_seq),
            lrow_sample: b.at(m.lrow_sample),
            token_slot: b.at(m.token_slot),
        }
    }

    /// The step's metadata as seen from token row `off` on (0: `meta_arg`), for kernels that
    /// serve only a mixed step's prompt rows: the per-token arrays start at row `off`, and the
    /// token count is that of the rows past it (`chunk_counts`). Per-sequence and logit-row
    /// arrays stay whole (the attention kernels index sequences only through `token_slot`).
    fn meta_from(&self, off: usize) -> StepMetaArg {
        if off == 0 {
            return self.meta_arg();
        }
        let b = self.bufs.meta;
        let m = self.meta;
        let row = |at: usize| b.at(at + off * 4);
        StepMetaArg {
            token: row(m.token),
            position: row(m.position),
            token_seq: row(m.token_seq),
            counts: b.at(m.chunk_counts),
            token_slot: row(m.token_slot),
            ..self.meta_arg()
        }
    }

    /// Projection `p` of `t` tokens through the configured decode-projection kernels; whether
    /// its epilogue did `Proj::rope`'s work.
    fn token_proj(&mut self, p: &Proj, t: usize) -> Result<bool, BackendError> {
        let ks = self.k;
        let tensor = match self.projections {
            Projections::Tensor | Projections::Blas => true,
            Projections::Gemv => false,
            Projections::Mixed => t > GEMV_MAX_TOKENS,
        };
        if tensor {
            // down_proj reads the GLU's output: a plain input here.
            let (family, prep) = match p.input {
                Input::Rms => (ks.mma[0], ks.to_half[0]),
                Input::PlainAdd | Input::GluAdd => (ks.mma[1], ks.to_half[1]),
                Input::RmsGlu => (ks.mma[2], ks.to_half[0]),
            };
            self.mma(&family, prep, p, t)
        } else {
            let families: &[GemvFamily] = match p.input {
                Input::Rms => &ks.gemv_rms,
                Input::PlainAdd | Input::GluAdd => &ks.gemv_plain_add,
                Input::RmsGlu => &ks.gemv_glu,
            };
            self.gemv(families, p, t).map(|()| false)
        }
    }

    /// Rows t0..t0+m of x (or the rows `rows` gathers from there) prepared for a 16-bit
    /// projection by a to_half kernel (normalized, activated or as they are, then rounded) into
    /// `xa`, which it returns.
    #[allow(clippy::too_many_arguments)]
    fn prepare_half(
        &mut self,
        kernel: Kernel,
        x: u64,
        x_stride: i32,
        t0: usize,
        rows: u64,
        norm: DevBuf,
        k: usize,
        m: usize,
        wg_order: bool,
    ) -> Result<u64, BackendError> {
        let (t0, k, xa) = (t0 as i32, k as i32, self.bufs.xa.ptr);
        let wg_order = wg_order as i32;
        let eps = self.config.rms_norm_eps as f32;
        let grid = to_half_grid(m, k as usize, self.sms as usize);
        // SAFETY: to_half_*(const float* x, int x_stride, int t0, const int* rows,
        // const float* norm, float eps, int K, int wg_order, W* out): rows t0..t0+m of x (or of
        // `rows`) exist (m ≤ max_step_tokens), out (xa) holds max_step_tokens × max(K) 16-bit
        // values, norm is K floats or unused; with wg_order K is a multiple of 64; any grid.y
        // slices a row into whole chunks.
        unsafe {
            self.gpu.launch(
                kernel,
                grid,
                128,
                Args::new()
                    .arg(&x)
                    .arg(&x_stride)
                    .arg(&t0)
                    .arg(&rows)
                    .arg(&norm.ptr)
                    .arg(&eps)
                    .arg(&k)
                    .arg(&wg_order)
                    .arg(&xa),
            )
        }?;
        Ok(xa)
    }

    /// The tensor-core projection (mma.cuh) of `t` tokens, shaped by `mma_launch`. Past one
    /// n-tile (or from `KernelTuning::prepared_from` tokens) the inputs are prepared once by
    /// to_half into `xa` (normalized, gathered, rounded) instead of by every block. Returns
    /// whether the launch's epilogue did `Proj::rope`'s work (`rope_epilogue`).
    fn mma(
        &mut self,
        family: &MmaFamily,
        prep: Kernel,
        p: &Proj,
        t: usize,
    ) -> Result<bool, BackendError> {
        let shape = mma_launch(t, p.r, p.k, self.sms as usize, &self.tuning);
        let gemm = gemm_tile_tokens(shape.variant).is_some();
        let wg = self.wgmma_inputs(&shape, p.k);
        let tiles = (p.r as u32).div_ceil(shape.rows) * shape.token_tiles;
        let stream_blocks = if wg && shape.variant == MMA_GEMM_NARROW {
            let (t, s) = (tiles as usize, shape.splits as usize);
            wg_stream_launch(t, s, self.sms as usize, &self.tuning)
        } else {
            None
        };
        let variant = match shape.variant {
            v @ (0 | MMA_DEEP | MMA_HALF) => {
                one_tile_form(v, tiles as usize, self.sms as usize, &self.tuning)
            }
            MMA_GEMM_NARROW if stream_blocks.is_some() => MMA_WG_STREAM,
            v => gemm_form(v, wg, &self.tuning),
        };
        let xh = match (shape.prepared, p.prepared) {
            (true, Some(order)) if order == wg => self.bufs.xb.ptr,
            (true, _) => self.prepare_half(prep, p.x, p.x_stride, 0, p.rows, p.norm, p.k, t, wg)?,
            (false, _) => 0u64,
        };
        // The GLU epilogue's 16-bit copy for the next projection (`Proj::half_out`).
        let (yh, yh_wg) = match p.half_out {
            Some(order) if p.input == Input::RmsGlu => (self.bufs.xb.ptr, order as i32),
            _ => (0u64, 0i32),
        };
        let mut a = ProjParams::new(p, t, self.config.rms_norm_eps as f32);
        a.token_tiles = shape.token_tiles as i32;
        let split_plan = shape.split_plan();
        let units = shape.units(tiles);
        let blocks = match variant {
            MMA_WGT | MMA_WGS | MMA_WGT_WIDE | MMA_WGT_MID => {
                wgs_blocks(units as usize, self.sms as usize, &self.tuning)
            }
            MMA_PERSIST.. => persistent_blocks(units as usize, self.sms as usize, &self.tuning),
            _ => stream_blocks.unwrap_or(units),
        };
        let maps = GemmMaps::for_variant(variant, p.w.ptr, p.r, p.k, xh, t)?;
        let ssq = self.norm_sums(p, t, gemm, shape.prepared);
        let args = a.args(Some(&xh)).arg(&yh).arg(&yh_wg);
        let args = if gemm {
            args.arg(&self.bufs.gemm_ws.ptr)
                .arg(&self.bufs.gemm_done.ptr)
                .arg(&split_plan)
        } else {
            args.arg(&ssq)
        };
        let args = GemmMaps::append(maps.as_ref(), args);
        let rope = p
            .rope
            .filter(|_| variant == MMA_WGT && self.tuning.rope_epilogue)
            .map(|(layer, from)| self.rope_epilogue(layer, from));
        let (kernel, args) = match &rope {
            Some(r) => (self.k.qkv_rope, args.arg(r)),
            None => (family.kernel(variant), args),
        };
        // SAFETY: mma_*(const W* w, const float* bias, const float* x, int x_stride,
        // const W* xh, const int* x_rows, const float* norm_w, float eps, int K, int R, int T,
        // float* y, int y_stride, int token_tiles, W* yh, int yh_wg), the one-tile forms' with
        // (double* ssq) after, the GEMM's with (float* ws, int* counters, int split_plan)
        // after: ssq is null or `bufs.ssq` (`norm_sums`: a residual add into x writes the chunk
        // sums of its T rows, a norm prologue over x reads those of its rows, written by the
        // last launch that wrote x), which holds max_step_tokens rows of hidden / 8 f64; yh is
        // null or xb, which holds max_step_tokens × max(K) 16-bit values (a GLU writes T rows
        // of R / 2) and which no other kernel of the launch reads; w holds R×K weights (row-major, or tiled and padded as
        // mma_tiled.cu reads them), x and y hold T rows of their strides, xh (when used) the T
        // prepared rows (for wg: in the wgmma order, K a multiple of 64), bias/norm are null
        // or R/K floats; the grid is the launch's units (`MmaLaunch::units`: the row tiles
        // times the token tiles, the split ones times the splits); its split tiles take at most
        // gemm_split_blocks blocks (`gemm_plan`), within ws and counters, whose slots it indexes
        // from its first split tile, and its counters are zero between launches; the warp-specialized GEMM runs
        // with the MMA_WGS_THREADS threads it is built for, its TMA forms (tiled weights only:
        // `wg_tma`) with the maps of those same w and xh, in any number of blocks (each walks the
        // units b, b + blocks, ... of the tiles × splits; none waits for another); the
        // persistent one (`wg64s`) in `wg_stream_blocks` blocks, at most one per SM, so its
        // shared tiles (fewer than its blocks) stay within ws and counters; the persistent
        // one-n-tile forms (n1p, n1hp) in any number of blocks (each walks the row tiles b,
        // b + blocks, ... and writes only their rows). mma_rope_*_wgt
        // (wgt's list, then RopeEpilogue by value) takes the q|k|v projection of its step: the
        // rows' positions index the rope tables and their block tables cover them (validated
        // for rope_append, which it stands in for), q_out holds max_step_tokens × q_dim floats.
        unsafe {
            self.gpu
                .launch(kernel, (blocks, 1, 1), mma_threads(variant), args)
        }?;
        Ok(rope.is_some())
    }

    /// The `ssq` argument of a one-tile projection launch (`gemm`: none, the GEMM kernels take
    /// none) of `p`, over inputs `prepared` or not, and `ssq_rows` after it: a residual add into
    /// x writes every chunk sum of its rows where `KernelTuning::norm_sums_from` asks for them
    /// (whole chunks: hidden a multiple of 8) and the norm prologues of as many tokens read
    /// their own rows (`prepared_inputs`: at more tokens to_half normalizes them, and the sums
    /// would be written for nothing); a norm prologue over x reads them where the last launch
    /// that wrote x left them (`ssq_rows`). Null otherwise: the prologue reads the rows. The same
    /// inv either way (norm.cuh's rows_rms_inv_ssq).
    fn norm_sums(&mut self, p: &Proj, t: usize, gemm: bool, prepared: bool) -> u64 {
        let h = self.config.hidden_size;
        let x = self.bufs.x.ptr;
        let asked = self.tuning.norm_sums_from.is_some_and(|from| h >= from)
            && h.is_multiple_of(8)
            && !gemm;
        match p.input {
            Input::PlainAdd | Input::GluAdd if p.y == x => {
                self.ssq_rows =
                    asked && p.y_stride as usize == h && !prepared_inputs(t, &self.tuning);
                if self.ssq_rows { self.bufs.ssq.ptr } else { 0 }
            }
            Input::Rms | Input::RmsGlu
                if p.x == x && p.x_stride as usize == h && asked && !prepared && self.ssq_rows =>
            {
                self.bufs.ssq.ptr
            }
            _ => 0,
        }
    }

    /// The step's first row of prompt attention (`enqueue_attention`): past the decode rows
    /// where those run the decode attention, else 0.
    fn prompt_rows_from(&self, singles: usize) -> usize {
        if singles > 0 && self.tuning.mixed_decode_attention {
            singles
        } else {
            0
        }
    }

    /// The rope epilogue's step for layer `li`'s q|k|v projection, prompt rows from `from`:
    /// what rope_append would take.
    fn rope_epilogue(&self, li: usize, from: usize) -> RopeEpilogueArg {
        let a = self.attn_scalars();
        let b = self.bufs;
        let l = self.layers[li];
        RopeEpilogueArg {
            meta: self.meta_arg(),
            q_out: b.q.ptr,
            kv: b.kv.ptr,
            tables: b.tables.ptr,
            geo: self.geometry(li),
            heads: a.heads,
            kv_heads: a.kv_heads,
            head_dim: a.head_dim,
            from: from as i32,
            q_norm: l.q_norm.ptr,
            k_norm: l.k_norm.ptr,
            eps: a.eps,
            cos: b.cos.ptr,
            sin: b.sin.ptr,
        }
    }

    /// Whether `mma` runs a projection of `t` tokens (`r` × `k`) on inputs prepared in 16 bits,
    /// and in which order (true: the wgmma GEMM's): what a kernel before it may write in their
    /// place (`Proj::half_out`). None where another path may take the launch (the GEMV, cuBLAS
    /// rows) or the inputs are not prepared.
    fn prepared_order(&self, t: usize, r: usize, k: usize) -> Option<bool> {
        if self.projections != Projections::Tensor || self.blas.is_some() {
            return None;
        }
        let shape = mma_launch(t, r, k, self.sms as usize, &self.tuning);
        shape.prepared.then(|| self.wgmma_inputs(&shape, k))
    }

    /// Whether a launch of `shape` over `k` columns runs the GEMM on wgmma (where it can run:
    /// K a multiple of 64; the same tiles and bits), which reads its inputs in its own order.
    /// (`wgt192` and `wgt144`, which `mma_launch` picks only where they run, always do.)
    fn wgmma_inputs(&self, shape: &MmaLaunch, k: usize) -> bool {
        matches!(shape.variant, MMA_WGT_WIDE | MMA_WGT_MID)
            || matches!(shape.variant, MMA_GEMM | MMA_GEMM_NARROW)
                && self.tuning.wgmma
                && k.is_multiple_of(64)
    }

    /// The CUDA-core projection (gemv.cu) of `t` tokens.
    fn gemv(&mut self, families: &[GemvFamily], p: &Proj, t: usize) -> Result<(), BackendError> {
        let few_rows = p.r.div_ceil(4) <= FEW_ROWS_PER_SM * self.sms as usize;
        let family = families
            .iter()
            .find(|f| f.rows == 2 && few_rows)
            .unwrap_or(&families[0]);
        let kernel = family.tiles[match t {
            1 => 0,
            2 => 1,
            3 | 4 => 2,
            _ => 3,
        }];
        let a = ProjParams::new(p, t, self.config.rms_norm_eps as f32);
        // SAFETY: gemv_*(const W* w, const float* bias, const float* x, int x_stride,
        // const int* x_rows, const float* norm_w, float eps, int K, int R, int T, float* y,
        // int y_stride): w holds R×K weights, x and y hold T rows of their strides (buffers sized
        // for max_step_tokens / max_seqs rows), bias/norm are null or K/R floats.
        unsafe {
            self.gpu.launch(
                kernel,
                ((p.r as u32).div_ceil(family.rows), 1, 1),
                128,
                a.args(None),
            )
        }
    }

    /// A layer projection over the step's `t` tokens, of which the first `singles` are decode
    /// tokens: the prefill rows after them, when there are at least GEMM_MIN_TOKENS, through
    /// cuBLAS (input prepared and rounded to 16 bits by to_half); the rest through the
    /// configured decode kernels (`token_proj`). Under `Projections::Blas`, a launch of at least
    /// BLAS_MIN_TOKENS rows goes through cuBLAS whole, decode rows included.
    /// Returns whether the projection's epilogue did `Proj::rope`'s work.
    fn project(&mut self, p: Proj, t: usize, singles: usize) -> Result<bool, BackendError> {
        let split = if self.blas.is_none() {
            t
        } else if self.projections == Projections::Blas && t >= BLAS_MIN_TOKENS {
            0
        } else if t - singles >= GEMM_MIN_TOKENS {
            singles
        } else {
            t
        };
        let half = match p.input {
            Input::Rms | Input::RmsGlu => self.k.to_half[0],
            Input::PlainAdd => self.k.to_half[1],
            Input::GluAdd => self.k.to_half[2],
        };
        // The epilogue's rope only where one launch takes every row: cuBLAS rows are stored as
        // they are, and rope_append then reads back every prompt row.
        let rope = p.rope.filter(|_| split == t);
        if matches!(p.input, Input::PlainAdd | Input::GluAdd) && p.gemm_y == self.bufs.x.ptr {
            // Only a one-tile add over every row (`norm_sums`) leaves x's chunk sums current.
            self.ssq_rows = false;
        }
        let rotated = split > 0 && self.token_proj(&Proj { rope, ..p }, split)?;
        if split == t {
            return Ok(rotated);
        }
        // The cuBLAS rows below add into x without their sums.
        self.ssq_rows = false;
        let m = t - split;
        let (t0, r_i) = (split as i32, p.r as i32);
        let xa = self.prepare_half(
            half,
            p.gemm_x,
            p.gemm_x_stride,
            split,
            0,
            p.norm,
            p.k,
            m,
            false,
        )?;
        let y_stride = p.gemm_y_stride as usize;
        let y = p.gemm_y + (split * y_stride * 4) as u64;
        let accumulate = matches!(p.input, Input::PlainAdd | Input::GluAdd);
        let blas = self.blas.as_mut().expect("split only with cuBLAS");
        // SAFETY: xa holds m × K prepared inputs, w is R × K weights, y rows split..t of
        // y_stride floats lie in an activation buffer, which overlaps neither.
        unsafe { blas.gemm(xa, p.w.ptr, m, p.r, p.k, y, y_stride, accumulate) }?;
        // A cuBLAS GEMM counts as one launch (it runs one or more kernels of its own), so the
        // step ledger charges it to the step that enqueued it.
        self.gpu.counters.launches += 1;
        if p.bias.ptr != 0 {
            // SAFETY: add_bias(float* y, int y_stride, int t0, const float* bias, int R): rows
            // t0..t0+m of y, bias R floats.
            unsafe {
                self.gpu.launch(
                    self.k.add_bias,
                    (m as u32, 1, 1),
                    256,
                    Args::new()
                        .arg(&p.gemm_y)
                        .arg(&p.gemm_y_stride)
                        .arg(&t0)
                        .arg(&p.bias.ptr)
                        .arg(&r_i),
                )
            }?;
        }
        Ok(false)
    }

    /// Enqueue the forward pass of `t` tokens through the last hidden state (no LM head). The
    /// first `singles` tokens are their sequences' only ones (decode); attention runs them
    /// through the fused decode kernels (`enqueue_attention`).
    fn enqueue_layers(&mut self, t: usize, singles: usize) -> Result<(), BackendError> {
        let c = self.config.clone();
        let (h, qd, kvd, inter) = (c.hidden_size, c.q_dim(), c.kv_dim(), c.intermediate_size);
        let meta = self.meta_arg();
        let b = self.bufs;
        let hidden = h as i32;
        let vocab = c.vocab_size as u32;
        // The embedding writes x without its chunk sums.
        self.ssq_rows = false;
        // SAFETY: embed_*(StepMeta, const u32* sampled, const W* table, u32 vocab, int hidden,
        // float* x):
        // x holds max_step_tokens rows; token ids were validated against the vocabulary, and
        // device-ring tokens were written by the sampler (always < vocab).
        unsafe {
            self.gpu.launch(
                self.k.embed,
                (t as u32, 1, 1),
                128,
                Args::new()
                    .arg(&meta)
                    .arg(&b.sampled.ptr)
                    .arg(&b.embed.ptr)
                    .arg(&vocab)
                    .arg(&hidden)
                    .arg(&b.x.ptr),
            )
        }?;
        let qkv_w = (qd + 2 * kvd) as i32;
        // down_proj's prepared inputs come from gate|up's epilogue, and o's from the attention's
        // merge (no to_half launch). o's only in the wgmma GEMM's order (32+ tokens): with the
        // row-major kernels of 3–31 tokens too, batch 8 went 4.86 → 4.92 ms per step against
        // 330f13d, where down's alone had gone 4.90 → 4.87 (H200, qwen3-8b; not traced).
        let o_input = self.prepared_order(t, h, qd).filter(|&wg| wg);
        let down_input = self.prepared_order(t, h, inter);
        for li in 0..c.num_hidden_layers {
            let l = self.layers[li];
            // Whether the q|k|v epilogue rotated and appended the prompt rows' heads.
            let rotated = self.project(
                Proj {
                    input: Input::Rms,
                    w: l.qkv,
                    bias: l.qkv_bias,
                    x: b.x.ptr,
                    x_stride: hidden,
                    rows: 0,
                    norm: l.in_norm,
                    k: h,
                    r: qd + 2 * kvd,
                    y: b.qkv.ptr,
                    y_stride: qkv_w,
                    gemm_x: b.x.ptr,
                    gemm_x_stride: hidden,
                    gemm_y: b.qkv.ptr,
                    gemm_y_stride: qkv_w,
                    half_out: None,
                    prepared: None,
                    rope: (singles < t).then(|| (li, self.prompt_rows_from(singles))),
                },
                t,
                singles,
            )?;
            self.enqueue_attention(li, t, singles, o_input, rotated)?;
            self.project(
                Proj {
                    input: Input::PlainAdd,
                    w: l.o,
                    bias: l.o_bias,
                    x: b.attn.ptr,
                    x_stride: qd as i32,
                    rows: 0,
                    norm: DevBuf::NULL,
                    k: qd,
                    r: h,
                    y: b.x.ptr,
                    y_stride: hidden,
                    gemm_x: b.attn.ptr,
                    gemm_x_stride: qd as i32,
                    gemm_y: b.x.ptr,
                    gemm_y_stride: hidden,
                    half_out: None,
                    prepared: o_input,
                    rope: None,
                },
                t,
                singles,
            )?;
            self.project(
                Proj {
                    input: Input::RmsGlu,
                    w: l.gate_up,
                    bias: l.gate_up_bias,
                    x: b.x.ptr,
                    x_stride: hidden,
                    rows: 0,
                    norm: l.post_norm,
                    k: h,
                    r: 2 * inter,
                    y: b.act.ptr,
                    y_stride: inter as i32,
                    gemm_x: b.x.ptr,
                    gemm_x_stride: hidden,
                    gemm_y: b.gu.ptr,
                    gemm_y_stride: (2 * inter) as i32,
                    half_out: down_input,
                    prepared: None,
                    rope: None,
                },
                t,
                singles,
            )?;
            self.project(
                Proj {
                    input: Input::GluAdd,
                    w: l.down,
                    bias: l.down_bias,
                    x: b.act.ptr,
                    x_stride: inter as i32,
                    rows: 0,
                    norm: DevBuf::NULL,
                    k: inter,
                    r: h,
                    y: b.x.ptr,
                    y_stride: hidden,
                    gemm_x: b.gu.ptr,
                    gemm_x_stride: (2 * inter) as i32,
                    gemm_y: b.x.ptr,
                    gemm_y_stride: hidden,
                    half_out: None,
                    prepared: down_input,
                    rope: None,
                },
                t,
                singles,
            )?;
        }
        Ok(())
    }

    /// Layer `li`'s attention for `t` tokens, from the q|k|v projection in `qkv` to the heads'
    /// outputs in `attn`, the first `singles` of them their sequences' only ones (decode). A
    /// decode-only step runs the fused decode kernels; a step with prompt rows runs its decode
    /// rows through them too (`KernelTuning::mixed_decode_attention`) and its prompt rows
    /// through rope_append (every key and value of those rows in the pool first), attn_prefill
    /// (or attn_split) and attn_combine. Every way gives the same bits.
    /// `rotated`: the q|k|v projection's epilogue did rope_append's work already.
    fn enqueue_attention(
        &mut self,
        li: usize,
        t: usize,
        singles: usize,
        half: Option<bool>,
        rotated: bool,
    ) -> Result<(), BackendError> {
        if singles == t {
            return self.enqueue_decode_attention(li, t, true, half);
        }
        // In attn_prefill a block takes many tokens and walks each sequence's tiles in turn:
        // a block of decode tokens of different sequences would walk them one after another.
        let off = self.prompt_rows_from(singles);
        if off > 0 {
            self.enqueue_decode_attention(li, singles, false, half)?;
        }
        self.enqueue_prompt_attention(li, off, t - off, half, rotated)
    }

    /// Where the attention of the step's rows from `off` on also writes its outputs rounded to
    /// 16 bits for the o projection, in the order `half` (`prepared_order`), as the kernels take
    /// it: (null, 0) for none.
    fn half_rows(&self, half: Option<bool>, off: usize) -> (u64, i32) {
        match half {
            Some(wg) => {
                let row = self.config.q_dim() * self.dtype.size();
                (self.bufs.xb.at(off * row), wg as i32)
            }
            None => (0, 0),
        }
    }

    /// The model's scalars every attention kernel takes, as the kernels take them.
    fn attn_scalars(&self) -> AttnScalars {
        let c = &self.config;
        AttnScalars {
            heads: c.num_attention_heads as i32,
            kv_heads: c.num_key_value_heads as i32,
            head_dim: c.head_dim as i32,
            eps: c.rms_norm_eps as f32,
            window: c.sliding_window.unwrap_or(0) as i32,
            scale: 1.0f32 / (c.head_dim as f32).sqrt(),
        }
    }

    /// The fused decode attention of token rows `0..t`, each its sequence's only token: one
    /// launch rotates the queries, writes the new key and value to the pool and attends
    /// (`prefetch`: it may ask L2 for the layer's next weights, as decode-only steps do).
    fn enqueue_decode_attention(
        &mut self,
        li: usize,
        t: usize,
        prefetch: bool,
        half: Option<bool>,
    ) -> Result<(), BackendError> {
        let AttnScalars {
            heads,
            kv_heads,
            head_dim: hd,
            eps,
            window,
            scale,
        } = self.attn_scalars();
        let meta = self.meta_arg();
        let b = self.bufs;
        let l = self.layers[li];
        let geo = self.geometry(li);
        // Past `serial_attention_from` tokens one block per (token, kv head) computes every
        // split; else ATTN_SPLITS blocks, merged through shared memory in a cluster or by
        // the last to finish. The same bits every way (KernelTuning).
        let serial = self.tuning.serial_attention_from.is_some_and(|n| t >= n);
        // Serial launches of at least `serial_pairs_per_sm` blocks per SM run in blocks of 4
        // warps, two per SM; fewer blocks would leave SMs idle with half the warps each.
        let blocks = t * kv_heads as usize;
        let pair = serial
            && (self.tuning.serial_pairs_per_sm).is_some_and(|n| blocks >= n * self.sms as usize);
        let cluster = !serial && self.tuning.cluster_attention;
        let (kernel, splits) = if pair {
            (self.k.attn_decode_serial_pair, 1)
        } else if serial {
            (self.k.attn_decode_serial, 1)
        } else if cluster {
            (self.k.attn_decode_cluster, ATTN_SPLITS)
        } else {
            (self.k.attn_decode, ATTN_SPLITS)
        };
        let args = Args::new()
            .arg(&meta)
            .arg(&b.qkv.ptr)
            .arg(&b.kv.ptr)
            .arg(&b.tables.ptr)
            .arg(&geo)
            .arg(&heads)
            .arg(&kv_heads)
            .arg(&hd)
            .arg(&window)
            .arg(&scale)
            .arg(&l.q_norm.ptr)
            .arg(&l.k_norm.ptr)
            .arg(&eps)
            .arg(&b.cos.ptr)
            .arg(&b.sin.ptr);
        let args = if cluster {
            args
        } else {
            args.arg(&b.part_o.ptr).arg(&b.part_ml.ptr)
        };
        let args = if serial || cluster {
            args
        } else {
            args.arg(&b.attn_done.ptr)
        };
        // What the layer reads next, asked into L2 while attention leaves HBM idle.
        let pf = if prefetch
            && self.tuning.l2_prefetch_bytes > 0
            && t <= self.tuning.l2_prefetch_until
        {
            let next = match self.layers.get(li + 1) {
                Some(n) => n.qkv,
                None => b.lm_head,
            };
            L2PrefetchArg::first_bytes(
                [l.o, l.gate_up, l.down, next],
                self.tuning.l2_prefetch_bytes,
            )
        } else {
            L2PrefetchArg::default()
        };
        let args = args.arg(&b.attn.ptr).arg(&pf);
        let args = if serial {
            args.arg(&self.kv_map).arg(&self.kv_tma)
        } else {
            args
        };
        let (xh, xh_wg) = self.half_rows(half, 0);
        let args = args.arg(&xh).arg(&xh_wg);
        let parts_smem = self.serial_parts[usize::from(pair)];
        let args = if serial { args.arg(&parts_smem) } else { args };
        let grid = (t as u32, kv_heads as u32, splits);
        // SAFETY: attn_decode_*(StepMeta, const float* qkv, KV* kv, const int* tables,
        // KvGeometry, int heads, int kv_heads, int head_dim, int window, float scale,
        // const float* q_norm, const float* k_norm, float eps, const float* cos,
        // const float* sin, float* part_o, float* part_ml, int* done, float* out,
        // L2Prefetch pf, KV* xh, int xh_wg); attn_decode_serial_* the same without `done`,
        // with the KV pool's tensor map (by value, encoded over the whole pool) and its flag
        // between pf and xh, and with int parts_smem last (1 only where the kernel's shared
        // memory was granted room for the partials); attn_decode_cluster_* without part_o,
        // part_ml and done (launched in clusters of the ATTN_SPLITS blocks of a token and kv
        // head, which grid z spans exactly): as rope_append and attn_split below; done holds
        // max_step_tokens × kv_heads counters (zero between launches); out holds
        // max_step_tokens × q_dim floats and xh (null or in xb) as many 16-bit values; pf
        // holds ranges of live weight buffers (a prefetch reads nothing into the kernel).
        unsafe {
            if cluster {
                let dims = (1, 1, ATTN_SPLITS);
                self.gpu
                    .launch_clustered(kernel, grid, ATTN_THREADS, dims, args)
            } else if pair {
                self.gpu
                    .launch(kernel, grid, ATTN_SERIAL_PAIR_THREADS, args)
            } else {
                self.gpu.launch(kernel, grid, ATTN_THREADS, args)
            }
        }
    }

    /// The attention of token rows `off..off + t`, each one of a prompt chunk's: rope_append
    /// writes every key and value of those rows to the pool first (a prompt token attends to
    /// its chunk's earlier ones), then attn_prefill_fold computes and merges the rows' split
    /// partials in its blocks (`prefill_fold_from`), or attn_prefill (or attn_split) computes
    /// them and attn_combine merges them: the same bits. The kernels see the rows from `off` on
    /// as a step of their own (`meta_from`).
    fn enqueue_prompt_attention(
        &mut self,
        li: usize,
        off: usize,
        t: usize,
        half: Option<bool>,
        rotated: bool,
    ) -> Result<(), BackendError> {
        let AttnScalars {
            heads,
            kv_heads,
            head_dim: hd,
            eps,
            window,
            scale,
        } = self.attn_scalars();
        // One warp per head (q, k and v heads) of ROPE_TOKENS tokens, ROPE_WARPS heads per block.
        let rope_heads = (heads + 2 * kv_heads) as u32;
        let rope_grid = (
            (t as u32).div_ceil(ROPE_TOKENS),
            rope_heads.div_ceil(ROPE_WARPS),
            1,
        );
        let rope_threads = 32 * rope_heads.min(ROPE_WARPS);
        let meta = self.meta_from(off);
        let b = self.bufs;
        let l = self.layers[li];
        let geo = self.geometry(li);
        let c = &self.config;
        let qkv = b.qkv.at(off * (c.q_dim() + 2 * c.kv_dim()) * 4);
        let attn = b.attn.at(off * c.q_dim() * 4);
        // Unless the q|k|v projection's epilogue did it (`rotated`): every key and value of
        // the rows to the pool, their queries rotated into q.
        if !rotated {
            // SAFETY: rope_append_*(StepMeta, const float* qkv, float* q_out, KV* kv,
            // const int* tables, KvGeometry, int heads, int kv_heads, int head_dim,
            // const float* q_norm, const float* k_norm, float eps, const float* cos,
            // const float* sin): positions < max_context (validated) index the rope tables and
            // the block tables cover them (validated), so every KV write lands in the pool.
            unsafe {
                self.gpu.launch(
                    self.k.rope_append,
                    rope_grid,
                    rope_threads,
                    Args::new()
                        .arg(&meta)
                        .arg(&qkv)
                        .arg(&b.q.ptr)
                        .arg(&b.kv.ptr)
                        .arg(&b.tables.ptr)
                        .arg(&geo)
                        .arg(&heads)
                        .arg(&kv_heads)
                        .arg(&hd)
                        .arg(&l.q_norm.ptr)
                        .arg(&l.k_norm.ptr)
                        .arg(&eps)
                        .arg(&b.cos.ptr)
                        .arg(&b.sin.ptr),
                )
            }?;
        }
        // attn_prefill where it is built (a block's tokens share each KV tile: as many as
        // ATTN_PREFILL_ROWS (token, head) rows allow, for the group size it is compiled for),
        // else attn_split (one block per token). The same partials either way.
        let tokens_per_block = ATTN_PREFILL_ROWS / (heads / kv_heads).max(1) as usize;
        let args = Args::new()
            .arg(&meta)
            .arg(&b.q.ptr)
            .arg(&b.kv.ptr)
            .arg(&b.tables.ptr)
            .arg(&geo)
            .arg(&heads);
        if let Some(kf) = self.k.attn_prefill_fold.filter(|_| {
            self.tuning.prefill_attention && self.tuning.prefill_fold_from.is_some_and(|n| t >= n)
        }) {
            // On wgmma where it is built (the same signature, grid and bits).
            let kf = self.k.attn_prefill_wg.unwrap_or(kf);
            let groups = t.div_ceil(tokens_per_block);
            let (xh, xh_wg) = self.half_rows(half, off);
            let args = args
                .arg(&window)
                .arg(&scale)
                .arg(&attn)
                .arg(&xh)
                .arg(&xh_wg);
            // SAFETY: attn_prefill_fold_*(StepMeta, const float* q, const KV* kv,
            // const int* tables, KvGeometry, int heads, int window, float scale, float* out,
            // KV* xh, int xh_wg), or attn_prefill_wg_* (the same), over blocks of
            // ATTN_PREFILL_ROWS / group tokens (the kernel loaded for this model's group size),
            // one block per group and kv head: out holds max_step_tokens × q_dim floats from row
            // off, xh (null or in xb) as many 16-bit values; reads stay within positions the
            // block tables cover.
            return unsafe {
                self.gpu
                    .launch(kf, (groups as u32, kv_heads as u32, 1), ATTN_THREADS, args)
            };
        }
        let (kernel, grid, args) = match self.k.attn_prefill {
            Some(k) if self.tuning.prefill_attention => {
                let groups = t.div_ceil(tokens_per_block);
                let zb = prefill_split_blocks(groups * kv_heads as usize, self.sms as usize);
                (k, (groups as u32, kv_heads as u32, zb), args)
            }
            _ => (
                self.k.attn_split,
                (t as u32, kv_heads as u32, ATTN_SPLITS),
                args.arg(&kv_heads).arg(&hd),
            ),
        };
        let args = args
            .arg(&window)
            .arg(&scale)
            .arg(&b.part_o.ptr)
            .arg(&b.part_ml.ptr);
        // SAFETY: attn_split_*(StepMeta, const float* q, const KV* kv, const int* tables,
        // KvGeometry, int heads, int kv_heads, int head_dim, int window, float scale,
        // float* part_o, float* part_ml), or attn_prefill_*_g{group} without kv_heads and
        // head_dim over blocks of ATTN_PREFILL_ROWS / group tokens (the kernel loaded for this
        // model's group size, grid z ≤ ATTN_SPLITS): partial buffers hold max_step_tokens ×
        // heads × ATTN_SPLITS entries; reads stay within positions the block tables cover.
        unsafe { self.gpu.launch(kernel, grid, ATTN_THREADS, args) }?;
        let (xh, xh_wg) = self.half_rows(half, off);
        // SAFETY: attn_combine_*(StepMeta, const float* part_o, const float* part_ml,
        // int heads, int kv_heads, int head_dim, int window, float* out, KV* xh, int xh_wg):
        // same partial layout (it reads the splits with a tile of the token's span, the ones
        // written above); out holds max_step_tokens × q_dim floats, xh (null or in xb) as many
        // 16-bit values.
        unsafe {
            self.gpu.launch(
                self.k.attn_combine,
                (t as u32, kv_heads as u32, 1),
                ATTN_THREADS,
                Args::new()
                    .arg(&meta)
                    .arg(&b.part_o.ptr)
                    .arg(&b.part_ml.ptr)
                    .arg(&heads)
                    .arg(&kv_heads)
                    .arg(&hd)
                    .arg(&window)
                    .arg(&attn)
                    .arg(&xh)
                    .arg(&xh_wg),
            )
        }?;
        Ok(())
    }

    /// Final norm + LM head for logit rows `base..base + rows`, then sampling of those rows.
    fn enqueue_head(
        &mut self,
        base: usize,
        rows: usize,
        copy_logits: bool,
    ) -> Result<(), BackendError> {
        let c = &self.config;
        let (h, vocab) = (c.hidden_size, c.vocab_size);
        let b = self.bufs;
        let meta = self.meta_arg();
        let row_ptr = meta.lrow_token + (base * 4) as u64;
        self.token_proj(
            &Proj {
                input: Input::Rms,
                w: b.lm_head,
                bias: DevBuf::NULL,
                x: b.x.ptr,
                x_stride: h as i32,
                rows: row_ptr,
                norm: b.final_norm,
                k: h,
                r: vocab,
                y: b.logits.ptr,
                y_stride: vocab as i32,
                gemm_x: b.x.ptr,
                gemm_x_stride: h as i32,
                gemm_y: b.logits.ptr,
                gemm_y_stride: vocab as i32,
                half_out: None,
                prepared: None,
                rope: None,
            },
            rows,
        )?;
        if copy_logits {
            let n = rows * vocab * 4;
            self.gpu
                .download(&mut self.logits_stage, 0..n, b.logits.ptr)?;
        }
        let (base_i, rows_i, vocab_i) = (base as i32, rows as i32, vocab as i32);
        // SAFETY: logits_prepare(StepMeta, int row_base, int rows, float* logits, int vocab,
        // const SlotParams*, const u32* counts, const u32* prompt_bits, ChunkStats* stats):
        // logits hold max_seqs ≥ rows rows, stats max_seqs × PREP_CHUNKS entries.
        unsafe {
            self.gpu.launch(
                self.k.prepare,
                (rows as u32, PREP_CHUNKS as u32, 1),
                256,
                Args::new()
                    .arg(&meta)
                    .arg(&base_i)
                    .arg(&rows_i)
                    .arg(&b.logits.ptr)
                    .arg(&vocab_i)
                    .arg(&b.params.ptr)
                    .arg(&b.counts.ptr)
                    .arg(&b.prompt_bits.ptr)
                    .arg(&b.chunk_stats.ptr),
            )
        }?;
        // SAFETY: sample_rows(StepMeta, int row_base, int rows, float* logits, int vocab,
        // SlotParams*, u32* counts, const u32* prompt_bits, u32* sampled, SampleRecord*,
        // float* weights, const ChunkStats*): logits/weights hold max_seqs ≥ rows rows of vocab floats, per-slot
        // arrays hold max_seqs slots, records max_seqs entries indexed by batch position.
        unsafe {
            self.gpu.launch(
                self.k.sample,
                (rows as u32, 1, 1),
                1024,
                Args::new()
                    .arg(&meta)
                    .arg(&base_i)
                    .arg(&rows_i)
                    .arg(&b.logits.ptr)
                    .arg(&vocab_i)
                    .arg(&b.params.ptr)
                    .arg(&b.counts.ptr)
                    .arg(&b.prompt_bits.ptr)
                    .arg(&b.sampled.ptr)
                    .arg(&b.records.ptr)
                    .arg(&b.weights.ptr)
                    .arg(&b.chunk_stats.ptr),
            )
        }
    }

    /// Capture one decode graph per batch-size bucket (1, 2, 4, ... up to max_seqs).
    fn capture_buckets(&mut self) -> Result<(), BackendError> {
        let mut sizes = Vec::new();
        let mut n = 1;
        while n < self.limits.max_seqs {
            sizes.push(n);
            n *= 2;
        }
        sizes.push(self.limits.max_seqs);
        for seqs in sizes {
            if seqs > self.limits.max_step_tokens {
                break;
            }
            let before = self.gpu.counters.launches;
            self.gpu.begin_capture()?;
            let body = self
                .enqueue_layers(seqs, seqs)
                .and_then(|()| self.enqueue_head(0, seqs, false));
            let graph = self.gpu.end_capture(before);
            body?;
            self.buckets.push(Bucket {
                seqs,
                graph: graph?,
            });
        }
        Ok(())
    }

    /// Upload the block-table rows that changed since the last step.
    fn sync_tables(&mut self, batch: &[SeqStep<'_>]) -> Result<(), BackendError> {
        let mp = self.limits.max_pages_per_seq();
        for seq in batch {
            let slot = seq.slot as usize;
            let row = &mut self.tables[slot * mp..(slot + 1) * mp];
            let n = seq.block_table.len().min(mp);
            let same = self.table_len[slot] >= n
                && row[..n]
                    .iter()
                    .zip(seq.block_table)
                    .all(|(&a, &b)| a as u32 == b);
            if same {
                continue;
            }
            for (dst, &p) in row[..n].iter_mut().zip(seq.block_table) {
                *dst = p as i32;
            }
            self.table_len[slot] = n;
            let at = self.bufs.tables.at(slot * mp * 4);
            // Pageable source: the driver stages it before returning, so the mirror may change
            // again at once.
            self.gpu
                .upload(at, i32_bytes(&self.tables[slot * mp..slot * mp + n]))?;
        }
        Ok(())
    }

    /// Upload `slot`'s parameters, seed and draw index (the random stream's position: the
    /// sample kernel advances it once per sampled token).
    fn write_slot_params(
        &mut self,
        slot: u32,
        p: &SamplingParams,
        seed: u64,
        draws: u64,
    ) -> Result<(), BackendError> {
        let mut raw = [0u8; SLOT_PARAMS_BYTES];
        raw[0..4].copy_from_slice(&p.temperature.to_ne_bytes());
        raw[4..8].copy_from_slice(&p.top_k.to_ne_bytes());
        raw[8..12].copy_from_slice(&p.top_p.to_ne_bytes());
        raw[12..16].copy_from_slice(&p.min_p.to_ne_bytes());
        raw[16..20].copy_from_slice(&p.repetition_penalty.to_ne_bytes());
        raw[20..24].copy_from_slice(&p.presence_penalty.to_ne_bytes());
        raw[24..28].copy_from_slice(&p.frequency_penalty.to_ne_bytes());
        raw[28..32].copy_from_slice(&u32::from(p.top_logprobs).to_ne_bytes());
        raw[32..40].copy_from_slice(&seed.to_ne_bytes());
        raw[40..48].copy_from_slice(&draws.to_ne_bytes());
        let at = self.bufs.params.at(slot as usize * SLOT_PARAMS_BYTES);
        self.gpu.upload(at, &raw)
    }

    /// Fill the next staging entry's metadata for `batch`, padded to `pad_tokens` tokens and
    /// `pad_rows` logit rows. Returns (tokens, rows, wants logits).
    /// Step metadata into the next staging entry: (tokens, logit rows, any logits wanted,
    /// single-token entries — their tokens come first).
    fn fill_meta(
        &mut self,
        batch: &[SeqStep<'_>],
        pad_tokens: usize,
    ) -> (usize, usize, bool, usize) {
        let m = self.meta;
        let stage = &mut self.stages[self.next_stage];
        let buf = stage.meta.bytes_mut();
        // Single-token entries (decode) take token rows 0..singles, prefill chunks the rest, so
        // a step's prefill rows are one block for cuBLAS. Logit rows stay in batch order.
        let singles = batch.iter().filter(|s| s.tokens.len() == 1).count();
        let (mut next_single, mut next_chunk) = (0usize, singles);
        let mut rows = 0usize;
        let mut want = false;
        for (i, seq) in batch.iter().enumerate() {
            put_u32(buf, m.seq_slot, i, seq.slot);
            let n = seq.tokens.len();
            let first = if n == 1 {
                next_single += 1;
                next_single - 1
            } else {
                next_chunk += n;
                next_chunk - n
            };
            for (k, &tok) in seq.tokens.iter().enumerate() {
                let t = first + k;
                let id = if seq.from_last_sample && n == 1 {
                    FROM_SLOT | seq.slot
                } else {
                    tok
                };
                put_u32(buf, m.token, t, id);
                put_u32(buf, m.position, t, seq.start_pos + k as u32);
                put_u32(buf, m.token_seq, t, i as u32);
                put_u32(buf, m.token_slot, t, seq.slot);
                let last = k + 1 == n;
                if seq.want_logits || (last && seq.sample) {
                    put_u32(buf, m.lrow_token, rows, t as u32);
                    put_u32(buf, m.lrow_seq, rows, i as u32);
                    put_u32(buf, m.lrow_sample, rows, u32::from(last && seq.sample));
                    rows += 1;
                }
            }
            want |= seq.want_logits;
        }
        let t = next_chunk;
        // Padding entries of a graph bucket: valid indices, never acted on (counts say so).
        for p in t..pad_tokens {
            put_u32(buf, m.token, p, 0);
            put_u32(buf, m.position, p, 0);
            put_u32(buf, m.token_seq, p, 0);
            put_u32(buf, m.lrow_token, p, 0);
            put_u32(buf, m.lrow_seq, p, 0);
            put_u32(buf, m.lrow_sample, p, 0);
            put_u32(buf, m.token_slot, p, 0);
        }
        for p in batch.len()..pad_tokens.min(self.limits.max_seqs) {
            put_u32(buf, m.seq_slot, p, 0);
        }
        put_u32(buf, m.counts, 0, t as u32);
        put_u32(buf, m.counts, 1, batch.len() as u32);
        put_u32(buf, m.counts, 2, rows as u32);
        put_u32(buf, m.chunk_counts, 0, (t - singles) as u32);
        (t, rows, want, singles)
    }
}

impl Backend for CudaBackend {
    fn info(&self) -> BackendInfo {
        BackendInfo {
            name: "cuda".into(),
            device: format!(
                "{}, {:?} weights, {} KV pages",
                self.device_name, self.dtype, self.limits.num_pages
            ),
            kv_bytes_per_token: self.kv_page_bytes / self.limits.page_tokens,
        }
    }

    fn read_bandwidth(&mut self) -> Result<Option<f64>, BackendError> {
        // 8 GiB, or the whole arena if smaller (the measurement clamps), median of 10: over
        // 1 GiB a pass measured ~3% below the card's streaming rate (H200: 4.47-4.52 against
        // 4.62-4.65 TB/s over 8 GiB in the same processes, thirty-fifth session); 11 passes
        // over 8 GiB take ~20 ms at start.
        let bytes_per_s = self.measure_read_bandwidth(8 << 30, 10)?;
        // Start-up work belongs to no step (as in `new`).
        self.mark = CounterMark::new(self.gpu.counters);
        Ok(Some(bytes_per_s))
    }

    fn limits(&self) -> BackendLimits {
        self.limits
    }

    fn start_sequence(
        &mut self,
        slot: u32,
        params: &SamplingParams,
        seed: u64,
        prompt: &[u32],
    ) -> Result<(), BackendError> {
        let vocab = self.config.vocab_size;
        check_start(params, slot, self.limits.max_seqs, prompt, vocab)?;
        self.gpu.bind()?;
        self.write_slot_params(slot, params, seed, 0)?;
        let s = slot as usize;
        self.gpu
            .zero(self.bufs.counts.at(s * vocab * 4), vocab * 4)?;
        let words = vocab.div_ceil(32);
        let at = self.bufs.prompt_bits.at(s * words * 4);
        if params.repetition_penalty != 1.0 {
            self.bits.fill(0);
            for &t in prompt {
                self.bits[t as usize / 32] |= 1 << (t % 32);
            }
            self.gpu.upload(at, u32_bytes(&self.bits))?;
        } else {
            self.gpu.zero(at, words * 4)?;
        }
        Ok(())
    }

    fn fork_sequence(
        &mut self,
        src: u32,
        dst: u32,
        params: &SamplingParams,
        seed: u64,
    ) -> Result<(), BackendError> {
        check_fork(params, src, dst, self.limits.max_seqs)?;
        self.gpu.bind()?;
        let vocab = self.config.vocab_size;
        let words = vocab.div_ceil(32);
        let (s, d) = (src as usize, dst as usize);
        let b = self.bufs;
        self.gpu.copy(
            b.counts.at(d * vocab * 4),
            b.counts.at(s * vocab * 4),
            vocab * 4,
        )?;
        self.gpu.copy(
            b.prompt_bits.at(d * words * 4),
            b.prompt_bits.at(s * words * 4),
            words * 4,
        )?;
        self.gpu.copy(b.sampled.at(d * 4), b.sampled.at(s * 4), 4)?;
        self.write_slot_params(dst, params, seed, 0)
    }

    fn resume_sequence(
        &mut self,
        slot: u32,
        params: &SamplingParams,
        seed: u64,
        prompt: &[u32],
        output: &[u32],
    ) -> Result<(), BackendError> {
        let vocab = self.config.vocab_size;
        if let Some(&bad) = output.iter().find(|&&t| t as usize >= vocab) {
            return Err(BackendError::InvalidInput(format!(
                "token {bad} outside vocabulary"
            )));
        }
        self.start_sequence(slot, params, seed, prompt)?;
        // The sample kernel counts every sampled token (`cnt[token] += 1`) and advances the
        // slot's draw index once per sample, greedy included (kernels/sampling.cu): restore
        // both. Resuming is rare (preemption, parking), so a host vector is fine here.
        if !output.is_empty() {
            let mut counts = vec![0u32; vocab];
            for &t in output {
                counts[t as usize] += 1;
            }
            let at = self.bufs.counts.at(slot as usize * vocab * 4);
            self.gpu.upload(at, u32_bytes(&counts))?;
        }
        self.write_slot_params(slot, params, seed, output.len() as u64)
    }

    fn copy_page(&mut self, src: u32, dst: u32) -> Result<(), BackendError> {
        let n = self.limits.num_pages;
        if src as usize >= n || dst as usize >= n {
            return Err(BackendError::InvalidInput(format!(
                "page copy {src} -> {dst} out of range"
            )));
        }
        self.gpu.bind()?;
        let pb = self.kv_page_bytes;
        let kv = self.bufs.kv;
        self.gpu
            .copy(kv.at(dst as usize * pb), kv.at(src as usize * pb), pb)
    }

    /// Stream-ordered after the steps launched so far (`swap` module docs).
    fn swap_out(&mut self, pages: &[u32], host: &[u32]) -> Result<(), BackendError> {
        super::validate_swap(&self.limits, pages, host)?;
        self.gpu.bind()?;
        self.swap.swap_out(&mut self.gpu, self.bufs.kv, pages, host)
    }

    /// Stream-ordered before the steps launched from now on (`swap` module docs).
    fn swap_in(&mut self, host: &[u32], pages: &[u32]) -> Result<(), BackendError> {
        super::validate_swap(&self.limits, pages, host)?;
        self.gpu.bind()?;
        self.swap.swap_in(&mut self.gpu, self.bufs.kv, host, pages)
    }

    fn launch(&mut self, batch: &[SeqStep<'_>], out: &mut StepOutput) -> Result<(), BackendError> {
        validate_step(&self.limits, self.config.vocab_size, batch)?;
        let entered = std::time::Instant::now();
        if self.in_flight.len() >= RING {
            return Err(BackendError::Limits(format!(
                "{RING} steps already launched and not collected"
            )));
        }
        self.gpu.bind()?;
        self.sync_tables(batch)?;
        let decode_only = batch
            .iter()
            .all(|s| s.tokens.len() == 1 && s.sample && !s.want_logits);
        let bucket = if decode_only {
            self.buckets.iter().position(|b| b.seqs >= batch.len())
        } else {
            None
        };
        let pad = bucket.map_or(0, |b| self.buckets[b].seqs);
        let (tokens, rows, want_logits, singles) = self.fill_meta(batch, pad);
        let ring = self.next_stage;
        self.next_stage = (self.next_stage + 1) % RING;
        let meta_bytes = self.meta.bytes;
        let meta_ptr = self.bufs.meta.ptr;
        // Pinned source, read by the copy engine when the stream reaches it: this ring entry is
        // not rewritten before its step has been collected.
        self.gpu
            .upload(meta_ptr, &self.stages[ring].meta.bytes()[..meta_bytes])?;
        self.gpu.record(&self.stages[ring].start)?;
        out.logits.clear();
        if let Some(b) = bucket {
            self.gpu.replay(&self.buckets[b].graph)?;
            self.stats.graph_steps += 1;
        } else {
            self.enqueue_layers(tokens, singles)?;
            let chunk = self.limits.max_seqs;
            let mut base = 0;
            while base < rows {
                let n = chunk.min(rows - base);
                self.enqueue_head(base, n, want_logits)?;
                if want_logits {
                    // Policy sync (dump/parity only): the logits leave before the next chunk
                    // reuses the buffer.
                    self.gpu.record(&self.stages[ring].done)?;
                    self.gpu.wait(&self.stages[ring].done, true)?;
                    let vocab = self.config.vocab_size;
                    let stage = self.logits_stage.bytes();
                    // Rows of this chunk that asked for logits, in order.
                    let mut row = 0usize;
                    for seq in batch {
                        let n_rows = if seq.want_logits {
                            seq.tokens.len()
                        } else {
                            usize::from(seq.sample)
                        };
                        for _ in 0..n_rows {
                            if row >= base && row < base + n && seq.want_logits {
                                let at = (row - base) * vocab * 4;
                                let bytes = &stage[at..at + vocab * 4];
                                out.logits.extend(
                                    bytes
                                        .chunks_exact(4)
                                        .map(|b| f32::from_ne_bytes([b[0], b[1], b[2], b[3]])),
                                );
                            }
                            row += 1;
                        }
                    }
                }
                base += n;
            }
        }
        let seqs = batch.len();
        let recs = self.bufs.records.ptr;
        self.gpu
            .download(&mut self.stages[ring].records, 0..seqs * RECORD_BYTES, recs)?;
        self.gpu.record(&self.stages[ring].end)?;
        if self.sync_each_step {
            self.gpu.wait_debug(&self.stages[ring].end)?;
        }
        let mut sample = [false; 1024];
        for (i, s) in batch.iter().enumerate() {
            sample[i] = s.sample;
        }
        let mut report = StepReport::default();
        self.mark.charge(self.gpu.counters, &mut report);
        report.host_ns = entered.elapsed().as_nanos() as u64;
        self.in_flight.push_back(InFlight {
            ring,
            seqs,
            sample,
            report,
        });
        self.stats.steps += 1;
        Ok(())
    }

    fn collect(&mut self, out: &mut StepOutput) -> Result<(), BackendError> {
        let entered = std::time::Instant::now();
        let Some(step) = self.in_flight.pop_front() else {
            return Err(BackendError::InvalidInput(
                "collect without a launched step".into(),
            ));
        };
        self.gpu.bind()?;
        self.gpu.wait(&self.stages[step.ring].end, false)?;
        let ms = self
            .gpu
            .elapsed_ms(&self.stages[step.ring].start, &self.stages[step.ring].end)?;
        self.stats.gpu_ms += f64::from(ms);
        self.stats.last_gpu_ms = ms;
        let finished_at = self
            .clock
            .host_time(&self.gpu, &self.stages[step.ring].end)?;
        self.clock
            .renew_if_idle(&mut self.gpu, self.in_flight.is_empty())?;
        let mut report = step.report;
        self.mark.charge(self.gpu.counters, &mut report);
        report.gpu_ns = (f64::from(ms) * 1e6) as u64;
        report.finished_at = Some(finished_at);
        report.host_ns += entered.elapsed().as_nanos() as u64;
        self.stats.host_ns += report.host_ns;
        out.report = report;
        out.samples.clear();
        let records = self.stages[step.ring].records.bytes();
        let word = |rec: usize, i: usize| {
            let at = rec * RECORD_BYTES + i * 4;
            u32::from_ne_bytes([
                records[at],
                records[at + 1],
                records[at + 2],
                records[at + 3],
            ])
        };
        for i in 0..step.seqs {
            if !step.sample[i] {
                out.samples.push(None);
                continue;
            }
            let top_n = (word(i, 2) as usize).min(MAX_TOP_LOGPROBS);
            let mut tok = SampledToken {
                token: word(i, 0),
                logprob: f32::from_bits(word(i, 1)),
                top_n: top_n as u8,
                ..SampledToken::default()
            };
            for k in 0..top_n {
                tok.top_ids[k] = word(i, 4 + k);
                tok.top_logprobs[k] = f32::from_bits(word(i, 4 + MAX_TOP_LOGPROBS + k));
            }
            out.samples.push(Some(tok));
        }
        Ok(())
    }

    fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    fn overlaps(&self) -> bool {
        true
    }

    fn stats(&self) -> super::BackendStats {
        let d = self.gpu.counters;
        super::BackendStats {
            steps: self.stats.steps,
            graph_steps: self.stats.graph_steps,
            launches: d.launches,
            graph_launches: d.graph_launches,
            graph_nodes: d.graph_nodes,
            hard_syncs: d.hard_syncs,
            policy_syncs: d.policy_syncs,
            debug_syncs: d.debug_syncs,
            h2d_bytes: d.h2d_bytes,
            d2h_bytes: d.d2h_bytes,
            device_allocs: d.device_allocs,
            pinned_allocs: d.pinned_allocs,
            gpu_ms: self.stats.gpu_ms,
            host_ns: self.stats.host_ns,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn programmatic_launch_needs_hopper_and_a_driver_that_captures_it() {
        assert!(!use_programmatic_launch(80, (13, 0)));
        assert!(!use_programmatic_launch(90, (12, 2)));
        if std::env::var_os("NERVA_PDL").is_none() {
            assert!(use_programmatic_launch(90, (12, 3)));
            assert!(use_programmatic_launch(100, (13, 0)));
        }
    }

    #[test]
    fn l2_prefetch_takes_the_first_bytes_in_order() {
        let buf = |ptr, bytes| DevBuf { ptr, bytes };
        let pf = L2PrefetchArg::first_bytes(
            [
                buf(0x1000, 100),
                buf(0, 64),
                buf(0x9000, 1 << 20),
                buf(0x20_0000, 64),
            ],
            200,
        );
        // 100 bytes cut to 96; the null buffer skipped; 104 left, cut to 96; nothing for the last.
        assert_eq!(pf.ptr, [0x1000, 0, 0x9000, 0]);
        assert_eq!(pf.bytes, [96, 0, 96, 0]);
        let all = L2PrefetchArg::first_bytes([buf(0x1000, 4096); L2_RANGES], usize::MAX);
        assert_eq!(all.bytes, [4096; L2_RANGES]);
        assert_eq!(std::mem::size_of::<L2PrefetchArg>(), 48);
    }
}

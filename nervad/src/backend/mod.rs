//! Backends: one batched step over a paged KV pool, sampling included.
//!
//! The contract is shaped for a GPU as much as for the CPU:
//! - every size a step can reach (sequences per step, tokens per step, KV pages, sampling slots)
//!   is fixed at construction, so a device backend can allocate once and capture graphs;
//! - the KV pool lives inside the backend (device memory for a GPU); the engine only hands out
//!   page ids through per-sequence block tables;
//! - sampling happens inside the backend, per sequence slot, with the slot's parameters, random
//!   stream and penalty state kept there too, so a GPU backend can sample on the device and
//!   return only token ids.

pub mod cpu;
pub mod cuda;
pub mod sampling;

use crate::model::ModelConfig;

/// Per-request sampling. Defaults are greedy with no penalties.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SamplingParams {
    /// 0 means greedy (argmax); otherwise logits are divided by it.
    pub temperature: f32,
    /// Keep the k most likely tokens; 0 disables.
    pub top_k: u32,
    /// Keep the smallest set whose probability mass reaches p; 1.0 disables.
    pub top_p: f32,
    /// Drop tokens whose probability is below `min_p * p_max`; 0 disables.
    pub min_p: f32,
    /// CTRL-style repetition penalty over prompt and output tokens; 1.0 disables.
    pub repetition_penalty: f32,
    /// OpenAI-style presence penalty over output tokens; 0 disables.
    pub presence_penalty: f32,
    /// OpenAI-style frequency penalty over output tokens; 0 disables.
    pub frequency_penalty: f32,
    /// Seed of the request's own random stream (same seed and prompt → same tokens).
    pub seed: u64,
    /// Also report the log-probabilities of this many most likely tokens (0..=20).
    pub top_logprobs: u8,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            seed: 0,
            top_logprobs: 0,
        }
    }
}

/// Most top-n alternatives a sampled token can carry (the API caps `top_logprobs` at 20).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// Sizes fixed when a backend is built.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackendLimits {
    /// Most sequences in one step (also the number of sampling slots).
    pub max_seqs: usize,
    /// Most new tokens over all sequences of one step.
    pub max_step_tokens: usize,
    /// Tokens per KV page.
    pub page_tokens: usize,
    /// KV pages in the pool.
    pub num_pages: usize,
    /// Longest sequence (prompt + output) a slot can hold; also bounds block tables.
    pub max_context: usize,
    /// Pages the host swap area holds (0: no swap area; preemption then recomputes).
    pub swap_pages: usize,
}

impl BackendLimits {
    /// Pages one sequence of `max_context` tokens needs.
    pub fn max_pages_per_seq(&self) -> usize {
        self.max_context.div_ceil(self.page_tokens)
    }
}

/// What a backend is asked to build.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackendOptions {
    /// Most sequences per step.
    pub max_seqs: usize,
    /// Most new tokens per step.
    pub max_step_tokens: usize,
    /// Tokens per KV page.
    pub page_tokens: usize,
    /// Bytes the KV pool may take; the backend turns this into a page count with its own
    /// element size (f32 on the CPU).
    pub kv_budget_bytes: usize,
    /// Longest sequence served.
    pub max_context: usize,
    /// Worker threads (CPU); 0 means all available cores.
    pub threads: usize,
    /// Host memory for KV pages swapped out of the pool (preemption by swapping).
    pub swap: SwapSpace,
}

/// How much host memory the swap area takes. It is allocated once, when the backend is built
/// (page-locked on a device, so the copy engines reach it), and holds whole KV pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SwapSpace {
    /// No swap area.
    #[default]
    None,
    /// Exactly this many bytes: a whole number of KV pages, or the backend refuses to start
    /// (the operator asked for a size; a silent rounding would hide a wrong one).
    Bytes(usize),
    /// As many whole pages as fit in this many bytes (a computed default; none when not even
    /// one fits).
    UpTo(usize),
}

impl SwapSpace {
    /// Pages of `page_bytes` this size holds, or why it is unusable.
    pub fn pages(self, page_bytes: usize) -> Result<usize, BackendError> {
        let page_bytes = page_bytes.max(1);
        match self {
            SwapSpace::None | SwapSpace::Bytes(0) | SwapSpace::UpTo(0) => Ok(0),
            SwapSpace::UpTo(bytes) => Ok(bytes / page_bytes),
            SwapSpace::Bytes(bytes) if bytes % page_bytes != 0 => {
                let below = bytes / page_bytes * page_bytes;
                Err(BackendError::Limits(format!(
                    "swap space of {bytes} bytes is not a whole number of KV pages ({page_bytes} \
                     bytes each with this model, page size and backend): use {below} ({} pages) \
                     or {} ({} pages), or 0 for none",
                    below / page_bytes,
                    below + page_bytes,
                    below / page_bytes + 1
                )))
            }
            SwapSpace::Bytes(bytes) => Ok(bytes / page_bytes),
        }
    }
}

/// Errors a backend reports. A step that fails leaves the KV pool's pages of the failing
/// sequences in an unspecified state; the engine fails those requests.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BackendError {
    /// The step or a sequence does not fit the limits fixed at construction.
    #[error("step exceeds backend limits: {0}")]
    Limits(String),
    /// A token id, position, page id or slot is out of range.
    #[error("invalid step input: {0}")]
    InvalidInput(String),
    /// The model shape or weights are unusable by this backend.
    #[error("unsupported model: {0}")]
    Unsupported(String),
    /// The KV budget does not hold a single full-context sequence.
    #[error("KV budget of {budget} bytes is below one page set ({need} bytes)")]
    KvBudget {
        /// Bytes given.
        budget: usize,
        /// Bytes needed at least.
        need: usize,
    },
    /// Device failure.
    #[error("device error: {0}")]
    Device(String),
}

/// One sequence's part of a step: new tokens appended at `start_pos`.
#[derive(Debug, Clone, Copy)]
pub struct SeqStep<'a> {
    /// Sampling slot of the sequence (`0..max_seqs`), set up with [`Backend::start_sequence`].
    pub slot: u32,
    /// New tokens: a prefill chunk or the one token decoded last step.
    pub tokens: &'a [u32],
    /// Position of `tokens[0]`; the KV pool already holds positions `0..start_pos`.
    pub start_pos: u32,
    /// Pages of the sequence in position order; covers `0..start_pos + tokens.len()`.
    pub block_table: &'a [u32],
    /// Sample a token after the last new token (false for all but the last prefill chunk).
    pub sample: bool,
    /// Also return the logits of every new position (dump and parity tools).
    pub want_logits: bool,
    /// `tokens` is the single token this slot sampled in its previous step. A backend that
    /// keeps samples where it computes them (the GPU's token ring) feeds it from there, so a
    /// step can be launched before the host has seen the previous step's token; `tokens[0]`
    /// is then only the host's copy (it may be stale when steps are pipelined).
    pub from_last_sample: bool,
}

/// The token a slot sampled, with its log-probability and optional alternatives.
///
/// Log-probabilities are `log_softmax` of the distribution after penalties and temperature
/// (temperature 1 when greedy) and before top-k/top-p/min-p truncation, so they are finite for
/// every token and comparable across sampling settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SampledToken {
    /// The chosen token.
    pub token: u32,
    /// Its log-probability.
    pub logprob: f32,
    /// How many entries of `top_ids` / `top_logprobs` are valid.
    pub top_n: u8,
    /// Most likely tokens, best first.
    pub top_ids: [u32; MAX_TOP_LOGPROBS],
    /// Their log-probabilities.
    pub top_logprobs: [f32; MAX_TOP_LOGPROBS],
}

impl Default for SampledToken {
    fn default() -> Self {
        SampledToken {
            token: 0,
            logprob: 0.0,
            top_n: 0,
            top_ids: [0; MAX_TOP_LOGPROBS],
            top_logprobs: [0.0; MAX_TOP_LOGPROBS],
        }
    }
}

impl SampledToken {
    /// The valid top-n ids.
    pub fn top_ids(&self) -> &[u32] {
        &self.top_ids[..usize::from(self.top_n)]
    }

    /// The valid top-n log-probabilities.
    pub fn top_logprobs(&self) -> &[f32] {
        &self.top_logprobs[..usize::from(self.top_n)]
    }
}

/// Results of one step, owned by the caller and reused across steps.
#[derive(Debug, Default)]
pub struct StepOutput {
    /// One entry per sequence of the step, in batch order; `None` where `sample` was false.
    pub samples: Vec<Option<SampledToken>>,
    /// When any sequence asked `want_logits`: `[positions, vocab]` row-major, the requesting
    /// sequences' new positions in batch order.
    pub logits: Vec<f32>,
    /// What the collected step cost, written by [`Backend::collect`].
    pub report: StepReport,
}

impl StepOutput {
    /// Pre-size for `max_seqs` sequences so steps without logits never allocate.
    pub fn with_capacity(max_seqs: usize) -> Self {
        StepOutput {
            samples: Vec::with_capacity(max_seqs),
            logits: Vec::new(),
            report: StepReport::default(),
        }
    }
}

/// One step's own figures, reported when the step is collected (the token ledger's input).
///
/// Every counted driver action lands in exactly one step's report: work done by `launch` (and
/// by calls between steps: sequence set-up, page copies) goes to the step launched, work done
/// by `collect` to the step collected. So the reports of all collected steps sum to the
/// difference of [`Backend::stats`] over the same span, even when steps overlap.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct StepReport {
    /// Graph replays.
    pub graph_replays: u64,
    /// Plain kernel launches.
    pub launches: u64,
    /// Kernel nodes replayed through graphs.
    pub graph_nodes: u64,
    /// Host waits the step's results required.
    pub hard_syncs: u64,
    /// Waits a policy asked for (logits for dumps, the device clock's anchor).
    pub policy_syncs: u64,
    /// Waits only a debugging setting asked for (`NERVA_CUDA_SYNC=1`).
    pub debug_syncs: u64,
    /// Bytes copied host → device.
    pub h2d_bytes: u64,
    /// Bytes copied device → host.
    pub d2h_bytes: u64,
    /// Device allocations.
    pub device_allocs: u64,
    /// Pinned host allocations.
    pub pinned_allocs: u64,
    /// Device time between the step's start and end, ns (0 without a device).
    pub gpu_ns: u64,
    /// Host time spent inside this step's `launch` and `collect` calls, ns.
    pub host_ns: u64,
    /// When the step's results were complete, on the host's clock: for a device, the step's
    /// end event mapped onto the host clock; for the CPU, the end of its `launch`. `None` when
    /// the backend cannot know it.
    pub finished_at: Option<std::time::Instant>,
}

/// What a backend has asked of its device since it started (monotonic counters; the token
/// ledger takes differences).
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct BackendStats {
    /// Steps launched.
    pub steps: u64,
    /// Steps that replayed a captured graph.
    pub graph_steps: u64,
    /// Plain kernel launches.
    pub launches: u64,
    /// Graph replays.
    pub graph_launches: u64,
    /// Kernel nodes replayed through graphs.
    pub graph_nodes: u64,
    /// Host waits for results the engine needs (collect).
    pub hard_syncs: u64,
    /// Waits a policy asked for (logits for dump/parity, weight upload pacing at start).
    pub policy_syncs: u64,
    /// Waits only a debugging setting asked for (`NERVA_CUDA_SYNC=1`).
    pub debug_syncs: u64,
    /// Bytes copied host → device.
    pub h2d_bytes: u64,
    /// Bytes copied device → host.
    pub d2h_bytes: u64,
    /// Device allocations.
    pub device_allocs: u64,
    /// Pinned host allocations.
    pub pinned_allocs: u64,
    /// Device time of all collected steps, ms.
    pub gpu_ms: f64,
    /// Host time spent inside `launch` and `collect` of all collected steps, ns (the sum of
    /// their [`StepReport::host_ns`]).
    pub host_ns: u64,
}

/// Facts about a backend for status displays.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendInfo {
    /// `cpu`, `cuda`, ...
    pub name: String,
    /// Device description.
    pub device: String,
    /// Bytes one token takes in this backend's KV pool (all layers, K and V, at the pool's
    /// element size): what a decode step reads per token of context besides the weights.
    pub kv_bytes_per_token: usize,
}

/// A compute backend: one batched forward step over a paged KV pool, plus sampling.
pub trait Backend: Send {
    /// Name and device.
    fn info(&self) -> BackendInfo;

    /// Sizes fixed at construction.
    fn limits(&self) -> BackendLimits;

    /// Reset sampling slot `slot` for a new sequence: its parameters, its random stream (seeded
    /// with `seed`) and its penalty state (the prompt counts for the repetition penalty).
    fn start_sequence(
        &mut self,
        slot: u32,
        params: &SamplingParams,
        seed: u64,
        prompt: &[u32],
    ) -> Result<(), BackendError>;

    /// Make `dst` a copy of `src`'s penalty state (prompt and output so far) with `params` and a
    /// fresh random stream seeded with `seed` (samples forked from one prompt).
    fn fork_sequence(
        &mut self,
        src: u32,
        dst: u32,
        params: &SamplingParams,
        seed: u64,
    ) -> Result<(), BackendError>;

    /// Put `slot` in the exact state a sequence started with `start_sequence(slot, params,
    /// seed, prompt)` is in after it sampled `output` (in order): penalty state counting the
    /// prompt and every output token, random stream advanced past every draw those samples
    /// took. A sequence preempted (or parked) and resumed in another slot thus samples the same
    /// tokens an uninterrupted run would. Off the hot path: a backend may allocate here.
    fn resume_sequence(
        &mut self,
        slot: u32,
        params: &SamplingParams,
        seed: u64,
        prompt: &[u32],
        output: &[u32],
    ) -> Result<(), BackendError>;

    /// Copy the contents of KV page `src` into page `dst` (copy-on-write of a shared tail page).
    fn copy_page(&mut self, src: u32, dst: u32) -> Result<(), BackendError>;

    /// Copy KV pages `pages[i]` out to host swap slots `host[i]` (`0..limits().swap_pages`)
    /// for preemption by swapping. Ordered after every step launched before the call and before
    /// every step launched after it: a page is read only once the steps that write it are done,
    /// so the caller may hand the page to another sequence as soon as this returns. The host
    /// slots must not be read back ([`Backend::swap_in`]) into a page a launched step still
    /// reads.
    fn swap_out(&mut self, pages: &[u32], host: &[u32]) -> Result<(), BackendError> {
        let _ = (pages, host);
        Err(BackendError::Limits("this backend has no swap area".into()))
    }

    /// Copy host swap slots `host[i]` back into KV pages `pages[i]`. Ordered after every step
    /// launched before the call (so the pages may have been written by a previous holder until
    /// then) and before every step launched after it (which may read them). The host slots may
    /// be handed to another `swap_out` as soon as this returns.
    fn swap_in(&mut self, host: &[u32], pages: &[u32]) -> Result<(), BackendError> {
        let _ = (host, pages);
        Err(BackendError::Limits("this backend has no swap area".into()))
    }

    /// Enqueue one forward step over `batch` with sampling where asked; sampled tokens also
    /// enter their slot's penalty state and, on a device, its token ring. Logits asked for with
    /// `want_logits` are written to `out.logits` before this returns (a policy sync on a
    /// device). The step's samples are read with [`Backend::collect`], in launch order; a
    /// backend may accept several launches before the first collect (see
    /// [`Backend::in_flight`]).
    fn launch(&mut self, batch: &[SeqStep<'_>], out: &mut StepOutput) -> Result<(), BackendError>;

    /// Wait for the oldest launched step and write its samples to `out.samples` (one entry per
    /// batch entry, `None` where `sample` was false) and its figures to `out.report`.
    fn collect(&mut self, out: &mut StepOutput) -> Result<(), BackendError>;

    /// Steps launched and not yet collected.
    fn in_flight(&self) -> usize;

    /// Does a launched step run while the caller goes on (a device)? The engine then launches
    /// the next decode step before collecting the one in flight. False for a backend whose
    /// launch does all the work.
    fn overlaps(&self) -> bool {
        false
    }

    /// Cumulative device-side figures (launches, graph replays, syncs by class, copies,
    /// allocations); zero where a backend has no device.
    fn stats(&self) -> BackendStats {
        BackendStats::default()
    }

    /// Measure the device's streaming read bandwidth, bytes per second: the ceiling of a decode
    /// step's roofline (the weights and each sequence's KV read once per step). `None` where the
    /// backend has no device memory of its own to measure (the CPU). Called once, before
    /// serving (the daemon's start): a device backend may stream over any of its device memory
    /// (a read changes nothing).
    fn read_bandwidth(&mut self) -> Result<Option<f64>, BackendError> {
        Ok(None)
    }

    /// Launch and collect one step.
    fn step(&mut self, batch: &[SeqStep<'_>], out: &mut StepOutput) -> Result<(), BackendError> {
        self.launch(batch, out)?;
        self.collect(out)
    }
}

/// Parse a byte size: a plain number, or one with a unit (`512MiB`, `1GiB`, `2G`, `1.5GB`,
/// binary units for `Ki/Mi/Gi/Ti` and `K/M/G/T`, decimal for `kB/MB/GB/TB`).
pub fn parse_bytes(s: &str) -> Result<usize, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let value: f64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a size (e.g. 8GiB, 512MiB, 1073741824)"))?;
    let scale: f64 = match unit.trim() {
        "" | "B" => 1.0,
        "K" | "Ki" | "KiB" => 1024.0,
        "M" | "Mi" | "MiB" => 1024.0 * 1024.0,
        "G" | "Gi" | "GiB" => 1024.0 * 1024.0 * 1024.0,
        "T" | "Ti" | "TiB" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        "kB" | "KB" => 1e3,
        "MB" => 1e6,
        "GB" => 1e9,
        "TB" => 1e12,
        other => return Err(format!("unknown size unit {other:?} in {s:?}")),
    };
    let bytes = value * scale;
    if !bytes.is_finite() || bytes < 0.0 || bytes > usize::MAX as f64 {
        return Err(format!("{s:?} is out of range"));
    }
    Ok(bytes as usize)
}

/// Check the arguments of a swap: as many pages as host slots, each in range.
/// Backends call this first so a bad call copies nothing.
pub fn validate_swap(
    limits: &BackendLimits,
    pages: &[u32],
    host: &[u32],
) -> Result<(), BackendError> {
    if pages.len() != host.len() {
        return Err(BackendError::InvalidInput(format!(
            "swap of {} pages into {} host slots",
            pages.len(),
            host.len()
        )));
    }
    if let Some(&bad) = pages.iter().find(|&&p| p as usize >= limits.num_pages) {
        return Err(BackendError::InvalidInput(format!(
            "page {bad} out of range"
        )));
    }
    if let Some(&bad) = host.iter().find(|&&h| h as usize >= limits.swap_pages) {
        return Err(BackendError::InvalidInput(format!(
            "host swap slot {bad} out of range (the swap area holds {} pages)",
            limits.swap_pages
        )));
    }
    Ok(())
}

/// Bytes of KV cache one token takes over all layers with `elem_bytes` per value.
pub fn kv_bytes_per_token(config: &ModelConfig, elem_bytes: usize) -> usize {
    config.num_hidden_layers * 2 * config.kv_dim() * elem_bytes
}

/// Check a step against the limits every backend shares (ranges of slots, tokens, positions,
/// pages). Backends call this first so a bad step fails before any KV page is written.
pub fn validate_step(
    limits: &BackendLimits,
    vocab_size: usize,
    batch: &[SeqStep<'_>],
) -> Result<usize, BackendError> {
    if batch.len() > limits.max_seqs {
        return Err(BackendError::Limits(format!(
            "{} sequences > max {}",
            batch.len(),
            limits.max_seqs
        )));
    }
    let mut total = 0usize;
    for (i, seq) in batch.iter().enumerate() {
        if seq.slot as usize >= limits.max_seqs {
            return Err(BackendError::InvalidInput(format!(
                "slot {} out of range",
                seq.slot
            )));
        }
        if batch[..i].iter().any(|other| other.slot == seq.slot) {
            return Err(BackendError::InvalidInput(format!(
                "slot {} twice in one step",
                seq.slot
            )));
        }
        if seq.tokens.is_empty() {
            return Err(BackendError::InvalidInput(format!(
                "sequence {i} has no tokens"
            )));
        }
        if let Some(&bad) = seq.tokens.iter().find(|&&t| t as usize >= vocab_size) {
            return Err(BackendError::InvalidInput(format!(
                "token {bad} outside vocabulary"
            )));
        }
        let end = seq.start_pos as usize + seq.tokens.len();
        if end > limits.max_context {
            return Err(BackendError::Limits(format!(
                "sequence reaches position {end} > max context {}",
                limits.max_context
            )));
        }
        if seq.block_table.len() * limits.page_tokens < end {
            return Err(BackendError::InvalidInput(format!(
                "block table of {} pages does not cover {end} positions",
                seq.block_table.len()
            )));
        }
        if let Some(&bad) = seq
            .block_table
            .iter()
            .find(|&&p| p as usize >= limits.num_pages)
        {
            return Err(BackendError::InvalidInput(format!(
                "page {bad} out of range"
            )));
        }
        total += seq.tokens.len();
    }
    if total > limits.max_step_tokens {
        return Err(BackendError::Limits(format!(
            "{total} tokens > max {} per step",
            limits.max_step_tokens
        )));
    }
    Ok(total)
}

/// Which backend the daemon runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum BackendChoice {
    /// CUDA when a usable device is present (driver ≥ 12.0, sm_80 or newer, NVRTC loadable),
    /// else the CPU, with one log line saying why.
    #[default]
    Auto,
    /// The CUDA backend; any reason it cannot run is an error.
    Cuda,
    /// The exact CPU reference.
    Cpu,
}

/// Build the backend `choice` names for `config`/`weights`.
pub fn build(
    choice: BackendChoice,
    config: &ModelConfig,
    weights: &crate::model::ModelWeights,
    options: BackendOptions,
    cuda: cuda::CudaOptions,
) -> Result<Box<dyn Backend>, BackendError> {
    let cpu = || -> Result<Box<dyn Backend>, BackendError> {
        Ok(Box::new(cpu::CpuBackend::new(config, weights, options)?))
    };
    match choice {
        BackendChoice::Cpu => cpu(),
        BackendChoice::Cuda => {
            cuda::probe(cuda.device)?;
            Ok(Box::new(cuda::CudaBackend::new(
                config, weights, options, cuda,
            )?))
        }
        BackendChoice::Auto => match cuda::probe(cuda.device) {
            Err(why) => {
                tracing::info!("backend auto: using the CPU ({why})");
                cpu()
            }
            Ok(found) => match cuda::CudaBackend::new(config, weights, options, cuda) {
                Ok(b) => Ok(Box::new(b)),
                Err(BackendError::Unsupported(why)) => {
                    tracing::info!(
                        "backend auto: {found}, but the CUDA backend cannot run this model ({why}); using the CPU"
                    );
                    cpu()
                }
                Err(e) => Err(e),
            },
        },
    }
}

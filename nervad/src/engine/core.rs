//! The engine: admits requests, schedules them in batched steps over the paged KV pool, turns
//! sampled tokens into events.
//!
//! Request life: queued (waiting for sequence slots and KV pages) → prefill (prompt chunks, the
//! primary sequence only) → decode (one token per sample per step) → finished. Each step runs
//! every decoding sample first, then fills the remaining token budget with prefill chunks;
//! queued requests and prefill chunks go least-served client first (deficit round robin by
//! tokens served, [`super::scheduler`]), then by priority.
//!
//! KV pages are taken as sequences grow: a prefill chunk takes the pages its positions need,
//! a decode step the page its next position needs. Admission only checks that the prompt's
//! pages plus one decode page per sample are available beyond what admitted prompts still
//! need to finish their prefill (a watermark, not a reservation). When a sequence needs a page
//! and the pool is dry, the lowest-ranked sequence holding pages is *preempted*
//! ([`super::scheduler`] says who): it leaves its slot, keeping its tokens (prompt + output)
//! and text state, and its KV pages are either
//! - *swapped* ([`super::scheduler::Preemption::Swap`], the default): the pages it alone holds
//!   are copied to the backend's host swap area ([`super::swap_slots`]) and freed; pages it
//!   shares (refcount > 1: a fork's prompt, a prefix another running sequence found in the
//!   cache) stay resident and held, since freeing them would free nothing and they are never
//!   written while shared (copy-on-write). Before it runs again its pages come back: a page it
//!   had that is still cached for the same prefix (full, so never written since, and not
//!   evicted, which would have unregistered it) is taken again without a copy, the others are
//!   copied into fresh pages. The KV bits are exactly those it had. When the host area has no
//!   room for its pages, it is recomputed instead;
//! - or *recomputed* ([`super::scheduler::Preemption::Recompute`]): its pages are freed, and
//!   when it comes back its prefix is prefilled again (no token is sampled or emitted).
//!
//! Either way it comes back before any new request is admitted, best rank first, and decoding
//! goes on from its last sampled token, with the backend's sampling state restored exactly
//! (`resume_sequence`), so its output is what an uninterrupted run gives. Only a request that
//! could never fit the whole pool alone is refused. Ending a swapped request (done, cancelled,
//! its client gone) frees its host slots with its pages.
//!
//! Samples of one request share the prompt's KV pages: the primary prefills all prompt tokens
//! but the last, every other sample then holds the same pages (reference counted), and each
//! sample feeds the last prompt token itself, sampling its own first token from its own random
//! stream. A page a sample must write while others still hold it is copied first
//! (copy-on-write: the partial last prompt page).
//!
//! Every full page is cached for its token prefix once written ([`super::prefix_cache`]): a
//! sequence about to prefill takes the cached pages of its prefix instead of computing them,
//! across requests and clients (a preempted sequence usually finds its own pages again), and
//! a cached page outlives its last holder until the pool needs it. A sequence that samples
//! after its prefill always computes its last prompt position (its logits are needed).
//!
//! After admission nothing on the step path allocates: buffers live in the request and sequence
//! slots, events borrow them.
//!
//! Threading: the engine is `Send` and lives on the server's engine thread; `step` blocks that
//! thread for one backend step (the CPU backend fans out to its own worker pool and returns when
//! the step is done). `submit` tokenizes on the calling thread. When every running sample
//! belongs to a paused client, `step` does nothing and still returns true (work remains).
//!
//! Backpressure isolation: a paused client (its completion ring is full) must not hold batch
//! capacity others need. Its decoding samples are *parked*: each gives its sequence slot back
//! and keeps its KV pages, position, text state and generated ids in a parked record; its
//! queued requests are not admitted. When the client drains (unpaused) a parked sample takes
//! the next free slot before new requests are admitted, and continues from its exact KV state
//! with no token lost or repeated; its sampling state is restored exactly as after a
//! preemption. A parked sample's pages may be taken by preemption while it waits (it then
//! recomputes when resumed). Parking is off the hot path (it may allocate a record once).

mod paging;
mod planning;

use std::collections::{HashMap, VecDeque};
use std::time::Instant;

use super::api::{
    ClientId, EngineEvent, EngineInfo, EventSink, FinishReason, GenerateRequest, InferenceEngine,
    Prompt, RequestError, RequestKey, RequestTimings, SamplingParams, StopConditions,
};
use super::detok::{Pushed, TextStream};
use super::kv_pool::KvPagePool;
use super::ledger::{EMPTY_LEDGER, SampleLedger, StepShare, TokenSeen};
use super::model::EngineModel;
use super::prefix_cache;
use super::scheduler::{FairShare, Preemption, Rank, fair_key};
use crate::backend::sampling::validate_params;
use crate::backend::{Backend, BackendLimits, SampledToken, SeqStep, StepOutput, StepReport};

/// Engine sizes. Defaults suit the CPU backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngineOptions {
    /// Most sequences (samples) running at once; also sequences per step.
    pub max_batch: usize,
    /// Longest sequence served; 0 means the model's `max_position_embeddings`.
    pub max_context: usize,
    /// Bytes for the KV pool.
    pub kv_budget_bytes: usize,
    /// Backend worker threads; 0 means all cores.
    pub threads: usize,
    /// Most tokens per step (decode tokens plus prefill chunks).
    pub max_step_tokens: usize,
    /// Most prompt tokens per step, on top of the decode tokens (still within
    /// `max_step_tokens`); 0: only `max_step_tokens` bounds them.
    pub prefill_chunk: usize,
    /// Tokens per KV page.
    pub page_tokens: usize,
    /// Most requests waiting for admission before `submit` answers `Busy`.
    pub max_queued: usize,
    /// What preemption does with the victim's KV pages.
    pub preemption: Preemption,
    /// Host memory for swapped KV pages (none by default here; the daemon's `--swap-space`
    /// picks a size from the host's memory).
    pub swap: crate::backend::SwapSpace,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            max_batch: 16,
            max_context: 0,
            kv_budget_bytes: 1 << 30,
            threads: 0,
            max_step_tokens: 256,
            prefill_chunk: 0,
            page_tokens: 16,
            max_queued: 1024,
            preemption: Preemption::Swap,
            swap: crate::backend::SwapSpace::None,
        }
    }
}

impl EngineOptions {
    /// The options a backend is built with for `config`.
    pub fn backend_options(
        &self,
        config: &crate::model::ModelConfig,
    ) -> crate::backend::BackendOptions {
        let max_context = if self.max_context == 0 {
            config.max_position_embeddings
        } else {
            self.max_context.min(config.max_position_embeddings)
        };
        crate::backend::BackendOptions {
            max_seqs: self.max_batch.max(1),
            max_step_tokens: self.max_step_tokens.max(self.max_batch).max(1),
            page_tokens: self.page_tokens.max(1),
            kv_budget_bytes: self.kv_budget_bytes,
            max_context,
            threads: self.threads,
            // Without swap preemption the area would never be used: do not take the memory.
            swap: match self.preemption {
                Preemption::Swap => self.swap,
                Preemption::Recompute => crate::backend::SwapSpace::None,
            },
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Queued,
    Prefill,
    Decode,
}

#[derive(Debug)]
struct Request {
    key: RequestKey,
    sampling: SamplingParams,
    max_tokens: u32,
    stop: StopConditions,
    n_samples: u16,
    priority: u8,
    received_at: Instant,
    scheduled_at: Option<Instant>,
    prompt: Vec<u32>,
    phase: Phase,
    /// Order of first admission (kept across preemption): the scheduler's rank.
    stamp: u64,
    /// Sequence slot of each sample.
    slots: Vec<u32>,
    samples_left: u16,
    cancelled: bool,
}

#[derive(Debug)]
struct Sequence {
    active: bool,
    request: usize,
    sample: u16,
    /// Block table (capacity for a full-context sequence).
    table: Vec<u32>,
    /// Positions already in the KV pool.
    len: usize,
    /// Prompt then generated ids: position `i`'s token is `tokens[i]` (prefill chunks and
    /// recompute read it; the sampler's state is rebuilt from it).
    tokens: Vec<u32>,
    prompt_len: usize,
    /// While not decoding: positions to prefill before decoding starts (0 for a sample that
    /// waits for its request's fork).
    prefill_to: usize,
    /// Sample a first token after the last prefill chunk (a fresh single-sample request, not
    /// a recompute, not a fork's primary).
    sample_after_prefill: bool,
    /// Left its slot with its pages freed; its prefix is recomputed when it resumes.
    preempted: bool,
    /// Empty unless swapped out. While swapped, one entry per page of `table`: [`RESIDENT`]
    /// where the sequence still holds `table[i]` (a page it shares), else the host swap slot
    /// holding the page's contents, and `table[i]` is then the page it had (not held; taken
    /// again at swap-in if it is still cached for the same prefix).
    host: Vec<u32>,
    /// Positions its KV held when it was last recomputed (prefill below them is recompute).
    recompute_to: usize,
    /// Leading pages of `table` that are full and cached for their prefix (found there or
    /// registered after being written), and the prefix key through them.
    cached_pages: usize,
    prefix_key: u64,
    /// The token fed at the next decode step.
    input: [u32; 1],
    /// `input` is what this slot sampled last (not a prompt token handed over by a fork).
    input_sampled: bool,
    /// Bumped whenever the slot starts a new sequence.
    epoch: u32,
    decoding: bool,
    generated: u32,
    /// Prompt + output may not exceed this many tokens.
    limit: usize,
    limit_is_context: bool,
    text: TextStream,
    first_token_at: Option<Instant>,
    last_token_at: Option<Instant>,
    /// What the sample's steps and tokens cost (`super::ledger`).
    ledger: SampleLedger,
}

/// A slot index in `Request::slots` for a sample that is parked (no slot).
const PARKED: u32 = u32::MAX;

/// An entry of `Sequence::host` for a page that stayed resident.
const RESIDENT: u32 = u32::MAX;

/// What one batch entry was.
#[derive(Debug, Clone, Copy)]
struct StepEntry {
    slot: u32,
    request: usize,
    /// Prompt tokens in this entry (0 for a decode entry).
    prefill: usize,
    /// The slot's occupancy when the step was launched: a result for an older occupant (a
    /// speculative step of a sequence that finished meanwhile) is discarded.
    epoch: u32,
}

impl Sequence {
    /// An inactive record sized for a full-context sequence.
    fn empty(limits: &BackendLimits, longest_token: usize) -> Self {
        Sequence {
            active: false,
            request: 0,
            sample: 0,
            table: Vec::with_capacity(limits.max_pages_per_seq()),
            len: 0,
            tokens: Vec::with_capacity(limits.max_context),
            prompt_len: 0,
            prefill_to: 0,
            sample_after_prefill: false,
            preempted: false,
            host: Vec::with_capacity(limits.max_pages_per_seq()),
            recompute_to: 0,
            cached_pages: 0,
            prefix_key: prefix_cache::ROOT,
            input: [0],
            input_sampled: false,
            epoch: 0,
            decoding: false,
            generated: 0,
            limit: 0,
            limit_is_context: false,
            text: TextStream::new(&[], longest_token),
            first_token_at: None,
            last_token_at: None,
            ledger: SampleLedger::new(),
        }
    }

    /// Tokens sampled so far.
    fn output(&self) -> &[u32] {
        &self.tokens[self.prompt_len..]
    }

    /// Waiting to prefill (initially, or recomputing after a preemption).
    fn prefilling(&self) -> bool {
        !self.decoding && self.len < self.prefill_to
    }

    /// Its pages are (partly) in the host swap area.
    fn swapped(&self) -> bool {
        !self.host.is_empty()
    }

    /// Holds pages that taking them away could free: any page, or for a swapped sequence
    /// (whose resident pages were shared when it was swapped) one it alone holds now.
    fn holds_freeable(&self, pool: &KvPagePool) -> bool {
        if self.swapped() {
            self.table
                .iter()
                .zip(&self.host)
                .any(|(&page, &slot)| slot == RESIDENT && pool.refs(page) == 1)
        } else {
            !self.table.is_empty()
        }
    }

    /// Pages of its table that are in the host swap area.
    fn pages_on_host(&self) -> usize {
        self.host.iter().filter(|&&h| h != RESIDENT).count()
    }
}

/// Bytes of the weights one decode step reads: all of them (`all`) but an untied input
/// embedding table, of which a step reads only its tokens' rows (a tied one is the LM head,
/// which every step reads whole). The step roofline's weight bytes: counting qwen3-8b's 1.24 GB
/// table put its batch-1 roofline 8% too high.
fn step_weight_bytes(w: &crate::model::ModelWeights, all: u64) -> u64 {
    if tied_head(w) {
        all
    } else {
        all - w.embed_tokens.bytes().len() as u64
    }
}

/// Whether the LM head is the embedding table (the same bytes).
fn tied_head(w: &crate::model::ModelWeights) -> bool {
    std::ptr::eq(w.lm_head.bytes().as_ptr(), w.embed_tokens.bytes().as_ptr())
}

/// Bytes of every tensor of `w` as stored, a tied LM head (same bytes as the embedding) once.
fn model_weight_bytes(w: &crate::model::ModelWeights) -> u64 {
    let mut total = w.embed_tokens.bytes().len() + w.norm.bytes().len();
    if !tied_head(w) {
        total += w.lm_head.bytes().len();
    }
    for l in &w.layers {
        let a = &l.self_attn;
        let m = &l.mlp;
        for lin in [
            &a.q_proj,
            &a.k_proj,
            &a.v_proj,
            &a.o_proj,
            &m.gate_proj,
            &m.up_proj,
            &m.down_proj,
        ] {
            total += lin.weight.bytes().len() + lin.bias.as_ref().map_or(0, |b| b.bytes().len());
        }
        for t in [
            Some(&l.input_layernorm),
            Some(&l.post_attention_layernorm),
            a.q_norm.as_ref(),
            a.k_norm.as_ref(),
        ]
        .into_iter()
        .flatten()
        {
            total += t.bytes().len();
        }
    }
    total as u64
}

/// Tokens per KV page times pages, rounded up.
fn pages_for(tokens: usize, page_tokens: usize) -> usize {
    tokens.div_ceil(page_tokens)
}

/// The inference engine over any [`Backend`].
pub struct Engine {
    name: String,
    config: crate::model::ModelConfig,
    tokens: super::detok::TokenTable,
    eos: Vec<u32>,
    prompts: Box<dyn super::model::PromptEncoder>,
    backend: Box<dyn Backend>,
    backend_name: String,
    /// Bytes of the weights as stored (status displays).
    weight_bytes: u64,
    /// Bytes of the weights one decode step reads (`step_weight_bytes`; the roofline's).
    step_weight_bytes: u64,
    /// Bytes of one token in the backend's KV pool (status displays).
    kv_bytes_per_token: u64,
    /// The device's read bandwidth, bytes/s, once [`Engine::measure_read_bandwidth`] ran.
    read_bandwidth: Option<f64>,
    device: String,
    limits: BackendLimits,
    /// Most prompt tokens per step (`EngineOptions::prefill_chunk`; usize::MAX for no cap).
    prefill_chunk: usize,
    max_queued: usize,
    pool: KvPagePool,
    requests: Vec<Option<Request>>,
    free_requests: Vec<usize>,
    by_key: HashMap<RequestKey, usize>,
    queue: VecDeque<usize>,
    seqs: Vec<Sequence>,
    free_slots: Vec<u32>,
    paused: Vec<ClientId>,
    cancelled: Vec<usize>,
    /// Tokens served per client (fair share across clients).
    fair: FairShare,
    /// Samples without a slot: parked (paused client, pages kept) or preempted (pages freed);
    /// see the module docs.
    parked: Vec<Sequence>,
    /// Inactive sequence records kept for parking without allocating.
    spare: Vec<Sequence>,
    /// Requests admitted so far (the next admission stamp).
    admissions: u64,
    /// Sequences preempted since start.
    preemptions: u64,
    /// Swapping pages to the host and back (`paging`).
    swap: paging::SwapState,
    /// Prefill positions computed again after a recompute preemption, since start.
    recomputed_tokens: u64,
    /// Pages found in the prefix cache instead of being prefilled, since start.
    prefix_hits: u64,
    /// Slots of the step's decoding sequences in rank order (scratch).
    order: Vec<u32>,
    out: StepOutput,
    step_buf: Vec<SeqStep<'static>>,
    entries: Vec<StepEntry>,
    /// Entries of launched, not yet collected steps, oldest first (at most two: the step being
    /// collected and the speculative decode step launched before it).
    launched: [Vec<StepEntry>; 2],
    launched_head: usize,
    launched_len: usize,
    prefill_order: Vec<usize>,
    /// Until when the speculative step waits for a finished request's client to submit its
    /// next one (`FOLLOW_UP_HOLD`); None: no wait.
    hold_until: Option<Instant>,
    /// Holds started and holds a submission ended, since start.
    follow_up_holds: u64,
    follow_ups_caught: u64,
    /// Steps launched ahead of the one in flight, and the chances to do so that were passed
    /// up, by reason (`launch_speculative`).
    launch_ahead: LaunchAhead,
}

/// Why a step was not launched ahead of the one in flight (a step launched after its
/// predecessor was collected leaves the device idle while the host plans it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AheadMiss {
    /// A cancellation, or a queued request a free slot could take, must be handled first.
    Admission,
    /// A prompt outside the step in flight, or a parked sample, waits for the next plan.
    Waiting,
    /// A paused client has work in the step in flight, or a fork is due after it.
    HostState,
    /// The step's tokens would not fit its token budget, or a prompt's next chunk its
    /// prompt-token cap (`EngineOptions::prefill_chunk`).
    Budget,
    /// A write would go into a shared page, or the pool lacks the pages the step needs.
    Pages,
    /// Every sequence of the step in flight may finish in it.
    Finishing,
}

impl AheadMiss {
    /// How many reasons there are.
    pub const COUNT: usize = 6;
    pub const ALL: [AheadMiss; Self::COUNT] = [
        AheadMiss::Admission,
        AheadMiss::Waiting,
        AheadMiss::HostState,
        AheadMiss::Budget,
        AheadMiss::Pages,
        AheadMiss::Finishing,
    ];

    /// The reason's name in `nervactl stats`.
    pub fn name(self) -> &'static str {
        match self {
            AheadMiss::Admission => "admission",
            AheadMiss::Waiting => "waiting",
            AheadMiss::HostState => "host_state",
            AheadMiss::Budget => "budget",
            AheadMiss::Pages => "pages",
            AheadMiss::Finishing => "finishing",
        }
    }
}

/// Counts of `launch_speculative`'s outcomes since start.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LaunchAhead {
    /// Steps launched ahead of the one in flight.
    pub launched: u64,
    /// Chances passed up, indexed like `AheadMiss::ALL`.
    pub missed: [u64; AheadMiss::COUNT],
}

impl LaunchAhead {
    pub fn missed(&self, why: AheadMiss) -> u64 {
        self.missed[why as usize]
    }
}

/// Longest a step launched ahead waits, after a step in which requests finished, for their
/// clients' next requests. Such a client often submits again at once (a closed loop: agents,
/// rollouts, chat turns); a step launched ahead before its request arrives leaves the request
/// two steps to wait instead of one. The device stays busy with the step in flight meanwhile:
/// the wait is also at most half of the last step's device time.
const FOLLOW_UP_HOLD: std::time::Duration = std::time::Duration::from_millis(2);

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("model", &self.name)
            .field("limits", &self.limits)
            .field("in_flight", &self.by_key.len())
            .finish()
    }
}

/// Reuse a vector's allocation for another lifetime (it is emptied first, so no element
/// crosses lifetimes; the in-place collect keeps the buffer).
fn recycle<'b>(mut v: Vec<SeqStep<'_>>) -> Vec<SeqStep<'b>> {
    v.clear();
    v.into_iter()
        .map(|_| unreachable!("emptied above"))
        .collect()
}

impl Engine {
    /// An engine over `backend`, which must have been built for `model`'s config.
    pub fn new(model: EngineModel, backend: Box<dyn Backend>, options: EngineOptions) -> Self {
        let limits = backend.limits();
        let info = backend.info();
        let longest = model.tokens.longest();
        let seqs = (0..limits.max_seqs)
            .map(|_| Sequence::empty(&limits, longest))
            .collect();
        let weight_bytes = model_weight_bytes(&model.weights);
        let step_weight_bytes = step_weight_bytes(&model.weights, weight_bytes);
        match (options.preemption, limits.swap_pages) {
            (Preemption::Recompute, _) => tracing::info!("preemption: recompute"),
            (Preemption::Swap, 0) => {
                tracing::info!("preemption: swap, but no swap area; preempted sequences recompute")
            }
            (Preemption::Swap, pages) => {
                tracing::info!(host_pages = pages, "preemption: swap to the host swap area")
            }
        }
        Engine {
            weight_bytes,
            step_weight_bytes,
            name: model.name,
            config: model.config,
            tokens: model.tokens,
            eos: model.eos_token_ids,
            prompts: model.prompts,
            backend,
            backend_name: info.name,
            kv_bytes_per_token: info.kv_bytes_per_token as u64,
            read_bandwidth: None,
            device: info.device,
            limits,
            prefill_chunk: match options.prefill_chunk {
                0 => usize::MAX,
                n => n,
            },
            max_queued: options.max_queued.max(1),
            pool: KvPagePool::new(limits.num_pages, limits.page_tokens),
            requests: Vec::new(),
            free_requests: Vec::new(),
            by_key: HashMap::new(),
            queue: VecDeque::with_capacity(options.max_queued.max(1)),
            seqs,
            free_slots: (0..limits.max_seqs as u32).rev().collect(),
            paused: Vec::new(),
            cancelled: Vec::new(),
            fair: FairShare::default(),
            parked: Vec::new(),
            spare: Vec::new(),
            admissions: 0,
            preemptions: 0,
            swap: paging::SwapState::new(options.preemption, &limits),
            recomputed_tokens: 0,
            prefix_hits: 0,
            order: Vec::with_capacity(limits.max_seqs),
            out: StepOutput::with_capacity(limits.max_seqs),
            step_buf: Vec::with_capacity(limits.max_seqs),
            launched: [
                Vec::with_capacity(limits.max_seqs),
                Vec::with_capacity(limits.max_seqs),
            ],
            launched_head: 0,
            launched_len: 0,
            entries: Vec::with_capacity(limits.max_seqs),
            prefill_order: Vec::with_capacity(limits.max_seqs),
            hold_until: None,
            follow_up_holds: 0,
            follow_ups_caught: 0,
            launch_ahead: LaunchAhead::default(),
        }
    }

    /// Build the CPU backend for `model` with `options` and an engine over it.
    pub fn with_cpu_backend(
        model: EngineModel,
        options: EngineOptions,
    ) -> Result<Self, crate::backend::BackendError> {
        let backend = crate::backend::cpu::CpuBackend::new(
            &model.config,
            &model.weights,
            options.backend_options(&model.config),
        )?;
        Ok(Engine::new(model, Box::new(backend), options))
    }

    /// Build the backend `choice` names for `model` and an engine over it.
    pub fn with_backend(
        model: EngineModel,
        options: EngineOptions,
        choice: crate::backend::BackendChoice,
        cuda: crate::backend::cuda::CudaOptions,
    ) -> Result<Self, crate::backend::BackendError> {
        let backend = crate::backend::build(
            choice,
            &model.config,
            &model.weights,
            options.backend_options(&model.config),
            cuda,
        )?;
        Ok(Engine::new(model, backend, options))
    }

    /// Sizes the backend was built with.
    pub fn limits(&self) -> BackendLimits {
        self.limits
    }

    /// Measure the device's read bandwidth (bytes/s) once, so [`InferenceEngine::info`]
    /// reports it as the ceiling of a decode step's roofline; `None` on a backend without a
    /// device (the CPU). The daemon calls this at start, before serving: the backend may
    /// stream over its KV pool.
    pub fn measure_read_bandwidth(&mut self) -> Result<Option<f64>, crate::backend::BackendError> {
        debug_assert!(
            self.by_key.is_empty() && self.launched_len == 0,
            "measured while serving"
        );
        self.read_bandwidth = self.backend.read_bandwidth()?;
        Ok(self.read_bandwidth)
    }

    /// Most KV pages held at once since the pool was last empty (see
    /// [`super::api::EngineGauges::kv_pages_peak`]).
    pub fn peak_pages(&self) -> usize {
        self.pool.peak_held()
    }

    /// The backend's cumulative device figures.
    pub fn backend_stats(&self) -> crate::backend::BackendStats {
        self.backend.stats()
    }

    /// KV pages no sequence holds now (free, or cached for their prefix and evictable).
    pub fn free_pages(&self) -> usize {
        self.pool.free()
    }

    /// Sequences preempted (pages swapped out or freed for recompute) since start.
    pub fn preemptions(&self) -> u64 {
        self.preemptions
    }

    /// Launches ahead held for follow-up requests since start, and how many of those holds a
    /// submission ended (`FOLLOW_UP_HOLD`).
    pub fn follow_ups(&self) -> (u64, u64) {
        (self.follow_up_holds, self.follow_ups_caught)
    }

    /// Steps launched ahead of the step in flight since start, and the chances passed up.
    pub fn launch_ahead(&self) -> LaunchAhead {
        self.launch_ahead
    }

    /// Sequences whose pages were swapped out to the host, since start.
    pub fn swap_outs(&self) -> u64 {
        self.swap.outs
    }

    /// Sequences whose pages were swapped back in, since start.
    pub fn swap_ins(&self) -> u64 {
        self.swap.ins
    }

    /// KV pages copied to the host swap area / back into the pool, since start.
    pub fn pages_swapped(&self) -> (u64, u64) {
        (self.swap.pages_out, self.swap.pages_in)
    }

    /// Prefill positions computed again for sequences preempted by recompute, since start.
    pub fn recomputed_tokens(&self) -> u64 {
        self.recomputed_tokens
    }

    /// Sequences waiting with pages in the host swap area now.
    pub fn swapped(&self) -> usize {
        self.parked.iter().filter(|s| s.swapped()).count()
    }

    /// Host swap slots in use now, and in all.
    pub fn host_swap_pages(&self) -> (usize, usize) {
        (self.swap.slots.used(), self.swap.slots.total())
    }

    /// KV pages held by more than one sequence now.
    pub fn shared_pages(&self) -> usize {
        self.pool.shared()
    }

    /// KV pages cached for their prefix that no sequence holds now.
    pub fn cached_pages(&self) -> usize {
        self.pool.cached()
    }

    /// Pages taken from the prefix cache instead of being prefilled, since start.
    pub fn prefix_hits(&self) -> u64 {
        self.prefix_hits
    }

    /// Teacher-forced logits `[tokens, vocab]` of every position of `tokens` (dump and parity
    /// tools). Runs only while no request is in flight; uses the engine's own pool and backend.
    pub fn prompt_logits(&mut self, tokens: &[u32]) -> Result<Vec<f32>, RequestError> {
        if !self.by_key.is_empty() {
            return Err(RequestError::Busy);
        }
        // A speculative step may still be in flight after the last request ended: retire it.
        while self.launched_len > 0 {
            self.collect_oldest(&mut super::api::DiscardEvents);
        }
        if tokens.is_empty() {
            return Err(RequestError::InvalidPrompt("no tokens".into()));
        }
        if tokens.len() > self.limits.max_context {
            return Err(RequestError::TooLong {
                prompt_tokens: tokens.len(),
                limit: self.limits.max_context,
            });
        }
        if let Some(&bad) = tokens
            .iter()
            .find(|&&t| t as usize >= self.config.vocab_size)
        {
            return Err(RequestError::BadToken(bad));
        }
        let mut table = Vec::with_capacity(self.limits.max_pages_per_seq());
        if !self
            .pool
            .take(pages_for(tokens.len(), self.limits.page_tokens), &mut table)
        {
            return Err(RequestError::TooLong {
                prompt_tokens: tokens.len(),
                limit: self.pool.free() * self.limits.page_tokens,
            });
        }
        let result = (|| {
            self.backend
                .start_sequence(0, &SamplingParams::default(), 0, tokens)
                .map_err(|e| RequestError::Backend(e.to_string()))?;
            let mut out = StepOutput::default();
            let mut logits = Vec::with_capacity(tokens.len() * self.config.vocab_size);
            let chunk = self.limits.max_step_tokens;
            for (i, part) in tokens.chunks(chunk).enumerate() {
                let step = SeqStep {
                    slot: 0,
                    tokens: part,
                    start_pos: (i * chunk) as u32,
                    block_table: &table,
                    sample: false,
                    want_logits: true,
                    from_last_sample: false,
                };
                self.backend
                    .step(&[step], &mut out)
                    .map_err(|e| RequestError::Backend(e.to_string()))?;
                logits.extend_from_slice(&out.logits);
            }
            Ok(logits)
        })();
        self.pool.release(&mut table);
        result
    }

    fn context_limit(&self) -> usize {
        self.limits.max_context
    }

    fn tokenize(&self, prompt: &Prompt) -> Result<Vec<u32>, RequestError> {
        let ids = match prompt {
            Prompt::Tokens(ids) => ids.clone(),
            Prompt::Text(text) => self
                .prompts
                .encode(text)
                .map_err(RequestError::InvalidPrompt)?,
            Prompt::Chat(messages) => match self.prompts.encode_chat(messages) {
                None => return Err(RequestError::NoChatTemplate),
                Some(r) => r.map_err(RequestError::InvalidPrompt)?,
            },
        };
        if ids.is_empty() {
            return Err(RequestError::InvalidPrompt("prompt has no tokens".into()));
        }
        if let Some(&bad) = ids.iter().find(|&&t| t as usize >= self.config.vocab_size) {
            return Err(RequestError::BadToken(bad));
        }
        Ok(ids)
    }

    /// Pages a request needs to run to its end alone: (prompt pages its samples share, pages
    /// of each sample beyond them). A request needing more than the pool can never finish and
    /// is refused at submit.
    fn page_need(&self, prompt_len: usize, max_tokens: u32, n: u16) -> (usize, usize) {
        let pt = self.limits.page_tokens;
        let total = (prompt_len + max_tokens as usize).min(self.context_limit());
        let per_sample = pages_for(total, pt);
        if n <= 1 {
            return (0, per_sample);
        }
        let shared = (prompt_len - 1) / pt;
        (shared, per_sample - shared)
    }

    /// Resume samples without a slot, then admit queued requests while slots and pages allow:
    /// least-served client first, then priority, then FIFO ([`super::scheduler`]). Stops at
    /// the first that does not fit so a large request is not starved by small ones behind it,
    /// and admits nothing new while a preempted sample waits.
    fn admit(&mut self, now: Instant, sink: &mut dyn EventSink) {
        let mut backlog = self.prefill_backlog();
        if !self.resume_off_slot(&mut backlog, sink) {
            return;
        }
        while !self.queue.is_empty() {
            let pick = self.pick_queued();
            let Some(qi) = pick else { break };
            let rid = self.queue[qi];
            let Some(req) = self.requests[rid].as_ref() else {
                self.queue.remove(qi);
                continue;
            };
            let n = req.n_samples;
            let prompt_pages = pages_for(req.prompt.len(), self.limits.page_tokens);
            let need = self.admission_pages(req.prompt.len(), req.max_tokens, n);
            if self.free_slots.len() < usize::from(n) || !self.reclaim_paused(backlog + need) {
                break;
            }
            self.queue.remove(qi);
            backlog += prompt_pages;
            if let Err(e) = self.start_request(rid, now) {
                // The backend refused the sequence (should not happen after validation).
                self.fail_request(rid, e, Some(&mut *sink));
            }
        }
    }
    fn pick_queued(&self) -> Option<usize> {
        if let Some(i) = self.queue.iter().position(|&r| self.requests[r].is_none()) {
            return Some(i);
        }
        self.queue
            .iter()
            .enumerate()
            .filter_map(|(i, &r)| Some((i, self.requests[r].as_ref()?)))
            // A paused client's requests wait: admitted, they would hold slots it cannot use.
            .filter(|(_, req)| !self.paused.contains(&req.key.client))
            .min_by_key(|&(i, req)| fair_key(&self.fair, req.key.client, req.priority, i))
            .map(|(i, _)| i)
    }

    fn start_request(&mut self, rid: usize, now: Instant) -> Result<(), RequestError> {
        let limit_ctx = self.context_limit();
        let longest = self.tokens.longest();
        let strip = self.tokens.strip_leading_space();
        let stamp = self.admissions;
        let Some(req) = self.requests[rid].as_mut() else {
            return Ok(());
        };
        self.admissions += 1;
        req.scheduled_at = Some(now);
        req.stamp = stamp;
        let n = usize::from(req.n_samples);
        let prompt_len = req.prompt.len();
        let total = prompt_len + req.max_tokens as usize;
        for sample in 0..n {
            let slot = self.free_slots.pop().unwrap_or_default();
            req.slots.push(slot);
            let seq = &mut self.seqs[slot as usize];
            seq.active = true;
            seq.epoch = seq.epoch.wrapping_add(1);
            seq.request = rid;
            seq.sample = sample as u16;
            seq.len = 0;
            seq.tokens.clear();
            seq.tokens.extend_from_slice(&req.prompt);
            seq.prompt_len = prompt_len;
            // The primary prefills the prompt (all but the last token when it forks); the
            // other samples wait for the fork.
            seq.prefill_to = match (sample, n) {
                (0, 1) => prompt_len,
                (0, _) => prompt_len - 1,
                _ => 0,
            };
            seq.sample_after_prefill = n == 1;
            seq.preempted = false;
            debug_assert!(seq.host.is_empty(), "a free slot holds no swapped record");
            seq.recompute_to = 0;
            seq.cached_pages = 0;
            seq.prefix_key = prefix_cache::ROOT;
            seq.decoding = false;
            seq.generated = 0;
            seq.limit = total.min(limit_ctx);
            seq.limit_is_context = total > limit_ctx;
            seq.text.reset(&req.stop.stop_strings, longest, strip);
            seq.first_token_at = None;
            seq.last_token_at = None;
            seq.table.clear();
            seq.ledger.reset();
        }
        let seed = req.sampling.seed;
        self.backend
            .start_sequence(req.slots[0], &req.sampling, seed, &req.prompt)
            .map_err(|e| RequestError::Backend(e.to_string()))?;
        req.phase = Phase::Prefill;
        if n > 1 && prompt_len == 1 {
            self.fork_samples(rid)?;
        }
        Ok(())
    }

    /// After the primary prefilled all prompt tokens but the last: every other sample holds
    /// the same pages (the partial last one is copied when a sample first writes it) and gets
    /// its own sampling state; all of them start decoding from the last prompt token.
    fn fork_samples(&mut self, rid: usize) -> Result<(), RequestError> {
        let Some(req) = self.requests[rid].as_mut() else {
            return Ok(());
        };
        let p = req.prompt.len() - 1;
        let primary = req.slots[0];
        for (i, &slot) in req.slots.iter().enumerate() {
            if i > 0 {
                for k in 0..self.seqs[primary as usize].table.len() {
                    let page = self.seqs[primary as usize].table[k];
                    self.pool.share(page);
                    self.seqs[slot as usize].table.push(page);
                }
                let (cached, key) = {
                    let p = &self.seqs[primary as usize];
                    (p.cached_pages, p.prefix_key)
                };
                self.seqs[slot as usize].cached_pages = cached;
                self.seqs[slot as usize].prefix_key = key;
                self.backend
                    .fork_sequence(
                        primary,
                        slot,
                        &req.sampling,
                        req.sampling.seed.wrapping_add(i as u64),
                    )
                    .map_err(|e| RequestError::Backend(e.to_string()))?;
            }
            let seq = &mut self.seqs[slot as usize];
            seq.len = p;
            seq.input = [req.prompt[p]];
            seq.input_sampled = false;
            seq.decoding = true;
        }
        req.phase = Phase::Decode;
        Ok(())
    }
    /// Emit `Error` for a request as a whole and forget it (no `Done` follows).
    fn fail_request(&mut self, rid: usize, error: RequestError, sink: Option<&mut dyn EventSink>) {
        if let (Some(sink), Some(req)) = (sink, self.requests[rid].as_ref()) {
            sink.emit(EngineEvent::Error {
                key: req.key,
                error: &error,
            });
        }
        self.remove_request(rid);
    }

    /// Release every resource of a request without events.
    fn remove_request(&mut self, rid: usize) {
        let Some(req) = self.requests[rid].take() else {
            return;
        };
        for &slot in &req.slots {
            if slot == PARKED {
                continue;
            }
            // A sample that ended earlier left its slot number behind; the slot may serve
            // another request by now.
            let seq = &mut self.seqs[slot as usize];
            if seq.active && seq.request == rid {
                seq.active = false;
                self.pool.release(&mut seq.table);
                self.free_slots.push(slot);
            }
        }
        let mut i = 0;
        while i < self.parked.len() {
            if self.parked[i].request == rid {
                let mut seq = self.parked.swap_remove(i);
                seq.active = false;
                Self::release_kv(&mut self.pool, &mut self.swap.slots, &mut seq);
                self.spare.push(seq);
            } else {
                i += 1;
            }
        }
        if let Some(qi) = self.queue.iter().position(|&r| r == rid) {
            self.queue.remove(qi);
        }
        self.by_key.remove(&req.key);
        self.fair.finished(req.key.client);
        self.free_requests.push(rid);
    }

    fn timings(&self, req: &Request, seq: Option<&Sequence>) -> RequestTimings {
        let us = |a: Instant, b: Instant| b.saturating_duration_since(a).as_micros() as u64;
        let mut t = RequestTimings {
            prompt_tokens: req.prompt.len() as u32,
            ..RequestTimings::default()
        };
        if let Some(s) = req.scheduled_at {
            t.queue_us = us(req.received_at, s);
        }
        if let Some(seq) = seq {
            t.generated_tokens = seq.generated;
            if let Some(first) = seq.first_token_at {
                t.first_token_us = us(req.received_at, first);
                if let Some(last) = seq.last_token_at {
                    t.decode_us = us(first, last);
                }
            }
        }
        t
    }

    /// End one sample: flush held text (unless a stop string ended it or it was cancelled),
    /// emit `Done`, release its slot and pages; forget the request after its last sample.
    fn finish_sample(
        &mut self,
        slot: u32,
        reason: FinishReason,
        flush: bool,
        sink: &mut dyn EventSink,
    ) {
        let seq = &mut self.seqs[slot as usize];
        if !seq.active {
            return;
        }
        let rid = seq.request;
        let Some(req) = self.requests[rid].as_ref() else {
            return;
        };
        let key = req.key;
        let sample = seq.sample;
        if flush {
            let n = seq.text.finish();
            if n > 0 {
                sink.emit(EngineEvent::Text {
                    key,
                    sample,
                    text: &seq.text.text()[..n],
                });
            }
        }
        let seq = &self.seqs[slot as usize];
        let timings = self.timings(req, Some(seq));
        sink.emit(EngineEvent::Done {
            key,
            sample,
            reason,
            timings,
            ledger: &seq.ledger,
        });
        let seq = &mut self.seqs[slot as usize];
        seq.active = false;
        seq.decoding = false;
        self.pool.release(&mut seq.table);
        self.free_slots.push(slot);
        self.sample_ended(rid);
    }

    /// Count one ended sample of request `rid`; forget the request after its last. Returns
    /// whether the request is gone.
    fn sample_ended(&mut self, rid: usize) -> bool {
        let done = match self.requests[rid].as_mut() {
            Some(req) => {
                req.samples_left = req.samples_left.saturating_sub(1);
                req.samples_left == 0
            }
            None => false,
        };
        if done {
            self.remove_request(rid);
        }
        done
    }

    /// Cancelled requests: `Done { Cancelled }` for every sample still running (or never
    /// started), then forget them.
    fn process_cancels(&mut self, sink: &mut dyn EventSink) {
        while let Some(rid) = self.cancelled.pop() {
            let Some(req) = self.requests[rid].as_ref() else {
                continue;
            };
            if req.phase == Phase::Queued {
                let key = req.key;
                let timings = self.timings(req, None);
                for sample in 0..req.n_samples {
                    sink.emit(EngineEvent::Done {
                        key,
                        sample,
                        reason: FinishReason::Cancelled,
                        timings,
                        ledger: &EMPTY_LEDGER,
                    });
                }
                self.remove_request(rid);
                continue;
            }
            let n = req.slots.len();
            for i in 0..n {
                let slot = match self.requests[rid].as_ref() {
                    Some(r) => r.slots[i],
                    None => break,
                };
                if slot != PARKED
                    && self.seqs[slot as usize].active
                    && self.seqs[slot as usize].request == rid
                {
                    self.finish_sample(slot, FinishReason::Cancelled, false, sink);
                }
            }
            self.finish_parked(rid, FinishReason::Cancelled, sink);
        }
    }

    /// End every parked sample of request `rid` with `reason` (no text flush: the request is
    /// being cut short), and forget the request after its last sample.
    fn finish_parked(&mut self, rid: usize, reason: FinishReason, sink: &mut dyn EventSink) {
        let mut i = 0;
        while i < self.parked.len() {
            if self.parked[i].request != rid {
                i += 1;
                continue;
            }
            let mut seq = self.parked.swap_remove(i);
            if let Some(req) = self.requests[rid].as_ref() {
                let timings = self.timings(req, Some(&seq));
                sink.emit(EngineEvent::Done {
                    key: req.key,
                    sample: seq.sample,
                    reason,
                    timings,
                    ledger: &seq.ledger,
                });
            }
            seq.active = false;
            Self::release_kv(&mut self.pool, &mut self.swap.slots, &mut seq);
            self.spare.push(seq);
            if self.sample_ended(rid) {
                return;
            }
        }
    }

    /// Park the decoding samples of paused clients: each gives its slot back and keeps its
    /// pages and state in a parked record (module docs).
    fn park_paused(&mut self) {
        if self.paused.is_empty() {
            return;
        }
        for slot in 0..self.seqs.len() {
            let seq = &self.seqs[slot];
            if !seq.active || !seq.decoding {
                continue;
            }
            let rid = seq.request;
            let sample = usize::from(seq.sample);
            let Some(req) = self.requests[rid].as_ref() else {
                continue;
            };
            if !self.paused.contains(&req.key.client) {
                continue;
            }
            let blank = match self.spare.pop() {
                Some(blank) => blank,
                None => Sequence::empty(&self.limits, self.tokens.longest()),
            };
            let seq = std::mem::replace(&mut self.seqs[slot], blank);
            self.parked.push(seq);
            self.free_slots.push(slot as u32);
            if let Some(req) = self.requests[rid].as_mut() {
                req.slots[sample] = PARKED;
            }
        }
    }

    /// Enter a token a step of `batch` entries produced in its sample's ledger, before
    /// `accept_token` acts on it (a stop token ends the sample, and its `Done` carries the
    /// ledger).
    fn note_token(
        &mut self,
        slot: u32,
        token: u32,
        now: Instant,
        report: &StepReport,
        batch: usize,
    ) {
        let seq = &mut self.seqs[slot as usize];
        let Some(req) = self.requests[seq.request].as_ref() else {
            return;
        };
        seq.ledger.token(&TokenSeen {
            token,
            received: req.received_at,
            previous: seq.last_token_at,
            now,
            finished_at: report.finished_at,
            batch,
        });
    }

    /// Handle one sampled token of a decoding sample.
    fn accept_token(
        &mut self,
        slot: u32,
        tok: SampledToken,
        now: Instant,
        sink: &mut dyn EventSink,
    ) {
        let seq = &mut self.seqs[slot as usize];
        let Some(req) = self.requests[seq.request].as_ref() else {
            return;
        };
        if seq.first_token_at.is_none() {
            seq.first_token_at = Some(now);
        }
        seq.last_token_at = Some(now);
        let id = tok.token;
        let is_stop = (!req.stop.ignore_eos && self.eos.contains(&id))
            || req.stop.stop_token_ids.contains(&id);
        if is_stop {
            self.finish_sample(slot, FinishReason::Stop, true, sink);
            return;
        }
        let key = req.key;
        let sample = seq.sample;
        seq.generated += 1;
        seq.input = [id];
        seq.input_sampled = true;
        seq.tokens.push(id);
        sink.emit(EngineEvent::Tokens {
            key,
            sample,
            ids: &seq.input,
            logprobs: std::slice::from_ref(&tok.logprob),
        });
        if tok.top_n > 0 {
            sink.emit(EngineEvent::TopLogprobs {
                key,
                sample,
                ids: tok.top_ids(),
                logprobs: tok.top_logprobs(),
            });
        }
        if !self.tokens.is_special(id) {
            match seq.text.push(self.tokens.token_bytes(id)) {
                Pushed::Emit(n) => {
                    if n > 0 {
                        sink.emit(EngineEvent::Text {
                            key,
                            sample,
                            text: &seq.text.text()[..n],
                        });
                    }
                }
                Pushed::Stop(n) => {
                    if n > 0 {
                        sink.emit(EngineEvent::Text {
                            key,
                            sample,
                            text: &seq.text.text()[..n],
                        });
                    }
                    self.finish_sample(slot, FinishReason::Stop, false, sink);
                    return;
                }
            }
        }
        let total = req.prompt.len() + seq.generated as usize;
        if seq.generated >= req.max_tokens {
            self.finish_sample(slot, FinishReason::Length, true, sink);
        } else if total >= seq.limit {
            let reason = if seq.limit_is_context {
                FinishReason::ContextLength
            } else {
                FinishReason::Length
            };
            self.finish_sample(slot, reason, true, sink);
        }
    }

    /// Remember `self.entries` as the newest launched step, and charge each client the
    /// tokens it is served there.
    fn push_launched(&mut self) {
        for e in &self.entries {
            if let Some(req) = self.requests[e.request].as_ref() {
                self.fair.charge(req.key.client, e.prefill.max(1));
            }
        }
        let at = (self.launched_head + self.launched_len) % self.launched.len();
        self.launched[at].clear();
        self.launched[at].extend_from_slice(&self.entries);
        self.launched_len += 1;
    }

    /// Every request of `self.entries` ends with one Error; the rest go on.
    fn fail_entries(&mut self, error: RequestError, sink: &mut dyn EventSink) {
        for i in 0..self.entries.len() {
            let rid = self.entries[i].request;
            if self.requests[rid].is_some() {
                self.fail_request(rid, error.clone(), Some(sink));
            }
        }
    }

    /// Collect the oldest launched step and hand its tokens to their sequences; results of a
    /// slot's previous occupant (a speculative step after it finished) are dropped.
    fn collect_oldest(&mut self, sink: &mut dyn EventSink) {
        let head = self.launched_head;
        self.launched_head = (head + 1) % self.launched.len();
        self.launched_len -= 1;
        self.entries.clear();
        let taken = std::mem::take(&mut self.launched[head]);
        self.entries.extend_from_slice(&taken);
        self.launched[head] = taken;
        if let Err(e) = self.backend.collect(&mut self.out) {
            self.fail_entries(RequestError::Backend(e.to_string()), sink);
            return;
        }
        let now = Instant::now();
        let report = self.out.report;
        let batch = self.entries.len();
        let requests_before = self.by_key.len();
        for i in 0..self.entries.len() {
            let entry = self.entries[i];
            let current = {
                let seq = &self.seqs[entry.slot as usize];
                seq.active && seq.epoch == entry.epoch && seq.request == entry.request
            };
            if !current {
                continue;
            }
            self.seqs[entry.slot as usize]
                .ledger
                .charge(&StepShare::split(&report, i, batch));
            let sampled = self.out.samples.get(i).copied().flatten();
            if entry.prefill > 0 {
                let seq = &mut self.seqs[entry.slot as usize];
                let again = seq.recompute_to.min(seq.len + entry.prefill);
                self.recomputed_tokens += again.saturating_sub(seq.len) as u64;
                seq.len += entry.prefill;
                let done = seq.len == seq.prefill_to;
                self.register_full_pages(entry.slot);
                if done {
                    // The token a fresh request samples after its prompt enters the ledger
                    // before `prefill_done` hands it to `accept_token`.
                    if let Some(tok) = sampled
                        && self.seqs[entry.slot as usize].sample_after_prefill
                    {
                        self.note_token(entry.slot, tok.token, now, &report, batch);
                    }
                    self.prefill_done(entry.slot, sampled, now, sink);
                }
            } else {
                self.seqs[entry.slot as usize].len += 1;
                self.register_full_pages(entry.slot);
                if let Some(tok) = sampled {
                    self.note_token(entry.slot, tok.token, now, &report, batch);
                    self.accept_token(entry.slot, tok, now, sink);
                }
            }
        }
        // Requests ended and a step is still in flight: hold the next launch ahead briefly for
        // their clients' next requests (`FOLLOW_UP_HOLD`).
        let hold = FOLLOW_UP_HOLD.min(std::time::Duration::from_nanos(report.gpu_ns / 2));
        self.hold_until =
            (self.by_key.len() < requests_before && self.launched_len == 1 && !hold.is_zero())
                .then(|| now + hold);
        self.follow_up_holds += u64::from(self.hold_until.is_some());
    }

    /// `slot` prefilled all it had to: a fork's primary forks its request's samples; any other
    /// sequence decodes, from the token it sampled after its prompt (a fresh request) or from
    /// its last sampled token (a recompute, which samples nothing).
    fn prefill_done(
        &mut self,
        slot: u32,
        sampled: Option<SampledToken>,
        now: Instant,
        sink: &mut dyn EventSink,
    ) {
        let seq = &mut self.seqs[slot as usize];
        let rid = seq.request;
        let Some(req) = self.requests[rid].as_mut() else {
            return;
        };
        if req.phase == Phase::Prefill && req.n_samples > 1 {
            if let Err(e) = self.fork_samples(rid) {
                self.fail_request(rid, e, Some(sink));
            }
            return;
        }
        req.phase = Phase::Decode;
        seq.decoding = true;
        if std::mem::take(&mut seq.sample_after_prefill)
            && let Some(tok) = sampled
        {
            self.accept_token(slot, tok, now, sink);
        }
    }
}

impl InferenceEngine for Engine {
    fn submit(&mut self, request: GenerateRequest) -> Result<(), RequestError> {
        if self.by_key.contains_key(&request.key) {
            return Err(RequestError::DuplicateTag);
        }
        if self.queue.len() >= self.max_queued {
            return Err(RequestError::Busy);
        }
        if request.n_samples == 0 {
            return Err(RequestError::InvalidParameter("n_samples"));
        }
        if usize::from(request.n_samples) > self.limits.max_seqs {
            return Err(RequestError::TooManySamples {
                asked: request.n_samples,
                max_batch: self.limits.max_seqs,
            });
        }
        if request.max_tokens == 0 {
            return Err(RequestError::InvalidParameter("max_tokens must be > 0"));
        }
        validate_params(&request.sampling).map_err(RequestError::InvalidParameter)?;
        if request.stop.stop_strings.iter().any(String::is_empty) {
            return Err(RequestError::InvalidParameter(
                "stop strings must not be empty",
            ));
        }
        let prompt = self.tokenize(&request.prompt)?;
        let ctx = self.context_limit();
        if prompt.len() >= ctx {
            return Err(RequestError::TooLong {
                prompt_tokens: prompt.len(),
                limit: ctx - 1,
            });
        }
        let (shared, own) = self.page_need(prompt.len(), request.max_tokens, request.n_samples);
        let need = shared + own * usize::from(request.n_samples);
        if need > self.pool.total() {
            return Err(RequestError::TooLong {
                prompt_tokens: prompt.len(),
                limit: self.pool.total() * self.limits.page_tokens / usize::from(request.n_samples),
            });
        }
        let req = Request {
            key: request.key,
            sampling: request.sampling,
            max_tokens: request.max_tokens,
            stop: request.stop,
            n_samples: request.n_samples,
            priority: request.priority,
            received_at: request.received_at,
            scheduled_at: None,
            prompt,
            phase: Phase::Queued,
            stamp: 0,
            slots: Vec::with_capacity(usize::from(request.n_samples)),
            samples_left: request.n_samples,
            cancelled: false,
        };
        let rid = match self.free_requests.pop() {
            Some(rid) => {
                self.requests[rid] = Some(req);
                rid
            }
            None => {
                self.requests.push(Some(req));
                self.requests.len() - 1
            }
        };
        self.by_key.insert(request.key, rid);
        self.fair.submitted(request.key.client);
        self.queue.push_back(rid);
        Ok(())
    }

    fn cancel(&mut self, key: RequestKey) {
        if let Some(&rid) = self.by_key.get(&key)
            && let Some(req) = self.requests[rid].as_mut()
            && !req.cancelled
        {
            req.cancelled = true;
            self.cancelled.push(rid);
        }
    }

    fn drop_client(&mut self, client: ClientId) {
        let rids: Vec<usize> = self
            .by_key
            .iter()
            .filter(|(k, _)| k.client == client)
            .map(|(_, &r)| r)
            .collect();
        for rid in rids {
            self.remove_request(rid);
        }
        self.cancelled.retain(|&r| self.requests[r].is_some());
        self.paused.retain(|&c| c != client);
        self.fair.forget(client);
    }

    fn set_paused(&mut self, client: ClientId, paused: bool) {
        let at = self.paused.iter().position(|&c| c == client);
        match (paused, at) {
            (true, None) => self.paused.push(client),
            (false, Some(i)) => {
                self.paused.swap_remove(i);
            }
            _ => {}
        }
    }

    fn step(&mut self, sink: &mut dyn EventSink) -> bool {
        if self.launched_len > 0 {
            // A step is in flight: launch the next decode step first when it can be formed
            // without that step's tokens (they stay on the device), then learn them.
            if self.launched_len == 1 {
                if let Some(until) = self.hold_until.take()
                    && Instant::now() < until
                {
                    if self.queue.is_empty() {
                        self.hold_until = Some(until);
                        return true;
                    }
                    self.follow_ups_caught += 1;
                }
                self.launch_speculative(sink);
            }
            self.collect_oldest(sink);
            // Planning waits for the next call: the caller first passes in what arrived while
            // this one waited for the device (a submission planned now would wait a whole step
            // more).
            return true;
        }
        let now = Instant::now();
        self.process_cancels(sink);
        self.park_paused();
        self.admit(now, sink);
        self.plan_step(sink);

        match self.launch_entries(None) {
            Err(e) => {
                let error = RequestError::Backend(e.to_string());
                self.fail_entries(error, sink);
            }
            Ok(false) => {}
            Ok(true) => {
                self.push_launched();
                // On a backend that overlaps the step stays in flight: the next call launches
                // its successor before collecting it when it can (`launch_speculative`).
                if !self.backend.overlaps() {
                    self.collect_oldest(sink);
                }
            }
        }
        !self.by_key.is_empty() || self.launched_len > 0
    }
    fn finish_all(&mut self, reason: FinishReason, sink: &mut dyn EventSink) {
        for rid in 0..self.requests.len() {
            let Some(req) = self.requests[rid].as_ref() else {
                continue;
            };
            if req.phase == Phase::Queued {
                let key = req.key;
                let timings = self.timings(req, None);
                for sample in 0..req.n_samples {
                    sink.emit(EngineEvent::Done {
                        key,
                        sample,
                        reason,
                        timings,
                        ledger: &EMPTY_LEDGER,
                    });
                }
                self.remove_request(rid);
                continue;
            }
            for i in 0..req.slots.len() {
                let slot = match self.requests[rid].as_ref() {
                    Some(r) => r.slots[i],
                    None => break,
                };
                if slot != PARKED
                    && self.seqs[slot as usize].active
                    && self.seqs[slot as usize].request == rid
                {
                    self.finish_sample(slot, reason, false, sink);
                }
            }
            self.finish_parked(rid, reason, sink);
        }
        self.cancelled.clear();
    }

    fn info(&self) -> EngineInfo {
        EngineInfo {
            model: self.name.clone(),
            architecture: format!("{:?}", self.config.architecture),
            backend: self.backend_name.clone(),
            device: self.device.clone(),
            dtype: self.config.dtype.name().to_owned(),
            vocab_size: self.config.vocab_size as u32,
            max_batch: self.limits.max_seqs as u32,
            max_context: self.limits.max_context as u32,
            kv_pages_total: self.limits.num_pages as u32,
            kv_page_tokens: self.limits.page_tokens as u32,
            weight_bytes: self.weight_bytes,
            step_weight_bytes: self.step_weight_bytes,
            kv_bytes_per_token: self.kv_bytes_per_token,
            read_bandwidth_bytes_per_s: self.read_bandwidth,
        }
    }

    fn in_flight(&self) -> usize {
        self.by_key.len()
    }

    fn hold_until(&self) -> Option<Instant> {
        self.hold_until
            .filter(|&until| self.launched_len == 1 && Instant::now() < until)
    }

    fn publish(&self, g: &super::api::EngineGauges) {
        use std::sync::atomic::Ordering::{Relaxed, Release};
        let total = self.limits.num_pages as u64;
        g.kv_pages_total.store(total, Relaxed);
        g.kv_pages_peak.store(self.pool.peak_held() as u64, Relaxed);
        // SYNC POINT with the Acquire loads of kv_pages_used in the admin replies: whoever sees
        // this step's pages in use sees its peak too (stored above).
        g.kv_pages_used
            .store(total.saturating_sub(self.pool.free() as u64), Release);
        g.running.store(
            self.seqs.iter().filter(|s| s.active).count() as u64,
            Relaxed,
        );
        g.queued.store(self.queue.len() as u64, Relaxed);
        let preempted = self.parked.iter().filter(|s| s.preempted).count() as u64;
        let swapped = self.swapped() as u64;
        g.parked
            .store(self.parked.len() as u64 - preempted - swapped, Relaxed);
        g.preempted.store(preempted, Relaxed);
        g.preemptions.store(self.preemptions, Relaxed);
        g.follow_up_holds.store(self.follow_up_holds, Relaxed);
        g.follow_ups_caught.store(self.follow_ups_caught, Relaxed);
        g.launched_ahead.store(self.launch_ahead.launched, Relaxed);
        for (slot, n) in g.ahead_missed.iter().zip(self.launch_ahead.missed) {
            slot.store(n, Relaxed);
        }
        g.swapped.store(swapped, Relaxed);
        g.swap_outs.store(self.swap.outs, Relaxed);
        g.swap_ins.store(self.swap.ins, Relaxed);
        g.swap_pages_used
            .store(self.swap.slots.used() as u64, Relaxed);
        g.swap_pages_total
            .store(self.swap.slots.total() as u64, Relaxed);
        g.kv_pages_shared.store(self.pool.shared() as u64, Relaxed);
        g.kv_pages_cached.store(self.pool.cached() as u64, Relaxed);
        g.prefix_hit_pages.store(self.prefix_hits, Relaxed);
        // Never wait for an admin reply reading the table: the next step publishes again.
        if let Ok(mut rows) = g.client_tokens.try_lock() {
            rows.clear();
            rows.extend(
                self.fair
                    .served()
                    .map(|(client, tokens)| super::api::ClientTokens { client, tokens }),
            );
        }
        let d = self.backend.stats();
        g.steps.store(d.steps, Relaxed);
        g.graph_steps.store(d.graph_steps, Relaxed);
        g.launches.store(d.launches, Relaxed);
        g.graph_nodes.store(d.graph_nodes, Relaxed);
        g.hard_syncs.store(d.hard_syncs, Relaxed);
        g.policy_syncs.store(d.policy_syncs, Relaxed);
        g.debug_syncs.store(d.debug_syncs, Relaxed);
        g.h2d_bytes.store(d.h2d_bytes, Relaxed);
        g.d2h_bytes.store(d.d2h_bytes, Relaxed);
        g.device_allocs.store(d.device_allocs, Relaxed);
        g.pinned_allocs.store(d.pinned_allocs, Relaxed);
        g.gpu_us.store((d.gpu_ms * 1e3) as u64, Relaxed);
    }
}

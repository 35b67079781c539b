//! The contract between the server (poll loop, client segments) and an inference engine.
//!
//! The server owns the engine on an engine thread: it hands over validated requests, cancels,
//! pauses clients whose completion ring is full, and calls [`InferenceEngine::step`] in a loop.
//! Events borrow from the engine's buffers, so emitting one allocates nothing; the sink copies
//! what it needs into completion rings.

use std::time::Instant;

/// A connected client inside the daemon: a slot index plus a generation so a reused slot never
/// receives a previous occupant's events.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ClientId {
    /// Index into the server's client table.
    pub slot: u32,
    /// Bumped every time the slot is reused.
    pub generation: u32,
}

/// A request is named by its client and the client's own 64-bit tag.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RequestKey {
    /// Who asked.
    pub client: ClientId,
    /// The client's tag, echoed on every event.
    pub tag: u64,
}

/// What to continue from.
#[derive(Debug, Clone, PartialEq)]
pub enum Prompt {
    /// UTF-8 text, tokenized with the model's tokenizer (special tokens added as the
    /// tokenizer's post-processor says).
    Text(String),
    /// Token ids, used as given.
    Tokens(Vec<u32>),
    /// A JSON array of `{"role": ..., "content": ...}` messages rendered through the model's
    /// chat template with the generation prompt appended.
    Chat(String),
}

/// Per-request sampling: the backend contract's type (see [`crate::backend::SamplingParams`]).
pub use crate::backend::SamplingParams;

/// When to stop besides `max_tokens` and the context length.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StopConditions {
    /// Stop (and do not emit) on any of these ids, in addition to the model's eos ids.
    pub stop_token_ids: Vec<u32>,
    /// Stop when the output text contains one of these (matched across token boundaries);
    /// the matched string is not emitted.
    pub stop_strings: Vec<String>,
    /// Keep going past the model's eos ids.
    pub ignore_eos: bool,
}

/// A validated generation request.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerateRequest {
    /// Who and which.
    pub key: RequestKey,
    /// Input.
    pub prompt: Prompt,
    /// Sampling parameters.
    pub sampling: SamplingParams,
    /// Most tokens to generate per sample.
    pub max_tokens: u32,
    /// Stop conditions.
    pub stop: StopConditions,
    /// Independent samples sharing the prompt (each with seed `seed + index`).
    pub n_samples: u16,
    /// Higher runs first among this client's requests (across clients the fair share of
    /// tokens served decides first), and is preempted last when KV pages run out.
    pub priority: u8,
    /// When the server read the descriptor (for queue-time accounting).
    pub received_at: Instant,
}

impl GenerateRequest {
    /// A greedy request that runs exactly `max_tokens` tokens (eos ignored, no stop condition):
    /// one sample, priority 0, received now. What benchmarks, dumps and tests submit.
    pub fn fixed_length(key: RequestKey, prompt: Prompt, max_tokens: u32) -> Self {
        GenerateRequest {
            key,
            prompt,
            sampling: SamplingParams::default(),
            max_tokens,
            stop: StopConditions {
                ignore_eos: true,
                ..StopConditions::default()
            },
            n_samples: 1,
            priority: 0,
            received_at: Instant::now(),
        }
    }
}

/// Why a sample ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// An eos id, a stop token id or a stop string.
    Stop,
    /// `max_tokens` reached.
    Length,
    /// The model's context length reached.
    ContextLength,
    /// Cancelled by the client (or its disconnection).
    Cancelled,
    /// The engine failed this request.
    Error,
    /// The daemon is shutting down.
    Shutdown,
}

/// Why a request was refused or failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    /// The prompt is empty, does not tokenize, or the chat messages are malformed.
    #[error("invalid prompt: {0}")]
    InvalidPrompt(String),
    /// The prompt leaves no room to generate in the context (or cannot fit the KV pool). A
    /// `max_tokens` beyond the context is not refused: generation stops at the context
    /// (`FinishReason::ContextLength`). The message fits a completion's 44-byte detail.
    #[error("prompt {prompt_tokens} tokens > limit {limit}")]
    TooLong {
        /// Tokens in the prompt.
        prompt_tokens: usize,
        /// The limit it exceeded.
        limit: usize,
    },
    /// A token id is not in the vocabulary.
    #[error("token id {0} is outside the vocabulary")]
    BadToken(u32),
    /// A sampling parameter is out of range.
    #[error("invalid parameter: {0}")]
    InvalidParameter(&'static str),
    /// More samples than the engine runs at once (`--max-batch`).
    #[error("n_samples {asked} > max batch {max_batch}")]
    TooManySamples {
        /// Samples asked for.
        asked: u16,
        /// The engine's batch size.
        max_batch: usize,
    },
    /// The same tag is already in flight for this client.
    #[error("tag already in flight")]
    DuplicateTag,
    /// The engine cannot take more requests right now.
    #[error("engine is at capacity")]
    Busy,
    /// The model has no chat template but a chat prompt was given.
    #[error("model has no chat template")]
    NoChatTemplate,
    /// Backend failure.
    #[error("backend error: {0}")]
    Backend(String),
}

/// Per-request timings, in microseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RequestTimings {
    /// Received → first scheduled.
    pub queue_us: u64,
    /// Received → first token.
    pub first_token_us: u64,
    /// First token → last token.
    pub decode_us: u64,
    /// Prompt tokens processed.
    pub prompt_tokens: u32,
    /// Tokens generated (this sample).
    pub generated_tokens: u32,
}

/// What the engine reports. Borrowed slices are valid only during the `emit` call.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum EngineEvent<'a> {
    /// Newly generated token ids of one sample (stop tokens excluded).
    Tokens {
        /// Request.
        key: RequestKey,
        /// Sample index.
        sample: u16,
        /// Ids in order.
        ids: &'a [u32],
        /// Log-probability of each id (same length as `ids`).
        logprobs: &'a [f32],
    },
    /// Top-n alternatives for the token just emitted (only when `top_logprobs > 0`).
    TopLogprobs {
        /// Request.
        key: RequestKey,
        /// Sample index.
        sample: u16,
        /// Alternative ids, most likely first.
        ids: &'a [u32],
        /// Their log-probabilities.
        logprobs: &'a [f32],
    },
    /// Newly decoded text of one sample; always whole UTF-8 code points.
    Text {
        /// Request.
        key: RequestKey,
        /// Sample index.
        sample: u16,
        /// The piece.
        text: &'a str,
    },
    /// One sample finished; exactly one per sample of every accepted request.
    Done {
        /// Request.
        key: RequestKey,
        /// Sample index.
        sample: u16,
        /// Why.
        reason: FinishReason,
        /// Timings.
        timings: RequestTimings,
        /// What each of the sample's tokens cost ([`super::ledger`]); the empty ledger for an
        /// engine that keeps none.
        ledger: &'a super::ledger::SampleLedger,
    },
    /// The request failed as a whole (no `Done` follows).
    Error {
        /// Request.
        key: RequestKey,
        /// What went wrong.
        error: &'a RequestError,
    },
}

/// Receives engine events.
pub trait EventSink {
    /// Take one event. Must not block.
    fn emit(&mut self, event: EngineEvent<'_>);
}

/// What `nervactl status` shows about the engine.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineInfo {
    /// Model name or path.
    pub model: String,
    /// Architecture name.
    pub architecture: String,
    /// `cpu`, `cuda`, or `test`.
    pub backend: String,
    /// Device description (CPU model and threads, GPU name).
    pub device: String,
    /// Storage dtype of the weights (`bf16`, `f16`, `f32`; `none` without a model).
    pub dtype: String,
    /// Vocabulary size (ids `0..vocab_size` are valid prompt tokens).
    pub vocab_size: u32,
    /// Most sequences (samples) running at once (`--max-batch`).
    pub max_batch: u32,
    /// Context length served.
    pub max_context: u32,
    /// KV pool pages in total.
    pub kv_pages_total: u32,
    /// Tokens per KV page.
    pub kv_page_tokens: u32,
    /// Bytes of the model's weights as stored (a tied LM head counted once).
    pub weight_bytes: u64,
    /// Bytes of the weights one decode step reads: `weight_bytes` less an untied input
    /// embedding table, of which a step reads only its tokens' rows (a step roofline's weight
    /// bytes).
    pub step_weight_bytes: u64,
    /// Bytes one token takes in the KV pool (all layers, K and V); 0 without a KV pool.
    pub kv_bytes_per_token: u64,
    /// The device's streaming read bandwidth, bytes per second, measured once at start (the
    /// ceiling of a decode step's roofline); `None` where nothing was measured (the CPU).
    pub read_bandwidth_bytes_per_s: Option<f64>,
}

/// An inference engine driven by the server's engine thread.
pub trait InferenceEngine: Send {
    /// Admit a request. Refusals come back as errors here (the server turns them into an error
    /// completion); once accepted, the request ends with `Done` per sample or one `Error`.
    fn submit(&mut self, request: GenerateRequest) -> Result<(), RequestError>;
    /// Cancel one request; its samples end with `Done { reason: Cancelled }` on the next step.
    fn cancel(&mut self, key: RequestKey);
    /// Drop every request of a client that went away. No events are emitted for them.
    fn drop_client(&mut self, client: ClientId);
    /// Pause or resume a client's sequences (its completion ring is full / has room again).
    fn set_paused(&mut self, client: ClientId, paused: bool);
    /// Run one scheduling step and emit what it produced. Returns true while work remains.
    fn step(&mut self, sink: &mut dyn EventSink) -> bool;
    /// End every request with `reason` (shutdown).
    fn finish_all(&mut self, reason: FinishReason, sink: &mut dyn EventSink);
    /// Static facts for status displays.
    fn info(&self) -> EngineInfo;
    /// Number of requests admitted and not yet finished.
    fn in_flight(&self) -> usize;
    /// While `step` has work it is holding back for a command that may arrive (a finished
    /// request's client submitting its next), when it stops waiting: the caller may sleep until
    /// then or the next command instead of calling `step` again at once.
    fn hold_until(&self) -> Option<Instant> {
        None
    }

    /// Store the engine's live figures (KV pages, scheduler counts, the backend's device
    /// ledger) into `gauges`; the engine thread calls this after every step, admin replies read
    /// it from the poll thread.
    fn publish(&self, gauges: &EngineGauges) {
        let _ = gauges;
    }
}

/// A sink that drops every event (retiring steps whose results nobody waits for).
#[derive(Debug, Default, Clone, Copy)]
pub struct DiscardEvents;

impl EventSink for DiscardEvents {
    fn emit(&mut self, _: EngineEvent<'_>) {}
}

/// One client's tokens served, for [`EngineGauges::client_tokens`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientTokens {
    /// The client.
    pub client: ClientId,
    /// Prefill and decode tokens computed for it since it connected.
    pub tokens: u64,
}

/// Live engine figures, published by the engine thread after each step with relaxed stores and
/// read by admin replies (a snapshot, not a transaction: each figure is individually current).
#[derive(Debug, Default)]
pub struct EngineGauges {
    /// KV pages in use (held by running, parked or forked sequences). Stored last of the
    /// KV figures, with Release: a reader that loads it with Acquire sees the
    /// `kv_pages_peak` of the same step or a later one.
    pub kv_pages_used: std::sync::atomic::AtomicU64,
    /// Most KV pages held at once since the pool was last empty: the high-water mark of the
    /// current busy period, or of the last one while no page is held (a busy period starts when
    /// a page is taken from a pool that held none). Exact: counted at each page taken, not
    /// sampled at publication.
    pub kv_pages_peak: std::sync::atomic::AtomicU64,
    /// KV pages in the pool.
    pub kv_pages_total: std::sync::atomic::AtomicU64,
    /// Sequences holding a batch slot.
    pub running: std::sync::atomic::AtomicU64,
    /// Requests waiting for admission.
    pub queued: std::sync::atomic::AtomicU64,
    /// Samples of paused clients parked without a slot.
    pub parked: std::sync::atomic::AtomicU64,
    /// Samples preempted (KV pages freed) waiting to resume and recompute their prefix.
    pub preempted: std::sync::atomic::AtomicU64,
    /// Preemptions since start.
    pub preemptions: std::sync::atomic::AtomicU64,
    /// Launches ahead held for a finished request's client to submit again, since start.
    pub follow_up_holds: std::sync::atomic::AtomicU64,
    /// Of those, holds that a submission ended (it joined the next step).
    pub follow_ups_caught: std::sync::atomic::AtomicU64,
    /// Steps launched ahead of the step in flight, since start.
    pub launched_ahead: std::sync::atomic::AtomicU64,
    /// Chances to launch ahead passed up, since start, by `AheadMiss::ALL` reason.
    pub ahead_missed: [std::sync::atomic::AtomicU64; super::core::AheadMiss::COUNT],
    /// Samples preempted with their KV pages in the host swap area, waiting to swap back in.
    pub swapped: std::sync::atomic::AtomicU64,
    /// Sequences swapped out to the host since start.
    pub swap_outs: std::sync::atomic::AtomicU64,
    /// Sequences swapped back in since start.
    pub swap_ins: std::sync::atomic::AtomicU64,
    /// Host swap area pages holding swapped KV pages now.
    pub swap_pages_used: std::sync::atomic::AtomicU64,
    /// Pages the host swap area holds (0: no swap area).
    pub swap_pages_total: std::sync::atomic::AtomicU64,
    /// KV pages held by more than one sequence (forked samples, shared prefixes).
    pub kv_pages_shared: std::sync::atomic::AtomicU64,
    /// KV pages cached for their prefix that no sequence holds (counted free: the pool
    /// reuses them, least recently used first, when nothing else is free).
    pub kv_pages_cached: std::sync::atomic::AtomicU64,
    /// KV pages taken from the prefix cache instead of being prefilled, since start.
    pub prefix_hit_pages: std::sync::atomic::AtomicU64,
    /// Tokens served (prefill + decode, since it connected) per client with requests in
    /// flight, as the fair-share scheduler counts them.
    /// The engine thread only `try_lock`s it (a reader holding it delays an update by a step,
    /// it never blocks the engine).
    pub client_tokens: std::sync::Mutex<Vec<ClientTokens>>,
    /// The backend's cumulative device ledger.
    pub steps: std::sync::atomic::AtomicU64,
    /// Steps that replayed a captured graph.
    pub graph_steps: std::sync::atomic::AtomicU64,
    /// Plain kernel launches.
    pub launches: std::sync::atomic::AtomicU64,
    /// Kernel nodes replayed through graphs.
    pub graph_nodes: std::sync::atomic::AtomicU64,
    /// Host waits the step results needed.
    pub hard_syncs: std::sync::atomic::AtomicU64,
    /// Waits a policy asked for (logits for dumps, the device clock's anchor).
    pub policy_syncs: std::sync::atomic::AtomicU64,
    /// Waits only a debugging setting asked for.
    pub debug_syncs: std::sync::atomic::AtomicU64,
    /// Bytes copied host → device.
    pub h2d_bytes: std::sync::atomic::AtomicU64,
    /// Bytes copied device → host.
    pub d2h_bytes: std::sync::atomic::AtomicU64,
    /// Device allocations since start (the arena is one).
    pub device_allocs: std::sync::atomic::AtomicU64,
    /// Pinned host allocations since start.
    pub pinned_allocs: std::sync::atomic::AtomicU64,
    /// Device time of all steps, µs.
    pub gpu_us: std::sync::atomic::AtomicU64,
}

impl EngineGauges {
    /// The figures as JSON (`status` and `stats` replies).
    pub fn to_json(&self) -> serde_json::Value {
        use std::sync::atomic::Ordering::{Acquire, Relaxed};
        // SYNC POINT with the Release store of kv_pages_used in `publish`: the peak read after
        // it is at least that step's.
        let used = self.kv_pages_used.load(Acquire);
        let peak = self.kv_pages_peak.load(Relaxed);
        let total = self.kv_pages_total.load(Relaxed);
        let swap_used = self.swap_pages_used.load(Relaxed);
        let swap_total = self.swap_pages_total.load(Relaxed);
        let steps = self.steps.load(Relaxed);
        let per_step = |v: u64| {
            if steps > 0 {
                v as f64 / steps as f64
            } else {
                0.0
            }
        };
        let clients: Vec<serde_json::Value> = match self.client_tokens.lock() {
            Ok(rows) => {
                let all: u64 = rows.iter().map(|r| r.tokens).sum();
                rows.iter()
                    .map(|r| {
                        serde_json::json!({
                            "slot": r.client.slot,
                            "generation": r.client.generation,
                            "tokens": r.tokens,
                            "share": if all > 0 { r.tokens as f64 / all as f64 } else { 0.0 },
                        })
                    })
                    .collect()
            }
            Err(_) => Vec::new(),
        };
        serde_json::json!({
            "kv_pages_used": used,
            "kv_pages_free": total.saturating_sub(used),
            "kv_pages_peak": peak,
            "kv_pages_shared": self.kv_pages_shared.load(Relaxed),
            "kv_pages_cached": self.kv_pages_cached.load(Relaxed),
            "prefix_hit_pages": self.prefix_hit_pages.load(Relaxed),
            "running": self.running.load(Relaxed),
            "queued": self.queued.load(Relaxed),
            "parked": self.parked.load(Relaxed),
            "preempted": self.preempted.load(Relaxed),
            "preemptions": self.preemptions.load(Relaxed),
            "follow_up_holds": self.follow_up_holds.load(Relaxed),
            "follow_ups_caught": self.follow_ups_caught.load(Relaxed),
            "launched_ahead": self.launched_ahead.load(Relaxed),
            "ahead_missed": super::core::AheadMiss::ALL
                .iter()
                .zip(&self.ahead_missed)
                .map(|(why, n)| (why.name().to_owned(), serde_json::json!(n.load(Relaxed))))
                .collect::<serde_json::Map<_, _>>(),
            "swapped": self.swapped.load(Relaxed),
            "swap_outs": self.swap_outs.load(Relaxed),
            "swap_ins": self.swap_ins.load(Relaxed),
            "swap_pages_used": swap_used,
            "swap_pages_free": swap_total.saturating_sub(swap_used),
            "client_tokens": clients,
            "device": {
                "steps": steps,
                "graph_steps": self.graph_steps.load(Relaxed),
                "launches": self.launches.load(Relaxed),
                "graph_nodes": self.graph_nodes.load(Relaxed),
                "graph_nodes_per_step": per_step(self.graph_nodes.load(Relaxed)),
                "launches_per_step": per_step(self.launches.load(Relaxed)),
                "syncs_hard": self.hard_syncs.load(Relaxed),
                "syncs_policy": self.policy_syncs.load(Relaxed),
                "syncs_debug": self.debug_syncs.load(Relaxed),
                "h2d_bytes": self.h2d_bytes.load(Relaxed),
                "d2h_bytes": self.d2h_bytes.load(Relaxed),
                "device_allocs": self.device_allocs.load(Relaxed),
                "pinned_allocs": self.pinned_allocs.load(Relaxed),
                "gpu_ms_total": self.gpu_us.load(Relaxed) as f64 / 1e3,
                "gpu_ms_per_step": per_step(self.gpu_us.load(Relaxed)) / 1e3,
            },
        })
    }
}

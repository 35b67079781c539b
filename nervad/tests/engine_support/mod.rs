//! Shared fixtures of the engine tests: a tiny random model in memory, a byte-level test
//! vocabulary, a scripted backend (test double) and an event recorder.
#![allow(dead_code)]

use std::time::Instant;

use nervad::backend::{
    Backend, BackendError, BackendInfo, BackendLimits, SampledToken, SeqStep, StepOutput,
    validate_step,
};
use nervad::engine::{
    ClientId, EngineEvent, EngineModel, EventSink, FinishReason, GenerateRequest, Prompt,
    PromptEncoder, RequestKey, SamplingParams, StopConditions, TokenTable,
};
use nervad::model::{
    Architecture, Attention, DType, DecoderLayer, Linear, Mlp, ModelConfig, ModelWeights,
    RopeScaling, Tensor,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

pub const EOS: u32 = 256;
pub const IM_START: u32 = 257;
pub const HELLO: u32 = 258;
pub const SNOWMAN: u32 = 259;
pub const VOCAB: usize = 264;

pub fn config() -> ModelConfig {
    ModelConfig {
        architecture: Architecture::Qwen3,
        vocab_size: VOCAB,
        hidden_size: 32,
        intermediate_size: 48,
        num_hidden_layers: 2,
        num_attention_heads: 4,
        num_key_value_heads: 2,
        head_dim: 8,
        rms_norm_eps: 1e-6,
        rope_theta: 10000.0,
        rope_scaling: RopeScaling::None,
        max_position_embeddings: 128,
        tie_word_embeddings: true,
        attention_bias: false,
        o_proj_bias: false,
        mlp_bias: false,
        qk_norm: true,
        sliding_window: None,
        dtype: DType::BF16,
        bos_token_id: None,
        eos_token_ids: vec![EOS],
    }
}

pub fn weights(c: &ModelConfig, seed: u64) -> ModelWeights {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut t = |shape: Vec<usize>, scale: f32, offset: f32| {
        let n: usize = shape.iter().product();
        let bits: Vec<u16> = (0..n)
            .map(|_| {
                half::bf16::from_f32(offset + scale * (rng.random::<f32>() * 2.0 - 1.0)).to_bits()
            })
            .collect();
        Tensor::from_bits16(DType::BF16, shape, &bits)
    };
    let (h, qd, kvd, i) = (c.hidden_size, c.q_dim(), c.kv_dim(), c.intermediate_size);
    let embed = t(vec![c.vocab_size, h], 1.0, 0.0);
    let layers = (0..c.num_hidden_layers)
        .map(|_| DecoderLayer {
            input_layernorm: t(vec![h], 0.1, 1.0),
            self_attn: Attention {
                q_proj: Linear {
                    weight: t(vec![qd, h], 0.3, 0.0),
                    bias: None,
                },
                k_proj: Linear {
                    weight: t(vec![kvd, h], 0.3, 0.0),
                    bias: None,
                },
                v_proj: Linear {
                    weight: t(vec![kvd, h], 0.3, 0.0),
                    bias: None,
                },
                o_proj: Linear {
                    weight: t(vec![h, qd], 0.3, 0.0),
                    bias: None,
                },
                q_norm: Some(t(vec![c.head_dim], 0.1, 1.0)),
                k_norm: Some(t(vec![c.head_dim], 0.1, 1.0)),
            },
            post_attention_layernorm: t(vec![h], 0.1, 1.0),
            mlp: Mlp {
                gate_proj: Linear {
                    weight: t(vec![i, h], 0.3, 0.0),
                    bias: None,
                },
                up_proj: Linear {
                    weight: t(vec![i, h], 0.3, 0.0),
                    bias: None,
                },
                down_proj: Linear {
                    weight: t(vec![h, i], 0.3, 0.0),
                    bias: None,
                },
            },
        })
        .collect();
    let norm = t(vec![h], 0.1, 1.0);
    ModelWeights {
        lm_head: embed.clone(),
        embed_tokens: embed,
        layers,
        norm,
    }
}

/// Bytes → byte tokens; chat = `<|im_start|>` + the concatenated contents.
pub struct ByteEncoder;

impl PromptEncoder for ByteEncoder {
    fn encode(&self, text: &str) -> Result<Vec<u32>, String> {
        Ok(text.bytes().map(u32::from).collect())
    }

    fn encode_chat(&self, messages_json: &str) -> Option<Result<Vec<u32>, String>> {
        let v: serde_json::Value = match serde_json::from_str(messages_json) {
            Ok(v) => v,
            Err(e) => return Some(Err(e.to_string())),
        };
        let Some(msgs) = v.as_array() else {
            return Some(Err("messages must be an array".into()));
        };
        let mut out = vec![IM_START];
        for m in msgs {
            let Some(c) = m.get("content").and_then(|c| c.as_str()) else {
                return Some(Err("message without content".into()));
            };
            out.extend(c.bytes().map(u32::from));
        }
        Some(Ok(out))
    }
}

pub fn token_table() -> TokenTable {
    let bytes: Vec<[u8; 1]> = (0..=255u8).map(|b| [b]).collect();
    let mut entries: Vec<(&[u8], bool)> = bytes.iter().map(|b| (&b[..], false)).collect();
    entries.push((b"<eos>", true));
    entries.push((b"<|im_start|>", true));
    entries.push((b"hello", false));
    entries.push(("☃".as_bytes(), false));
    TokenTable::new(entries)
}

pub fn model(seed: u64) -> EngineModel {
    let c = config();
    EngineModel {
        name: "test-tiny".into(),
        weights: weights(&c, seed),
        config: c,
        tokens: token_table(),
        eos_token_ids: vec![EOS],
        prompts: Box::new(ByteEncoder),
    }
}

pub fn key(client: u32, tag: u64) -> RequestKey {
    RequestKey {
        client: ClientId {
            slot: client,
            generation: 0,
        },
        tag,
    }
}

pub fn request(k: RequestKey, prompt: Prompt, max_tokens: u32) -> GenerateRequest {
    GenerateRequest {
        key: k,
        prompt,
        sampling: SamplingParams::default(),
        max_tokens,
        stop: StopConditions::default(),
        n_samples: 1,
        priority: 0,
        received_at: Instant::now(),
    }
}

/// Owned copy of an event.
#[derive(Debug, Clone, PartialEq)]
pub enum Ev {
    Tokens(RequestKey, u16, Vec<u32>, Vec<f32>),
    Top(RequestKey, u16, Vec<u32>),
    Text(RequestKey, u16, String),
    Done(RequestKey, u16, FinishReason, u32),
    Error(RequestKey, String),
}

#[derive(Debug, Default)]
pub struct Recorder {
    pub events: Vec<Ev>,
}

impl EventSink for Recorder {
    fn emit(&mut self, event: EngineEvent<'_>) {
        self.events.push(match event {
            EngineEvent::Tokens {
                key,
                sample,
                ids,
                logprobs,
            } => Ev::Tokens(key, sample, ids.to_vec(), logprobs.to_vec()),
            EngineEvent::TopLogprobs {
                key, sample, ids, ..
            } => Ev::Top(key, sample, ids.to_vec()),
            EngineEvent::Text { key, sample, text } => {
                assert!(!text.is_empty(), "empty text event");
                Ev::Text(key, sample, text.to_string())
            }
            EngineEvent::Done {
                key,
                sample,
                reason,
                timings,
                ..
            } => Ev::Done(key, sample, reason, timings.generated_tokens),
            EngineEvent::Error { key, error } => Ev::Error(key, error.to_string()),
        });
    }
}

impl Recorder {
    pub fn tokens(&self, k: RequestKey, sample: u16) -> Vec<u32> {
        self.events
            .iter()
            .filter_map(|e| match e {
                Ev::Tokens(kk, s, ids, _) if *kk == k && *s == sample => Some(ids.clone()),
                _ => None,
            })
            .flatten()
            .collect()
    }

    pub fn text(&self, k: RequestKey, sample: u16) -> String {
        self.events
            .iter()
            .filter_map(|e| match e {
                Ev::Text(kk, s, t) if *kk == k && *s == sample => Some(t.as_str()),
                _ => None,
            })
            .collect()
    }

    pub fn done(&self, k: RequestKey, sample: u16) -> Vec<FinishReason> {
        self.events
            .iter()
            .filter_map(|e| match e {
                Ev::Done(kk, s, r, _) if *kk == k && *s == sample => Some(*r),
                _ => None,
            })
            .collect()
    }
}

/// Shared record of every step's (slot, tokens, start position) entries.
pub type StepLog = std::sync::Arc<std::sync::Mutex<Vec<Vec<(u32, usize, u32)>>>>;

/// A backend that "samples" a fixed script per sequence (token i of the script at the i-th
/// sample of the slot), checks every step against its limits, and tracks which sequence wrote
/// each KV position so the engine's page handling is checked too.
pub struct ScriptedBackend {
    pub limits: BackendLimits,
    pub script: Vec<u32>,
    /// Per slot: next script index.
    counters: Vec<usize>,
    /// Every step: (slot, tokens, start position) per batch entry; shared so tests can read it
    /// after the engine took the backend.
    pub log: StepLog,
    /// Behave like a device backend: the engine may launch a step before collecting the last.
    pub overlap: bool,
    /// Model a paged KV pool instead of following the script: every step writes its tokens
    /// into the pages of its block table, and a sample is a hash of the tokens read back
    /// through the block table at positions `0..=last` (a byte letter). Reading a position
    /// never written fails the step. Any page mix-up (a page reused while held, a missing
    /// copy-on-write, a skipped recompute) then changes the output.
    pub kv_model: bool,
    /// Launches of a step with a prefill chunk while another step was in flight (a device
    /// running step t while the host launched step t+1).
    pub prefill_launched_ahead: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    /// Launches of any step while another was in flight.
    pub launched_ahead: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    /// The device time every step reports (`StepReport::gpu_ns`).
    pub step_gpu_ns: u64,
    /// Token at each (page, offset) written so far; `u32::MAX` = never written.
    kv: Vec<u32>,
    /// The host swap area in the same form (`limits.swap_pages` pages); a slot swapped back in
    /// is poisoned, so reading a stale slot shows.
    swap: Vec<u32>,
    /// Per slot: the token it sampled last (what `from_last_sample` feeds, as on a device).
    last_sample: Vec<u32>,
    /// Per slot: the seed it was started, forked or resumed with (mixed into `kv_model`
    /// samples, so forked samples differ).
    seeds: Vec<u64>,
    pending: std::collections::VecDeque<Vec<Option<SampledToken>>>,
}

impl ScriptedBackend {
    pub fn new(limits: BackendLimits, script: Vec<u32>) -> Self {
        ScriptedBackend {
            counters: vec![0; limits.max_seqs],
            limits,
            script,
            log: Default::default(),
            overlap: false,
            kv_model: false,
            prefill_launched_ahead: Default::default(),
            launched_ahead: Default::default(),
            step_gpu_ns: 0,
            kv: vec![u32::MAX; limits.num_pages * limits.page_tokens],
            swap: vec![u32::MAX; limits.swap_pages * limits.page_tokens],
            last_sample: vec![0; limits.max_seqs],
            seeds: vec![0; limits.max_seqs],
            pending: std::collections::VecDeque::new(),
        }
    }
}

impl Backend for ScriptedBackend {
    fn info(&self) -> BackendInfo {
        BackendInfo {
            name: "test".into(),
            device: "script".into(),
            kv_bytes_per_token: 0,
        }
    }
    fn limits(&self) -> BackendLimits {
        self.limits
    }
    fn start_sequence(
        &mut self,
        slot: u32,
        _: &SamplingParams,
        seed: u64,
        _: &[u32],
    ) -> Result<(), BackendError> {
        self.counters[slot as usize] = 0;
        self.seeds[slot as usize] = seed;
        Ok(())
    }
    fn resume_sequence(
        &mut self,
        slot: u32,
        _: &SamplingParams,
        seed: u64,
        _: &[u32],
        output: &[u32],
    ) -> Result<(), BackendError> {
        self.counters[slot as usize] = output.len();
        self.seeds[slot as usize] = seed;
        Ok(())
    }
    fn fork_sequence(
        &mut self,
        src: u32,
        dst: u32,
        _: &SamplingParams,
        seed: u64,
    ) -> Result<(), BackendError> {
        self.counters[dst as usize] = self.counters[src as usize];
        self.seeds[dst as usize] = seed;
        Ok(())
    }
    fn copy_page(&mut self, src: u32, dst: u32) -> Result<(), BackendError> {
        let pt = self.limits.page_tokens;
        let (s, d) = (src as usize * pt, dst as usize * pt);
        self.kv.copy_within(s..s + pt, d);
        Ok(())
    }
    fn swap_out(&mut self, pages: &[u32], host: &[u32]) -> Result<(), BackendError> {
        nervad::backend::validate_swap(&self.limits, pages, host)?;
        let pt = self.limits.page_tokens;
        for (&p, &h) in pages.iter().zip(host) {
            let (p, h) = (p as usize * pt, h as usize * pt);
            self.swap[h..h + pt].copy_from_slice(&self.kv[p..p + pt]);
        }
        Ok(())
    }
    fn swap_in(&mut self, host: &[u32], pages: &[u32]) -> Result<(), BackendError> {
        nervad::backend::validate_swap(&self.limits, pages, host)?;
        let pt = self.limits.page_tokens;
        for (&h, &p) in host.iter().zip(pages) {
            let (p, h) = (p as usize * pt, h as usize * pt);
            self.kv[p..p + pt].copy_from_slice(&self.swap[h..h + pt]);
            self.swap[h..h + pt].fill(u32::MAX);
        }
        Ok(())
    }
    fn launch(&mut self, batch: &[SeqStep<'_>], out: &mut StepOutput) -> Result<(), BackendError> {
        validate_step(&self.limits, VOCAB, batch)?;
        let most = if self.overlap { 2 } else { 1 };
        if self.pending.len() >= most {
            return Err(BackendError::Limits(format!(
                "{most} step(s) in flight at most"
            )));
        }
        if !self.pending.is_empty() {
            self.launched_ahead
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        if !self.pending.is_empty()
            && batch
                .iter()
                .any(|s| !s.from_last_sample && s.tokens.len() > 1)
        {
            self.prefill_launched_ahead
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        if let Ok(mut log) = self.log.lock() {
            log.push(
                batch
                    .iter()
                    .map(|s| (s.slot, s.tokens.len(), s.start_pos))
                    .collect(),
            );
        }
        out.samples.clear();
        let pt = self.limits.page_tokens;
        for s in batch {
            if self.kv_model {
                for (k, &tok) in s.tokens.iter().enumerate() {
                    let tok = if s.from_last_sample {
                        self.last_sample[s.slot as usize]
                    } else {
                        tok
                    };
                    let pos = s.start_pos as usize + k;
                    self.kv[s.block_table[pos / pt] as usize * pt + pos % pt] = tok;
                }
            }
            if s.sample && self.kv_model {
                let last = s.start_pos as usize + s.tokens.len();
                let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ self.seeds[s.slot as usize];
                for pos in 0..last {
                    let tok = self.kv[s.block_table[pos / pt] as usize * pt + pos % pt];
                    if tok == u32::MAX {
                        return Err(BackendError::InvalidInput(format!(
                            "slot {} reads unwritten position {pos}",
                            s.slot
                        )));
                    }
                    h = (h ^ u64::from(tok)).wrapping_mul(0x100_0000_01b3);
                }
                let token = u32::from(b'a') + (h % 26) as u32;
                self.last_sample[s.slot as usize] = token;
                out.samples.push(Some(SampledToken {
                    token,
                    logprob: -0.5,
                    ..SampledToken::default()
                }));
            } else if s.sample {
                let c = &mut self.counters[s.slot as usize];
                let token = self.script.get(*c).copied().unwrap_or(u32::from(b'.'));
                *c += 1;
                out.samples.push(Some(SampledToken {
                    token,
                    logprob: -0.5,
                    ..SampledToken::default()
                }));
            } else {
                out.samples.push(None);
            }
        }
        self.pending.push_back(out.samples.clone());
        Ok(())
    }
    fn collect(&mut self, out: &mut StepOutput) -> Result<(), BackendError> {
        let Some(samples) = self.pending.pop_front() else {
            return Err(BackendError::InvalidInput("nothing launched".into()));
        };
        out.samples.clear();
        out.samples.extend_from_slice(&samples);
        out.report.gpu_ns = self.step_gpu_ns;
        Ok(())
    }
    fn in_flight(&self) -> usize {
        self.pending.len()
    }
    fn overlaps(&self) -> bool {
        self.overlap
    }
}

pub fn scripted_limits() -> BackendLimits {
    BackendLimits {
        max_seqs: 4,
        max_step_tokens: 16,
        page_tokens: 4,
        num_pages: 32,
        max_context: 64,
        swap_pages: 0,
    }
}

pub fn scripted_model() -> EngineModel {
    let mut m = model(1);
    m.config.max_position_embeddings = 64;
    m
}

/// An engine with default options over a `ScriptedBackend` of `script` (scripted limits and
/// model) that launches steps ahead like a device when `overlap`, each step reporting
/// `step_gpu_ns` of device time; with the backend's step log and its count of steps launched
/// ahead.
pub fn scripted_engine(
    script: Vec<u32>,
    overlap: bool,
    step_gpu_ns: u64,
) -> (
    nervad::engine::Engine,
    StepLog,
    std::sync::Arc<std::sync::atomic::AtomicUsize>,
) {
    let mut backend = ScriptedBackend::new(scripted_limits(), script);
    backend.overlap = overlap;
    backend.step_gpu_ns = step_gpu_ns;
    let log = backend.log.clone();
    let ahead = backend.launched_ahead.clone();
    let engine = nervad::engine::Engine::new(
        scripted_model(),
        Box::new(backend),
        nervad::engine::EngineOptions::default(),
    );
    (engine, log, ahead)
}

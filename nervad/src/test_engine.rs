//! A deterministic stand-in engine for protocol tests (cargo feature `test-engine`, selected only
//! by `nervad serve --engine test`). It never touches a model: every token id is a pure function
//! of (prompt, seed, sample, position), and each id maps to a fixed word, some of them multi-byte
//! UTF-8 so the text path (code-point splitting and reassembly) is exercised.
//!
//! It honours the whole [`InferenceEngine`] contract the real engine does: max tokens, eos (id 0),
//! stop token ids, stop strings (held back while they may still match), cancel, pause, client
//! drop, shutdown, timings, and refusals for bad prompts and duplicate tags.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use crate::engine::api::{
    ClientId, EngineEvent, EngineInfo, EventSink, FinishReason, GenerateRequest, InferenceEngine,
    Prompt, RequestError, RequestKey, RequestTimings,
};

/// Vocabulary size of the test engine.
pub const VOCAB: u32 = 512;
/// The end-of-sequence id.
pub const EOS: u32 = 0;
/// Context length the test engine claims.
pub const MAX_CONTEXT: u32 = 8192;

const WORDS: &[&str] = &[
    " alpha", " beta", " gamma", " délta", " ε", " 日本", " 🚀", " zeta", " eta", " théta", " ι",
    " kappa", " λ", " mu", " nü", " ξ", " omicron", " 𝜋", " rho", " σ",
];

/// The text of token `id`.
pub fn token_text(id: u32) -> &'static str {
    WORDS[id as usize % WORDS.len()]
}

fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn fnv1a(bytes: impl IntoIterator<Item = u8>) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// Tokenize a prompt the way the test engine does: one token per byte of text, ids as given.
fn prompt_tokens(prompt: &Prompt) -> Result<(u64, usize), RequestError> {
    match prompt {
        Prompt::Text(t) => {
            if t.is_empty() {
                return Err(RequestError::InvalidPrompt("empty prompt".into()));
            }
            Ok((fnv1a(t.bytes()), t.len()))
        }
        Prompt::Tokens(ids) => {
            if ids.is_empty() {
                return Err(RequestError::InvalidPrompt("empty prompt".into()));
            }
            if let Some(&bad) = ids.iter().find(|&&id| id >= VOCAB) {
                return Err(RequestError::BadToken(bad));
            }
            Ok((fnv1a(ids.iter().flat_map(|id| id.to_le_bytes())), ids.len()))
        }
        Prompt::Chat(json) => {
            let messages: Vec<serde_json::Value> = serde_json::from_str(json)
                .map_err(|e| RequestError::InvalidPrompt(format!("chat JSON: {e}")))?;
            let mut rendered = String::new();
            for m in &messages {
                let role = m.get("role").and_then(|v| v.as_str());
                let content = m.get("content").and_then(|v| v.as_str());
                match (role, content) {
                    (Some(r), Some(c)) => {
                        rendered.push_str(r);
                        rendered.push_str(": ");
                        rendered.push_str(c);
                        rendered.push('\n');
                    }
                    _ => {
                        return Err(RequestError::InvalidPrompt(
                            "chat messages need string role and content".into(),
                        ));
                    }
                }
            }
            if rendered.is_empty() {
                return Err(RequestError::InvalidPrompt("no chat messages".into()));
            }
            Ok((fnv1a(rendered.bytes()), rendered.len()))
        }
    }
}

struct Sequence {
    key: RequestKey,
    sample: u16,
    rng: u64,
    max_tokens: u32,
    stop_ids: Vec<u32>,
    stop_strings: Vec<String>,
    ignore_eos: bool,
    text: String,
    emitted: usize,
    generated: u32,
    prompt_tokens: u32,
    received_at: Instant,
    scheduled_at: Option<Instant>,
    first_token_at: Option<Instant>,
    last_token_at: Option<Instant>,
    cancelled: bool,
}

impl Sequence {
    fn timings(&self) -> RequestTimings {
        let us = |a: Instant, b: Instant| b.saturating_duration_since(a).as_micros() as u64;
        RequestTimings {
            queue_us: self.scheduled_at.map_or(0, |s| us(self.received_at, s)),
            first_token_us: self.first_token_at.map_or(0, |f| us(self.received_at, f)),
            decode_us: match (self.first_token_at, self.last_token_at) {
                (Some(f), Some(l)) => us(f, l),
                _ => 0,
            },
            prompt_tokens: self.prompt_tokens,
            generated_tokens: self.generated,
        }
    }

    /// Length of the longest suffix of the text that is a proper prefix of a stop string:
    /// those bytes are held back because the next token may complete the match.
    fn held_back(&self) -> usize {
        let tail = &self.text[self.emitted..];
        let mut held = 0;
        for s in &self.stop_strings {
            for (i, _) in tail.char_indices() {
                let suffix = &tail[i..];
                if suffix.len() < s.len() && s.starts_with(suffix) {
                    held = held.max(suffix.len());
                    break;
                }
            }
        }
        held
    }
}

/// The deterministic test engine.
pub struct TestEngine {
    seqs: Vec<Sequence>,
    paused: HashSet<ClientId>,
    step_delay: Duration,
    ids: Vec<u32>,
    logprobs: Vec<f32>,
}

impl TestEngine {
    /// An engine that sleeps `step_delay` per step while it has work (simulated compute, so
    /// tests can observe streams mid-flight).
    pub fn new(step_delay: Duration) -> Self {
        TestEngine {
            seqs: Vec::with_capacity(1024),
            paused: HashSet::new(),
            step_delay,
            ids: Vec::with_capacity(1),
            logprobs: Vec::with_capacity(1),
        }
    }

    fn finish(seq: &mut Sequence, reason: FinishReason, sink: &mut dyn EventSink) {
        let rest = &seq.text[seq.emitted..];
        if !rest.is_empty() && matches!(reason, FinishReason::Length | FinishReason::ContextLength)
        {
            sink.emit(EngineEvent::Text {
                key: seq.key,
                sample: seq.sample,
                text: rest,
            });
        }
        seq.emitted = seq.text.len();
        sink.emit(EngineEvent::Done {
            key: seq.key,
            sample: seq.sample,
            reason,
            timings: seq.timings(),
            // The protocol-test engine runs no backend steps: nothing to account.
            ledger: &crate::engine::ledger::EMPTY_LEDGER,
        });
    }
}

impl InferenceEngine for TestEngine {
    fn submit(&mut self, request: GenerateRequest) -> Result<(), RequestError> {
        if self.seqs.iter().any(|s| s.key == request.key) {
            return Err(RequestError::DuplicateTag);
        }
        let s = &request.sampling;
        if !(s.temperature.is_finite() && s.temperature >= 0.0) {
            return Err(RequestError::InvalidParameter("temperature"));
        }
        if !(s.top_p > 0.0 && s.top_p <= 1.0) {
            return Err(RequestError::InvalidParameter("top_p"));
        }
        if request.n_samples == 0 {
            return Err(RequestError::InvalidParameter("n_samples"));
        }
        let (hash, n_prompt) = prompt_tokens(&request.prompt)?;
        let limit = MAX_CONTEXT as usize;
        if n_prompt + request.max_tokens as usize > limit {
            return Err(RequestError::TooLong {
                prompt_tokens: n_prompt,
                limit,
            });
        }
        for sample in 0..request.n_samples {
            let mut rng = hash ^ request.sampling.seed.wrapping_add(u64::from(sample));
            splitmix64(&mut rng);
            self.seqs.push(Sequence {
                key: request.key,
                sample,
                rng,
                max_tokens: request.max_tokens,
                stop_ids: request.stop.stop_token_ids.clone(),
                stop_strings: request.stop.stop_strings.clone(),
                ignore_eos: request.stop.ignore_eos,
                text: String::new(),
                emitted: 0,
                generated: 0,
                prompt_tokens: n_prompt as u32,
                received_at: request.received_at,
                scheduled_at: None,
                first_token_at: None,
                last_token_at: None,
                cancelled: false,
            });
        }
        Ok(())
    }

    fn cancel(&mut self, key: RequestKey) {
        for s in self.seqs.iter_mut().filter(|s| s.key == key) {
            s.cancelled = true;
        }
    }

    fn drop_client(&mut self, client: ClientId) {
        self.seqs.retain(|s| s.key.client != client);
        self.paused.remove(&client);
    }

    fn set_paused(&mut self, client: ClientId, paused: bool) {
        if paused {
            self.paused.insert(client);
        } else {
            self.paused.remove(&client);
        }
    }

    fn step(&mut self, sink: &mut dyn EventSink) -> bool {
        let runnable = |s: &Sequence, paused: &HashSet<ClientId>| {
            s.cancelled || !paused.contains(&s.key.client)
        };
        if !self.seqs.iter().any(|s| runnable(s, &self.paused)) {
            return false;
        }
        if !self.step_delay.is_zero() {
            std::thread::sleep(self.step_delay);
        }
        let now = Instant::now();
        let mut i = 0;
        while i < self.seqs.len() {
            if !runnable(&self.seqs[i], &self.paused) {
                i += 1;
                continue;
            }
            let seq = &mut self.seqs[i];
            seq.scheduled_at.get_or_insert(now);
            let reason = if seq.cancelled {
                Some(FinishReason::Cancelled)
            } else if seq.generated >= seq.max_tokens {
                Some(FinishReason::Length)
            } else {
                let id = (splitmix64(&mut seq.rng) % u64::from(VOCAB)) as u32;
                if (id == EOS && !seq.ignore_eos) || seq.stop_ids.contains(&id) {
                    Some(FinishReason::Stop)
                } else {
                    seq.generated += 1;
                    seq.first_token_at.get_or_insert(now);
                    seq.last_token_at = Some(now);
                    self.ids.clear();
                    self.ids.push(id);
                    self.logprobs.clear();
                    self.logprobs.push(-((id % 7) as f32) - 0.5);
                    sink.emit(EngineEvent::Tokens {
                        key: seq.key,
                        sample: seq.sample,
                        ids: &self.ids,
                        logprobs: &self.logprobs,
                    });
                    seq.text.push_str(token_text(id));
                    let hit = seq
                        .stop_strings
                        .iter()
                        .filter_map(|s| seq.text[seq.emitted..].find(s.as_str()))
                        .min();
                    if let Some(at) = hit {
                        let end = seq.emitted + at;
                        if end > seq.emitted {
                            sink.emit(EngineEvent::Text {
                                key: seq.key,
                                sample: seq.sample,
                                text: &seq.text[seq.emitted..end],
                            });
                        }
                        seq.emitted = seq.text.len();
                        Some(FinishReason::Stop)
                    } else {
                        let end = seq.text.len() - seq.held_back();
                        if end > seq.emitted {
                            sink.emit(EngineEvent::Text {
                                key: seq.key,
                                sample: seq.sample,
                                text: &seq.text[seq.emitted..end],
                            });
                            seq.emitted = end;
                        }
                        (seq.generated >= seq.max_tokens).then_some(FinishReason::Length)
                    }
                }
            };
            if let Some(reason) = reason {
                let mut done = self.seqs.swap_remove(i);
                Self::finish(&mut done, reason, sink);
            } else {
                i += 1;
            }
        }
        self.seqs.iter().any(|s| runnable(s, &self.paused))
    }

    fn finish_all(&mut self, reason: FinishReason, sink: &mut dyn EventSink) {
        for mut seq in self.seqs.drain(..) {
            Self::finish(&mut seq, reason, sink);
        }
        self.paused.clear();
    }

    fn info(&self) -> EngineInfo {
        EngineInfo {
            model: "deterministic test engine".into(),
            architecture: "test".into(),
            backend: "test".into(),
            device: "none".into(),
            dtype: "none".into(),
            vocab_size: VOCAB,
            max_batch: 0,
            max_context: MAX_CONTEXT,
            kv_pages_total: 0,
            kv_page_tokens: 0,
            weight_bytes: 0,
            step_weight_bytes: 0,
            kv_bytes_per_token: 0,
            read_bandwidth_bytes_per_s: None,
        }
    }

    fn in_flight(&self) -> usize {
        let mut keys: Vec<RequestKey> = self.seqs.iter().map(|s| s.key).collect();
        keys.sort_unstable();
        keys.dedup();
        keys.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::api::{SamplingParams, StopConditions};

    #[derive(Default)]
    struct Collect {
        text: String,
        done: Vec<(u16, FinishReason, u32)>,
    }
    impl EventSink for Collect {
        fn emit(&mut self, event: EngineEvent<'_>) {
            match event {
                EngineEvent::Text { text, .. } => self.text.push_str(text),
                EngineEvent::Done {
                    sample,
                    reason,
                    timings,
                    ..
                } => self.done.push((sample, reason, timings.generated_tokens)),
                _ => {}
            }
        }
    }

    fn request(tag: u64, prompt: &str, max_tokens: u32, stop: StopConditions) -> GenerateRequest {
        GenerateRequest {
            key: RequestKey {
                client: ClientId {
                    slot: 0,
                    generation: 0,
                },
                tag,
            },
            prompt: Prompt::Text(prompt.into()),
            sampling: SamplingParams::default(),
            max_tokens,
            stop,
            n_samples: 1,
            priority: 0,
            received_at: Instant::now(),
        }
    }

    fn run(engine: &mut TestEngine) -> Collect {
        let mut c = Collect::default();
        while engine.step(&mut c) {}
        c
    }

    #[test]
    fn same_request_same_output_and_stop_strings_are_cut() {
        let stop = StopConditions {
            ignore_eos: true,
            ..Default::default()
        };
        let mut e = TestEngine::new(Duration::ZERO);
        e.submit(request(1, "hello", 40, stop.clone()))
            .expect("accepted");
        let a = run(&mut e);
        e.submit(request(1, "hello", 40, stop.clone()))
            .expect("accepted");
        let b = run(&mut e);
        assert_eq!(a.text, b.text);
        assert_eq!(a.done, vec![(0, FinishReason::Length, 40)]);
        // A stop string spanning a word boundary: last char of word 1, space, first of word 2.
        let w1 = a.text.split(' ').nth(1).expect("word");
        let w2 = a.text.split(' ').nth(2).expect("word");
        let stop_at = format!(
            "{} {}",
            w1.chars().last().expect("char"),
            w2.chars().next().expect("char")
        );
        let with_stop = StopConditions {
            stop_strings: vec![stop_at.clone()],
            ignore_eos: true,
            ..Default::default()
        };
        e.submit(request(2, "hello", 40, with_stop))
            .expect("accepted");
        let c = run(&mut e);
        let cut = a.text.find(&stop_at).expect("present");
        assert_eq!(c.text, a.text[..cut]);
        assert_eq!(c.done[0].1, FinishReason::Stop);
    }

    #[test]
    fn refusals_and_cancel() {
        let mut e = TestEngine::new(Duration::ZERO);
        assert!(matches!(
            e.submit(request(1, "", 4, StopConditions::default())),
            Err(RequestError::InvalidPrompt(_))
        ));
        e.submit(request(
            1,
            "x",
            1000,
            StopConditions {
                ignore_eos: true,
                ..Default::default()
            },
        ))
        .expect("accepted");
        assert_eq!(
            e.submit(request(1, "x", 4, StopConditions::default())),
            Err(RequestError::DuplicateTag)
        );
        e.cancel(e.seqs[0].key);
        let c = run(&mut e);
        assert_eq!(c.done[0].1, FinishReason::Cancelled);
        assert_eq!(e.in_flight(), 0);
    }
}

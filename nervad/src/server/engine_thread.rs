//! The engine thread: owns the [`InferenceEngine`], takes commands from the poll thread,
//! steps the engine, and turns its events into wire completions for the poll thread to place
//! into client completion rings.
//!
//! Queues in both directions are `rtrb` SPSC rings allocated once at start. The poll thread
//! wakes this thread with `Thread::unpark` (an atomic swap; a futex wake only when the engine
//! really parked); this thread wakes the poll thread through a need-wakeup doorbell (an eventfd
//! write only when the poll thread announced sleep).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nerva_rings::{
    Completion, DoneInfo, GenerateFlags, INLINE_TOKENS, INLINE_TOP_LOGPROBS, Notifier, StatusCode,
    split_text,
};

use super::intake::status_for;
use super::stats::LatencyStats;
use crate::engine::api::{
    ClientId, EngineEvent, EventSink, FinishReason, GenerateRequest, InferenceEngine, Prompt,
    RequestKey,
};

/// What the poll thread asks of the engine thread.
#[derive(Debug)]
pub enum EngineCommand {
    /// Admit a request (refusals come back as ERROR completions).
    Submit {
        /// The request.
        request: Box<GenerateRequest>,
        /// What to stream.
        flags: GenerateFlags,
    },
    /// Cancel a request.
    Cancel(RequestKey),
    /// A client went away: drop its requests silently.
    DropClient(ClientId),
    /// A client's completion ring is full (true) or has room again (false).
    SetPaused(ClientId, bool),
    /// Stop taking work; finish in-flight requests until `deadline`, then end the rest with
    /// `Shutdown`, then report [`EngineOutput::Drained`] and exit.
    Drain {
        /// When to stop waiting.
        deadline: Instant,
    },
}

/// What the engine thread sends back.
#[derive(Debug, Clone, Copy)]
pub enum EngineOutput {
    /// A completion for a client.
    Completion(ClientId, Completion),
    /// Drain finished: no more outputs follow.
    Drained,
}

/// Per-request state kept on the engine thread: the next sequence number of the request's
/// completions, samples still running, and what to stream.
struct RequestState {
    seq: u32,
    samples_left: u16,
    flags: GenerateFlags,
    /// Tokens generated so far per sample (position of the next TOP_LOGPROBS).
    positions: Vec<u32>,
}

/// Converts engine events into completions on the output queue.
struct CompletionSink<'a> {
    out: &'a mut rtrb::Producer<EngineOutput>,
    requests: &'a mut HashMap<RequestKey, RequestState>,
    stats: &'a LatencyStats,
    pairs: Vec<(u32, f32)>,
    produced: bool,
}

impl CompletionSink<'_> {
    fn send(&mut self, client: ClientId, completion: Completion) {
        let mut item = EngineOutput::Completion(client, completion);
        // The poll thread always drains this queue (also while it waits to send us commands),
        // so a full queue is a short stall, never a deadlock. Nothing is dropped.
        loop {
            match self.out.push(item) {
                Ok(()) => break,
                Err(rtrb::PushError::Full(back)) => {
                    if self.out.is_abandoned() {
                        return;
                    }
                    item = back;
                    std::thread::yield_now();
                }
            }
        }
        self.produced = true;
    }

    fn next_seq(&mut self, key: RequestKey) -> Option<(u32, GenerateFlags)> {
        let state = self.requests.get_mut(&key)?;
        let seq = state.seq;
        state.seq = state.seq.wrapping_add(1);
        Some((seq, state.flags))
    }

    fn flags(&self, key: RequestKey) -> Option<GenerateFlags> {
        self.requests.get(&key).map(|s| s.flags)
    }
}

fn wire_finish(reason: FinishReason) -> nerva_rings::FinishReason {
    match reason {
        FinishReason::Stop => nerva_rings::FinishReason::Stop,
        FinishReason::Length => nerva_rings::FinishReason::Length,
        FinishReason::ContextLength => nerva_rings::FinishReason::ContextLength,
        FinishReason::Cancelled => nerva_rings::FinishReason::Cancelled,
        FinishReason::Error => nerva_rings::FinishReason::Error,
        FinishReason::Shutdown => nerva_rings::FinishReason::Shutdown,
    }
}

impl EventSink for CompletionSink<'_> {
    fn emit(&mut self, event: EngineEvent<'_>) {
        match event {
            EngineEvent::Tokens {
                key,
                sample,
                ids,
                logprobs,
            } => {
                self.stats.record_tokens(ids.len() as u64);
                if let Some(state) = self.requests.get_mut(&key)
                    && let Some(p) = state.positions.get_mut(usize::from(sample))
                {
                    *p = p.wrapping_add(ids.len() as u32);
                }
                let Some(flags) = self.flags(key) else { return };
                if !flags.contains(GenerateFlags::STREAM_TOKENS) {
                    return;
                }
                let with_lp = flags.contains(GenerateFlags::LOGPROBS);
                for (i, chunk) in ids.chunks(INLINE_TOKENS).enumerate() {
                    let lps: &[f32] = if with_lp {
                        logprobs
                            .get(
                                i * INLINE_TOKENS
                                    ..(i * INLINE_TOKENS + chunk.len()).min(logprobs.len()),
                            )
                            .unwrap_or(&[])
                    } else {
                        &[]
                    };
                    let Some((seq, _)) = self.next_seq(key) else {
                        return;
                    };
                    let (c, _) = Completion::tokens(key.tag, sample, seq, chunk, lps);
                    self.send(key.client, c);
                }
            }
            EngineEvent::TopLogprobs {
                key,
                sample,
                ids,
                logprobs,
            } => {
                let Some(state) = self.requests.get(&key) else {
                    return;
                };
                // Alternatives are for the token just emitted.
                let position = state
                    .positions
                    .get(usize::from(sample))
                    .copied()
                    .unwrap_or(0)
                    .saturating_sub(1);
                self.pairs.clear();
                self.pairs
                    .extend(ids.iter().copied().zip(logprobs.iter().copied()));
                let pairs = std::mem::take(&mut self.pairs);
                for chunk in pairs.chunks(INLINE_TOP_LOGPROBS) {
                    let Some((seq, _)) = self.next_seq(key) else {
                        break;
                    };
                    let (c, _) = Completion::top_logprobs(key.tag, sample, seq, position, chunk);
                    self.send(key.client, c);
                }
                self.pairs = pairs;
            }
            EngineEvent::Text { key, sample, text } => {
                let Some(flags) = self.flags(key) else { return };
                if !flags.contains(GenerateFlags::STREAM_TEXT) {
                    return;
                }
                for piece in split_text(text) {
                    let Some((seq, _)) = self.next_seq(key) else {
                        return;
                    };
                    if let Ok(c) = Completion::text(key.tag, sample, seq, piece) {
                        self.send(key.client, c);
                    }
                }
            }
            EngineEvent::Done {
                key,
                sample,
                reason,
                timings,
                ledger,
            } => {
                self.stats
                    .record_done(key, sample, reason, &timings, ledger);
                let Some((seq, _)) = self.next_seq(key) else {
                    return;
                };
                let info = DoneInfo {
                    finish: wire_finish(reason),
                    status: if reason == FinishReason::Error {
                        StatusCode::Internal.as_u16()
                    } else {
                        0
                    },
                    prompt_tokens: timings.prompt_tokens,
                    generated_tokens: timings.generated_tokens,
                    queue_us: timings.queue_us,
                    first_token_us: timings.first_token_us,
                    decode_us: timings.decode_us,
                };
                self.send(key.client, Completion::done(key.tag, sample, seq, &info));
                if let Some(state) = self.requests.get_mut(&key) {
                    state.samples_left = state.samples_left.saturating_sub(1);
                    if state.samples_left == 0 {
                        self.requests.remove(&key);
                    }
                }
            }
            EngineEvent::Error { key, error } => {
                let Some((seq, _)) = self.next_seq(key) else {
                    return;
                };
                let status = status_for(error, false);
                self.send(
                    key.client,
                    Completion::error(key.tag, seq, status, &error.to_string()),
                );
                self.requests.remove(&key);
            }
        }
    }
}

/// The engine thread's state.
pub struct EngineWorker {
    engine: Box<dyn InferenceEngine>,
    commands: rtrb::Consumer<EngineCommand>,
    out: rtrb::Producer<EngineOutput>,
    wake_poller: Notifier,
    stats: Arc<LatencyStats>,
    requests: HashMap<RequestKey, RequestState>,
}

/// While idle, the engine thread re-checks its queue at least this often (the poll thread
/// unparks it on every command batch; this bounds the damage of a missed unpark to 50 ms).
const IDLE_PARK: Duration = Duration::from_millis(50);

impl EngineWorker {
    /// Build the worker (run it with [`EngineWorker::run`] on its own thread).
    pub fn new(
        engine: Box<dyn InferenceEngine>,
        commands: rtrb::Consumer<EngineCommand>,
        out: rtrb::Producer<EngineOutput>,
        wake_poller: Notifier,
        stats: Arc<LatencyStats>,
    ) -> Self {
        EngineWorker {
            engine,
            commands,
            out,
            wake_poller,
            stats,
            requests: HashMap::with_capacity(1024),
        }
    }

    /// Serve until drained (or until the poll thread goes away).
    pub fn run(self) {
        let EngineWorker {
            mut engine,
            mut commands,
            mut out,
            wake_poller,
            stats,
            mut requests,
        } = self;
        let wake = || {
            if let Err(e) = wake_poller.notify() {
                tracing::error!(error = %e, "cannot wake the poll thread");
            }
        };
        let mut drain_deadline: Option<Instant> = None;
        let mut pairs = Vec::with_capacity(32);
        loop {
            let mut sink = CompletionSink {
                out: &mut out,
                requests: &mut requests,
                stats: &stats,
                pairs: std::mem::take(&mut pairs),
                produced: false,
            };
            while let Ok(cmd) = commands.pop() {
                match cmd {
                    EngineCommand::Submit { request, flags } => {
                        submit(engine.as_mut(), &mut sink, *request, flags);
                    }
                    EngineCommand::Cancel(key) => engine.cancel(key),
                    EngineCommand::DropClient(client) => {
                        engine.drop_client(client);
                        sink.requests.retain(|k, _| k.client != client);
                    }
                    EngineCommand::SetPaused(client, paused) => engine.set_paused(client, paused),
                    EngineCommand::Drain { deadline } => drain_deadline = Some(deadline),
                }
            }
            if let Some(deadline) = drain_deadline
                && (engine.in_flight() == 0 || Instant::now() >= deadline)
            {
                if engine.in_flight() > 0 {
                    tracing::warn!(
                        in_flight = engine.in_flight(),
                        "drain timeout: ending the rest with reason shutdown"
                    );
                }
                engine.finish_all(FinishReason::Shutdown, &mut sink);
                drop(sink);
                while out.push(EngineOutput::Drained).is_err() {
                    if out.is_abandoned() {
                        return;
                    }
                    std::thread::yield_now();
                }
                wake();
                return;
            }
            let more = engine.step(&mut sink);
            engine.publish(&stats.engine);
            let produced = sink.produced;
            pairs = std::mem::take(&mut sink.pairs);
            drop(sink);
            if produced {
                wake();
            }
            if more
                && let Some(until) = engine.hold_until()
                && commands.is_empty()
            {
                // The engine holds its next launch for a command: sleep until one comes (the
                // poll thread unparks us) or the hold ends.
                std::thread::park_timeout(until.saturating_duration_since(Instant::now()));
                continue;
            }
            if !more && commands.is_empty() {
                if commands.is_abandoned() {
                    return;
                }
                // park() consumes an unpark token issued after our is_empty() check, so a
                // command pushed in between is never slept through.
                let timeout = match drain_deadline {
                    Some(d) => d.saturating_duration_since(Instant::now()).min(IDLE_PARK),
                    None => IDLE_PARK,
                };
                std::thread::park_timeout(timeout);
            }
        }
    }
}

/// Admit a request, or answer its refusal with an ERROR completion.
fn submit(
    engine: &mut dyn InferenceEngine,
    sink: &mut CompletionSink<'_>,
    request: GenerateRequest,
    flags: GenerateFlags,
) {
    let key = request.key;
    let samples = request.n_samples;
    let was_chat = matches!(request.prompt, Prompt::Chat(_));
    if sink.requests.contains_key(&key) {
        let c = Completion::error(
            key.tag,
            0,
            StatusCode::DuplicateTag,
            "tag already in flight",
        );
        sink.send(key.client, c);
        return;
    }
    sink.requests.insert(
        key,
        RequestState {
            seq: 0,
            samples_left: samples,
            flags,
            positions: vec![0; usize::from(samples)],
        },
    );
    if let Err(e) = engine.submit(request) {
        sink.requests.remove(&key);
        let c = Completion::error(key.tag, 0, status_for(&e, was_chat), &e.to_string());
        sink.send(key.client, c);
    }
}

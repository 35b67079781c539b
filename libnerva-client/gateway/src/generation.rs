//! One HTTP generation: collects a [`Submitted`] group's events into OpenAI choices, as a
//! whole response or as SSE chunks.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Instant;

use axum::body::{Body, Bytes};
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use nerva_client::FinishReason;
use serde_json::{Value, json};

use crate::daemon::{Failure, GenEvent, Labelled, Submitted};
use crate::error::ApiError;
use crate::request::{Endpoint, Logprobs, ParsedRequest};
use crate::server::AppState;

/// Token texts for log-probability entries, resolved through the daemon's tokenizer.
type TokenNames = HashMap<u32, String>;

/// How a token is named in log-probability entries: its text through the daemon's tokenizer,
/// or, when the daemon cannot say (no tokenizer, gone), vLLM's
/// `--return-tokens-as-token-ids` spelling, which round-trips exactly.
fn token_name(names: &TokenNames, id: u32) -> String {
    names
        .get(&id)
        .cloned()
        .unwrap_or_else(|| format!("token_id:{id}"))
}

/// Texts of `ids` (each decoded on its own, cached by the pool).
async fn resolve_names(state: &AppState, ids: Vec<u32>) -> TokenNames {
    if ids.is_empty() {
        return TokenNames::new();
    }
    let pool = Arc::clone(&state.pool);
    tokio::task::spawn_blocking(move || pool.token_texts(&ids))
        .await
        .unwrap_or_default()
}

/// One choice (= one sample of one prompt) being assembled.
#[derive(Default)]
struct Choice {
    text: String,
    finish: Option<FinishReason>,
    ids: Vec<u32>,
    logprobs: Vec<f32>,
    /// Alternatives per generated position (arrive as their own events).
    top: Vec<Option<Vec<(u32, f32)>>>,
    /// Log-probability entries already sent (streaming).
    sent: usize,
    /// Text not yet sent (streaming).
    pending_text: String,
    generated: u32,
    prompt_tokens: u32,
    started: bool,
}

impl Choice {
    /// Entries whose token (and, when asked, alternatives) have arrived.
    fn ready(&self, top: u8) -> usize {
        if top == 0 {
            return self.ids.len();
        }
        let n = self.ids.len().min(self.top.len());
        self.top[..n].iter().position(Option::is_none).unwrap_or(n)
    }
}

/// What a request produced so far.
struct Assembly {
    endpoint: Endpoint,
    n: u16,
    logprobs: Logprobs,
    choices: Vec<Choice>,
    /// Prompts (slots) whose samples are all done.
    slots_done: usize,
    slots: usize,
    first_token_seen: bool,
    received: Instant,
}

fn finish_name(r: FinishReason) -> &'static str {
    match r {
        FinishReason::Stop => "stop",
        FinishReason::Length | FinishReason::ContextLength => "length",
        // Cancelled only happens when the HTTP client left; error/shutdown fail the request.
        FinishReason::Cancelled => "stop",
        FinishReason::Error | FinishReason::Shutdown => "error",
    }
}

impl Assembly {
    fn new(req: &ParsedRequest, received: Instant) -> Assembly {
        let slots = req.prompts.len();
        let n = req.params.n_samples;
        Assembly {
            endpoint: req.endpoint,
            n,
            logprobs: req.logprobs,
            choices: (0..slots * usize::from(n))
                .map(|_| Choice::default())
                .collect(),
            slots_done: 0,
            slots,
            first_token_seen: false,
            received,
        }
    }

    fn top(&self) -> u8 {
        match self.logprobs {
            Logprobs::Off => 0,
            Logprobs::On { top } => top,
        }
    }

    /// Apply one event; returns the choice index it touched, or the request's failure.
    fn apply(&mut self, state: &AppState, (slot, event): Labelled) -> Result<usize, Failure> {
        let base = slot as usize * usize::from(self.n);
        let index = |sample: u16| base + usize::from(sample);
        match event {
            GenEvent::Failed(f) => Err(f),
            GenEvent::Tokens {
                sample,
                ids,
                logprobs,
            } => {
                let c = &mut self.choices[index(sample)];
                c.ids.extend_from_slice(&ids);
                c.logprobs.extend_from_slice(&logprobs);
                Ok(index(sample))
            }
            GenEvent::TopLogprobs {
                sample,
                position,
                ids,
                logprobs,
            } => {
                let c = &mut self.choices[index(sample)];
                let pos = position as usize;
                if c.top.len() <= pos {
                    c.top.resize(pos + 1, None);
                }
                c.top[pos] = Some(ids.into_iter().zip(logprobs).collect());
                Ok(index(sample))
            }
            GenEvent::Text { sample, text } => {
                if !self.first_token_seen {
                    self.first_token_seen = true;
                    state
                        .metrics
                        .time_to_first_token
                        .observe(self.received.elapsed());
                }
                let c = &mut self.choices[index(sample)];
                c.text.push_str(&text);
                c.pending_text.push_str(&text);
                Ok(index(sample))
            }
            GenEvent::Done {
                sample,
                reason,
                timings,
            } => {
                match reason {
                    FinishReason::Error => {
                        return Err(Failure::Other(
                            "the daemon failed this sample (see its log)".into(),
                        ));
                    }
                    FinishReason::Shutdown => return Err(Failure::ShuttingDown),
                    _ => {}
                }
                let c = &mut self.choices[index(sample)];
                c.finish = Some(reason);
                c.generated = timings.generated_tokens;
                c.prompt_tokens = timings.prompt_tokens;
                state.metrics.inter_token.observe_n(
                    timings.inter_token(),
                    u64::from(timings.generated_tokens.saturating_sub(1)),
                );
                let all =
                    (base..base + usize::from(self.n)).all(|i| self.choices[i].finish.is_some());
                if all {
                    self.slots_done += 1;
                }
                Ok(index(sample))
            }
        }
    }

    fn complete(&self) -> bool {
        self.slots_done == self.slots
    }

    fn usage(&self) -> Value {
        // Samples of one prompt share it: count each prompt once.
        let prompt: u64 = (0..self.slots)
            .map(|s| u64::from(self.choices[s * usize::from(self.n)].prompt_tokens))
            .sum();
        let completion: u64 = self.choices.iter().map(|c| u64::from(c.generated)).sum();
        json!({
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        })
    }

    fn token_counts(&self) -> (u64, u64) {
        let u = self.usage();
        (
            u["prompt_tokens"].as_u64().unwrap_or(0),
            u["completion_tokens"].as_u64().unwrap_or(0),
        )
    }

    /// Token ids (sampled and alternatives) of entries `from..to` of choice `i`.
    fn entry_ids(&self, i: usize, from: usize, to: usize) -> Vec<u32> {
        let c = &self.choices[i];
        let mut ids: Vec<u32> = c.ids[from..to].to_vec();
        for top in c.top.iter().take(to).skip(from).flatten() {
            ids.extend(top.iter().map(|&(id, _)| id));
        }
        ids.sort_unstable();
        ids.dedup();
        ids
    }

    /// Log-probability entries `from..to` of choice `i`, in the endpoint's shape.
    fn logprobs_json(&self, names: &TokenNames, i: usize, from: usize, to: usize) -> Value {
        let c = &self.choices[i];
        let lp = |k: usize| c.logprobs.get(k).copied().map(f64::from);
        let alternatives =
            |k: usize| -> Vec<(u32, f32)> { c.top.get(k).cloned().flatten().unwrap_or_default() };
        match self.endpoint {
            Endpoint::Chat => {
                let content: Vec<Value> = (from..to)
                    .map(|k| {
                        let name = token_name(names, c.ids[k]);
                        json!({
                            "token": name,
                            "logprob": lp(k),
                            "bytes": name.as_bytes(),
                            "top_logprobs": alternatives(k).iter().map(|&(id, l)| {
                                let n = token_name(names, id);
                                json!({"token": n, "logprob": l, "bytes": n.as_bytes()})
                            }).collect::<Vec<_>>(),
                        })
                    })
                    .collect();
                json!({ "content": content })
            }
            Endpoint::Completions => {
                let tokens: Vec<String> = (from..to).map(|k| token_name(names, c.ids[k])).collect();
                let lps: Vec<Option<f64>> = (from..to).map(lp).collect();
                let top: Vec<Value> = (from..to)
                    .map(|k| {
                        let map: serde_json::Map<String, Value> = alternatives(k)
                            .iter()
                            .map(|&(id, l)| (token_name(names, id), json!(l)))
                            .collect();
                        Value::Object(map)
                    })
                    .collect();
                json!({
                    "tokens": tokens,
                    "token_logprobs": lps,
                    "top_logprobs": if self.top() > 0 { json!(top) } else { Value::Null },
                })
            }
        }
    }
}

fn created() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn response_id(endpoint: Endpoint) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let prefix = match endpoint {
        Endpoint::Chat => "chatcmpl",
        Endpoint::Completions => "cmpl",
    };
    format!(
        "{prefix}-{:x}{:08x}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// Run a parsed request to its response.
pub async fn respond(
    state: Arc<AppState>,
    req: ParsedRequest,
    model: String,
    received: Instant,
) -> Result<Response, ApiError> {
    let prompt_param = match req.endpoint {
        Endpoint::Chat => "messages",
        Endpoint::Completions => "prompt",
    };
    let mut submitted = state.pool.submit(req.prompts.clone(), &req.params);
    let mut asm = Assembly::new(&req, received);
    if !req.stream {
        while !asm.complete() {
            let Some(ev) = submitted.events.recv().await else {
                return Err(ApiError::from_failure(&Failure::DaemonGone, prompt_param));
            };
            asm.apply(&state, ev)
                .map_err(|f| ApiError::from_failure(&f, prompt_param))?;
        }
        submitted.guard.finished();
        let (p, c) = asm.token_counts();
        state.metrics.tokens(p, c);
        let names = if asm.logprobs == Logprobs::Off {
            TokenNames::new()
        } else {
            let mut ids: Vec<u32> = (0..asm.choices.len())
                .flat_map(|i| asm.entry_ids(i, 0, asm.choices[i].ready(asm.top())))
                .collect();
            ids.sort_unstable();
            ids.dedup();
            resolve_names(&state, ids).await
        };
        return Ok(axum::Json(whole_response(&asm, &names, &model)).into_response());
    }
    // Stream: hold the headers until the first event so a refused request still gets its
    // HTTP status instead of a 200 with an error inside.
    let first = submitted.events.recv().await;
    let first = match first {
        None => return Err(ApiError::from_failure(&Failure::DaemonGone, prompt_param)),
        Some((_, GenEvent::Failed(f))) => {
            submitted.guard.finished();
            return Err(ApiError::from_failure(&f, prompt_param));
        }
        Some(ev) => ev,
    };
    let stream = SseStream {
        state,
        submitted,
        asm,
        id: response_id(req.endpoint),
        model,
        created: created(),
        include_usage: req.include_usage,
        out: VecDeque::new(),
        first: Some(first),
        ended: false,
    };
    let body = Body::from_stream(futures_util::stream::unfold(stream, |mut s| async move {
        s.next_frame()
            .await
            .map(|frame| (Ok::<Bytes, std::convert::Infallible>(frame), s))
    }));
    let mut resp = Response::new(body);
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    Ok(resp)
}

fn whole_response(asm: &Assembly, names: &TokenNames, model: &str) -> Value {
    let logprobs_on = asm.logprobs != Logprobs::Off;
    let choices: Vec<Value> = asm
        .choices
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let lp = if logprobs_on {
                asm.logprobs_json(names, i, 0, c.ready(asm.top()))
            } else {
                Value::Null
            };
            let finish = c.finish.map(finish_name);
            match asm.endpoint {
                Endpoint::Chat => json!({
                    "index": i,
                    "message": {"role": "assistant", "content": c.text},
                    "logprobs": lp,
                    "finish_reason": finish,
                }),
                Endpoint::Completions => json!({
                    "index": i,
                    "text": c.text,
                    "logprobs": lp,
                    "finish_reason": finish,
                }),
            }
        })
        .collect();
    let object = match asm.endpoint {
        Endpoint::Chat => "chat.completion",
        Endpoint::Completions => "text_completion",
    };
    json!({
        "id": response_id(asm.endpoint),
        "object": object,
        "created": created(),
        "model": model,
        "choices": choices,
        "usage": asm.usage(),
    })
}

/// The SSE body's state; dropping it (the HTTP client went away) drops the cancel guard.
struct SseStream {
    state: Arc<AppState>,
    submitted: Submitted,
    asm: Assembly,
    id: String,
    model: String,
    created: u64,
    include_usage: bool,
    out: VecDeque<Bytes>,
    first: Option<Labelled>,
    ended: bool,
}

impl Drop for SseStream {
    fn drop(&mut self) {
        if !self.asm.complete() && !self.ended {
            self.state.metrics.cancelled();
        }
    }
}

impl SseStream {
    async fn next_frame(&mut self) -> Option<Bytes> {
        loop {
            if let Some(frame) = self.out.pop_front() {
                return Some(frame);
            }
            if self.ended {
                return None;
            }
            let ev = match self.first.take() {
                Some(ev) => Some(ev),
                None => self.submitted.events.recv().await,
            };
            let Some(ev) = ev else {
                self.fail(&Failure::DaemonGone);
                continue;
            };
            match self.asm.apply(&self.state, ev) {
                Err(f) => self.fail(&f),
                Ok(i) => {
                    let names = if self.asm.logprobs == Logprobs::Off {
                        TokenNames::new()
                    } else {
                        let c = &self.asm.choices[i];
                        let ids = self.asm.entry_ids(i, c.sent, c.ready(self.asm.top()));
                        resolve_names(&self.state, ids).await
                    };
                    self.emit_choice(i, &names);
                    if self.asm.complete() {
                        self.finish();
                    }
                }
            }
        }
    }

    fn chunk(&self, choices: Vec<Value>) -> Value {
        let object = match self.asm.endpoint {
            Endpoint::Chat => "chat.completion.chunk",
            Endpoint::Completions => "text_completion",
        };
        let mut v = json!({
            "id": self.id,
            "object": object,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        });
        if self.include_usage {
            v["usage"] = Value::Null;
        }
        v
    }

    fn push(&mut self, v: &Value) {
        self.out.push_back(Bytes::from(format!("data: {v}\n\n")));
    }

    /// Send what choice `i` has ready: its opening delta, new text and log-probabilities, and
    /// its finish reason once known.
    fn emit_choice(&mut self, i: usize, names: &TokenNames) {
        let top = self.asm.top();
        let logprobs_on = self.asm.logprobs != Logprobs::Off;
        let (text, from, to, finish, opening) = {
            let c = &mut self.asm.choices[i];
            let opening = !c.started;
            c.started = true;
            let to = if logprobs_on { c.ready(top) } else { c.sent };
            let from = c.sent;
            c.sent = to;
            (
                std::mem::take(&mut c.pending_text),
                from,
                to,
                c.finish,
                opening,
            )
        };
        if self.asm.endpoint == Endpoint::Chat && opening {
            let v = self.chunk(vec![json!({
                "index": i,
                "delta": {"role": "assistant", "content": ""},
                "logprobs": null,
                "finish_reason": null,
            })]);
            self.push(&v);
        }
        if !text.is_empty() || to > from {
            let lp = if logprobs_on && to > from {
                self.asm.logprobs_json(names, i, from, to)
            } else {
                Value::Null
            };
            let choice = match self.asm.endpoint {
                Endpoint::Chat => json!({
                    "index": i, "delta": {"content": text}, "logprobs": lp, "finish_reason": null,
                }),
                Endpoint::Completions => json!({
                    "index": i, "text": text, "logprobs": lp, "finish_reason": null,
                }),
            };
            let v = self.chunk(vec![choice]);
            self.push(&v);
        }
        if let Some(reason) = finish {
            let choice = match self.asm.endpoint {
                Endpoint::Chat => json!({
                    "index": i, "delta": {}, "logprobs": null, "finish_reason": finish_name(reason),
                }),
                Endpoint::Completions => json!({
                    "index": i, "text": "", "logprobs": null, "finish_reason": finish_name(reason),
                }),
            };
            let v = self.chunk(vec![choice]);
            self.push(&v);
        }
    }

    fn finish(&mut self) {
        self.submitted.guard.finished();
        let (p, c) = self.asm.token_counts();
        self.state.metrics.tokens(p, c);
        if self.include_usage {
            let mut v = self.chunk(Vec::new());
            v["usage"] = self.asm.usage();
            self.push(&v);
        }
        self.out.push_back(Bytes::from_static(b"data: [DONE]\n\n"));
        self.ended = true;
    }

    /// The request failed after the stream started: an OpenAI-shaped error event (as vLLM
    /// sends), then the end of the stream.
    fn fail(&mut self, f: &Failure) {
        // The guard stays armed: samples of this request still running are cancelled.
        let e = ApiError::from_failure(f, "prompt");
        self.push(&e.body());
        self.out.push_back(Bytes::from_static(b"data: [DONE]\n\n"));
        self.ended = true;
    }
}

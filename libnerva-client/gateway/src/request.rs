//! Parsing OpenAI request bodies into the client library's [`GenerateParams`].
//!
//! Fields are read one by one from the JSON object so every error names its parameter (a
//! derive would report "invalid type at line 1 column 40"). Unknown fields are ignored, as
//! OpenAI's SDKs send fields a server may not know; fields we know and cannot honour are
//! refused with 400.

use nerva_client::{GenerateParams, MAX_SAMPLES, MAX_TOP_LOGPROBS};
use serde_json::{Map, Value};

use crate::daemon::PromptInput;
use crate::error::ApiError;

/// Most stop strings (the wire's limit).
const MAX_STOP_STRINGS: usize = 16;

/// Which endpoint a body is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// `/v1/chat/completions`.
    Chat,
    /// `/v1/completions`.
    Completions,
}

/// How log-probabilities are reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Logprobs {
    /// Not asked.
    Off,
    /// Asked, with this many alternatives per token.
    On {
        /// Alternatives per token (0..=20).
        top: u8,
    },
}

/// A parsed request.
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedRequest {
    /// Which endpoint.
    pub endpoint: Endpoint,
    /// The `model` field.
    pub model: String,
    /// One entry per prompt (chat: one).
    pub prompts: Vec<PromptInput>,
    /// Sampling and stopping, with `n_samples = n`.
    pub params: GenerateParams,
    /// Stream over SSE.
    pub stream: bool,
    /// `stream_options.include_usage`.
    pub include_usage: bool,
    /// Log-probabilities.
    pub logprobs: Logprobs,
}

fn field<'a>(obj: &'a Map<String, Value>, name: &str) -> Option<&'a Value> {
    obj.get(name).filter(|v| !v.is_null())
}

fn number(obj: &Map<String, Value>, name: &'static str) -> Result<Option<f64>, ApiError> {
    match field(obj, name) {
        None => Ok(None),
        Some(v) => v
            .as_f64()
            .filter(|f| f.is_finite())
            .map(Some)
            .ok_or_else(|| ApiError::invalid(name, format!("'{name}' must be a number"))),
    }
}

fn ranged(
    obj: &Map<String, Value>,
    name: &'static str,
    lo: f64,
    hi: f64,
) -> Result<Option<f32>, ApiError> {
    match number(obj, name)? {
        None => Ok(None),
        Some(f) if (lo..=hi).contains(&f) => Ok(Some(f as f32)),
        Some(f) => Err(ApiError::invalid(
            name,
            format!("'{name}' must be in [{lo}, {hi}], got {f}"),
        )),
    }
}

fn integer(obj: &Map<String, Value>, name: &'static str) -> Result<Option<i64>, ApiError> {
    match field(obj, name) {
        None => Ok(None),
        Some(v) => v
            .as_i64()
            .or_else(|| v.as_u64().map(|u| u as i64))
            .map(Some)
            .ok_or_else(|| ApiError::invalid(name, format!("'{name}' must be an integer"))),
    }
}

fn int_in(
    obj: &Map<String, Value>,
    name: &'static str,
    lo: i64,
    hi: i64,
) -> Result<Option<i64>, ApiError> {
    match integer(obj, name)? {
        None => Ok(None),
        Some(i) if (lo..=hi).contains(&i) => Ok(Some(i)),
        Some(i) => Err(ApiError::invalid(
            name,
            format!("'{name}' must be in [{lo}, {hi}], got {i}"),
        )),
    }
}

fn boolean(obj: &Map<String, Value>, name: &'static str) -> Result<Option<bool>, ApiError> {
    match field(obj, name) {
        None => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err(ApiError::invalid(
            name,
            format!("'{name}' must be true or false"),
        )),
    }
}

fn stop_strings(obj: &Map<String, Value>) -> Result<Vec<String>, ApiError> {
    let bad = |m: &str| ApiError::invalid("stop", m.to_string());
    let list = match field(obj, "stop") {
        None => return Ok(Vec::new()),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => a
            .iter()
            .map(|v| {
                v.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| bad("'stop' must be a string or an array of strings"))
            })
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(bad("'stop' must be a string or an array of strings")),
    };
    if list.len() > MAX_STOP_STRINGS {
        return Err(bad(&format!(
            "'stop' has {} strings; at most {MAX_STOP_STRINGS} are supported",
            list.len()
        )));
    }
    if list.iter().any(String::is_empty) {
        return Err(bad("'stop' strings must not be empty"));
    }
    if list.iter().any(|s| s.len() > 256) {
        return Err(bad("'stop' strings must be at most 256 bytes"));
    }
    Ok(list)
}

/// Fields OpenAI defines that this server cannot honour: refused rather than ignored.
fn refuse_unsupported(obj: &Map<String, Value>, endpoint: Endpoint) -> Result<(), ApiError> {
    let refuse = |name: &'static str, why: &str| {
        Err(ApiError::invalid(
            name,
            format!("'{name}' is not supported by this server: {why}"),
        ))
    };
    if let Some(b) = field(obj, "logit_bias")
        && b.as_object().is_none_or(|m| !m.is_empty())
    {
        return refuse("logit_bias", "the daemon has no per-token bias");
    }
    if field(obj, "tools").is_some_and(|t| t.as_array().is_none_or(|a| !a.is_empty())) {
        return refuse("tools", "no tool calling");
    }
    if let Some(rf) = field(obj, "response_format")
        && rf.get("type").and_then(Value::as_str) != Some("text")
    {
        return refuse("response_format", "only {\"type\": \"text\"}");
    }
    if endpoint == Endpoint::Completions {
        if boolean(obj, "echo")? == Some(true) {
            return refuse("echo", "the prompt is not echoed");
        }
        if integer(obj, "best_of")?.is_some_and(|b| b > 1) {
            return refuse("best_of", "use 'n'");
        }
        if field(obj, "suffix").is_some() {
            return refuse("suffix", "no insertion mode");
        }
    }
    Ok(())
}

fn chat_messages(obj: &Map<String, Value>) -> Result<String, ApiError> {
    let bad = |m: String| ApiError::invalid("messages", m);
    let Some(Value::Array(list)) = field(obj, "messages") else {
        return Err(bad(
            "'messages' must be a non-empty array of messages".into()
        ));
    };
    if list.is_empty() {
        return Err(bad("'messages' must not be empty".into()));
    }
    let mut out = Vec::with_capacity(list.len());
    for (i, m) in list.iter().enumerate() {
        let Some(role) = m.get("role").and_then(Value::as_str) else {
            return Err(bad(format!("messages[{i}].role must be a string")));
        };
        // Content parts are flattened to their text: the daemon's templates take strings.
        let content = match m.get("content") {
            None | Some(Value::Null) => String::new(),
            Some(Value::String(s)) => s.clone(),
            Some(Value::Array(parts)) => {
                let mut text = String::new();
                for part in parts {
                    match (
                        part.get("type").and_then(Value::as_str),
                        part.get("text").and_then(Value::as_str),
                    ) {
                        (Some("text"), Some(t)) => text.push_str(t),
                        _ => {
                            return Err(bad(format!(
                                "messages[{i}].content: only text parts are supported"
                            )));
                        }
                    }
                }
                text
            }
            Some(_) => {
                return Err(bad(format!(
                    "messages[{i}].content must be a string or an array of text parts"
                )));
            }
        };
        out.push(serde_json::json!({"role": role, "content": content}));
    }
    Ok(Value::Array(out).to_string())
}

fn token_list(v: &[Value]) -> Option<Vec<u32>> {
    v.iter()
        .map(|t| t.as_u64().and_then(|u| u32::try_from(u).ok()))
        .collect()
}

fn completion_prompts(obj: &Map<String, Value>) -> Result<Vec<PromptInput>, ApiError> {
    let bad = || {
        ApiError::invalid(
            "prompt",
            "'prompt' must be a non-empty string, an array of strings, an array of token ids \
             or an array of arrays of token ids",
        )
    };
    let prompts = match field(obj, "prompt") {
        Some(Value::String(s)) => vec![PromptInput::Text(s.clone())],
        Some(Value::Array(a)) if !a.is_empty() => {
            if a.iter().all(Value::is_string) {
                a.iter()
                    .filter_map(|v| v.as_str().map(|s| PromptInput::Text(s.to_string())))
                    .collect()
            } else if a.iter().all(Value::is_number) {
                vec![PromptInput::Tokens(token_list(a).ok_or_else(bad)?)]
            } else if a.iter().all(Value::is_array) {
                a.iter()
                    .map(|v| {
                        v.as_array()
                            .filter(|l| !l.is_empty())
                            .and_then(|l| token_list(l))
                            .map(PromptInput::Tokens)
                            .ok_or_else(bad)
                    })
                    .collect::<Result<_, _>>()?
            } else {
                return Err(bad());
            }
        }
        _ => return Err(bad()),
    };
    if prompts
        .iter()
        .any(|p| matches!(p, PromptInput::Text(t) if t.is_empty()))
    {
        return Err(ApiError::invalid("prompt", "prompts must not be empty"));
    }
    Ok(prompts)
}

/// Parse and check a request body. `default_max_tokens` applies when the body names none.
pub fn parse(
    body: &[u8],
    endpoint: Endpoint,
    default_max_tokens: u32,
) -> Result<ParsedRequest, ApiError> {
    let value: Value = serde_json::from_slice(body).map_err(|e| {
        ApiError::new(
            axum::http::StatusCode::BAD_REQUEST,
            "invalid_json",
            format!("the body is not valid JSON: {e}"),
        )
    })?;
    let Value::Object(obj) = value else {
        return Err(ApiError::new(
            axum::http::StatusCode::BAD_REQUEST,
            "invalid_json",
            "the body must be a JSON object",
        ));
    };
    let model = match field(&obj, "model") {
        Some(Value::String(m)) => m.clone(),
        _ => return Err(ApiError::invalid("model", "'model' must be a string")),
    };
    refuse_unsupported(&obj, endpoint)?;
    let prompts = match endpoint {
        Endpoint::Chat => vec![PromptInput::Chat(chat_messages(&obj)?)],
        Endpoint::Completions => completion_prompts(&obj)?,
    };

    let mut p = GenerateParams {
        stream_text: true,
        stream_tokens: false,
        ..GenerateParams::default()
    };
    let max_tokens = match (
        int_in(&obj, "max_completion_tokens", 1, i64::from(u32::MAX))?,
        int_in(&obj, "max_tokens", 1, i64::from(u32::MAX))?,
    ) {
        (Some(m), _) | (None, Some(m)) => m as u32,
        (None, None) => default_max_tokens,
    };
    p.max_tokens = max_tokens;
    p.n_samples = int_in(&obj, "n", 1, i64::from(MAX_SAMPLES))?.unwrap_or(1) as u16;
    p.temperature = ranged(&obj, "temperature", 0.0, 2.0)?.unwrap_or(1.0);
    if let Some(top_p) = number(&obj, "top_p")? {
        if !(top_p > 0.0 && top_p <= 1.0) {
            return Err(ApiError::invalid(
                "top_p",
                format!("'top_p' must be in (0, 1], got {top_p}"),
            ));
        }
        p.top_p = top_p as f32;
    }
    p.presence_penalty = ranged(&obj, "presence_penalty", -2.0, 2.0)?.unwrap_or(0.0);
    p.frequency_penalty = ranged(&obj, "frequency_penalty", -2.0, 2.0)?.unwrap_or(0.0);
    // OpenAI seeds are signed 64-bit; the daemon's stream takes the same bits.
    p.seed = match integer(&obj, "seed")? {
        Some(s) => s as u64,
        None => fresh_seed(),
    };
    p.stop_strings = stop_strings(&obj)?;
    // vLLM-style extensions.
    p.top_k = match int_in(&obj, "top_k", -1, i64::from(u32::MAX))? {
        None | Some(-1) => 0,
        Some(k) => k as u32,
    };
    p.min_p = ranged(&obj, "min_p", 0.0, 1.0)?.unwrap_or(0.0);
    if let Some(r) = number(&obj, "repetition_penalty")? {
        if r <= 0.0 {
            return Err(ApiError::invalid(
                "repetition_penalty",
                format!("'repetition_penalty' must be > 0, got {r}"),
            ));
        }
        p.repetition_penalty = r as f32;
    }
    p.ignore_eos = boolean(&obj, "ignore_eos")?.unwrap_or(false);
    p.priority = int_in(&obj, "priority", -128, 127)?.unwrap_or(0) as i8;

    let logprobs = match endpoint {
        Endpoint::Chat => {
            let on = boolean(&obj, "logprobs")?.unwrap_or(false);
            let top = int_in(&obj, "top_logprobs", 0, i64::from(MAX_TOP_LOGPROBS))?;
            match (on, top) {
                (false, Some(t)) if t > 0 => {
                    return Err(ApiError::invalid(
                        "top_logprobs",
                        "'top_logprobs' requires 'logprobs': true",
                    ));
                }
                (false, _) => Logprobs::Off,
                (true, t) => Logprobs::On {
                    top: t.unwrap_or(0) as u8,
                },
            }
        }
        Endpoint::Completions => match int_in(&obj, "logprobs", 0, i64::from(MAX_TOP_LOGPROBS))? {
            None => Logprobs::Off,
            Some(t) => Logprobs::On { top: t as u8 },
        },
    };
    if let Logprobs::On { top } = logprobs {
        p.logprobs = true;
        p.stream_tokens = true;
        p.top_logprobs = top;
    }

    let stream = boolean(&obj, "stream")?.unwrap_or(false);
    let include_usage = match field(&obj, "stream_options") {
        None => false,
        Some(Value::Object(o)) => boolean(o, "include_usage")
            .map_err(|_| {
                ApiError::invalid(
                    "stream_options",
                    "'stream_options.include_usage' must be true or false",
                )
            })?
            .unwrap_or(false),
        Some(_) => {
            return Err(ApiError::invalid(
                "stream_options",
                "'stream_options' must be an object",
            ));
        }
    };
    if include_usage && !stream {
        return Err(ApiError::invalid(
            "stream_options",
            "'stream_options' is only allowed when 'stream' is true",
        ));
    }
    Ok(ParsedRequest {
        endpoint,
        model,
        prompts,
        params: p,
        stream,
        include_usage,
        logprobs,
    })
}

/// A seed for a request that names none, so unseeded sampling differs between requests.
fn fresh_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat(body: serde_json::Value) -> Result<ParsedRequest, ApiError> {
        parse(body.to_string().as_bytes(), Endpoint::Chat, 64)
    }

    #[test]
    fn chat_fields_map_onto_params() {
        let r = chat(serde_json::json!({
            "model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
            "n": 3, "max_completion_tokens": 7, "temperature": 0.5, "top_p": 0.9, "seed": -1,
            "stop": "x", "presence_penalty": 1, "frequency_penalty": -1, "logprobs": true,
            "top_logprobs": 4, "top_k": 5, "min_p": 0.1, "repetition_penalty": 1.1,
            "ignore_eos": true, "priority": -3, "stream": true,
            "stream_options": {"include_usage": true}, "unknown_field": 1
        }))
        .expect("valid");
        let p = &r.params;
        assert_eq!(
            r.prompts,
            vec![PromptInput::Chat(
                r#"[{"content":"hi","role":"user"}]"#.into()
            )]
        );
        assert_eq!(
            (p.n_samples, p.max_tokens, p.top_k, p.priority),
            (3, 7, 5, -3)
        );
        assert_eq!((p.temperature, p.top_p, p.min_p), (0.5, 0.9, 0.1));
        assert_eq!(p.seed, u64::MAX);
        assert_eq!(p.stop_strings, vec!["x".to_string()]);
        assert!(p.logprobs && p.stream_tokens && p.ignore_eos && r.stream && r.include_usage);
        assert_eq!(r.logprobs, Logprobs::On { top: 4 });
    }

    #[test]
    fn errors_name_the_parameter() {
        let base =
            || serde_json::json!({"model": "m", "messages": [{"role": "user", "content": "x"}]});
        for (key, value, param) in [
            ("temperature", serde_json::json!(3), "temperature"),
            ("temperature", serde_json::json!("hot"), "temperature"),
            ("top_p", serde_json::json!(0), "top_p"),
            ("n", serde_json::json!(0), "n"),
            ("n", serde_json::json!(65), "n"),
            ("max_tokens", serde_json::json!(0), "max_tokens"),
            ("stop", serde_json::json!([1]), "stop"),
            ("stop", serde_json::json!([""]), "stop"),
            ("top_logprobs", serde_json::json!(21), "top_logprobs"),
            ("messages", serde_json::json!([]), "messages"),
            (
                "messages",
                serde_json::json!([{"content": "x"}]),
                "messages",
            ),
            ("logit_bias", serde_json::json!({"1": 5}), "logit_bias"),
            (
                "stream_options",
                serde_json::json!({"include_usage": true}),
                "stream_options",
            ),
            ("priority", serde_json::json!(1000), "priority"),
        ] {
            let mut b = base();
            b[key] = value.clone();
            let e = chat(b).expect_err(&format!("{key}={value} must fail"));
            assert_eq!(e.status.as_u16(), 400);
            assert_eq!(e.param, Some(param), "{key}={value}: {}", e.message);
        }
        let e = parse(b"{", Endpoint::Chat, 1).expect_err("bad json");
        assert_eq!(e.status.as_u16(), 400);
        let e = chat(serde_json::json!({"messages": []})).expect_err("no model");
        assert_eq!(e.param, Some("model"));
    }

    #[test]
    fn completion_prompt_shapes() {
        let prompts = |v: serde_json::Value| {
            parse(
                serde_json::json!({"model": "m", "prompt": v})
                    .to_string()
                    .as_bytes(),
                Endpoint::Completions,
                16,
            )
            .map(|r| r.prompts)
        };
        assert_eq!(
            prompts("a".into()).expect("ok"),
            vec![PromptInput::Text("a".into())]
        );
        assert_eq!(prompts(serde_json::json!(["a", "b"])).expect("ok").len(), 2);
        assert_eq!(
            prompts(serde_json::json!([1, 2])).expect("ok"),
            vec![PromptInput::Tokens(vec![1, 2])]
        );
        assert_eq!(
            prompts(serde_json::json!([[1], [2, 3]])).expect("ok").len(),
            2
        );
        for bad in [
            serde_json::json!([]),
            serde_json::json!(""),
            serde_json::json!([-1]),
            serde_json::json!(5),
        ] {
            assert_eq!(prompts(bad).expect_err("bad").param, Some("prompt"));
        }
        let r = parse(
            br#"{"model":"m","prompt":"x","logprobs":2}"#,
            Endpoint::Completions,
            16,
        )
        .expect("ok");
        assert_eq!(
            (r.logprobs, r.params.max_tokens),
            (Logprobs::On { top: 2 }, 16)
        );
    }
}

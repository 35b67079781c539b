//! `nervactl bench --fork N`: N samples of one prompt as one request (`n_samples`: the
//! prompt is prefilled once and its KV pages are shared by the samples) against the same N
//! requests submitted at once, and one after another.
//!
//! Each mode runs on its own prompt of the same length, so each starts with a cold prefix cache
//! (requests within a mode share their prompt, as the samples of a fork do, and may find its
//! pages cached: the `prefix_hit_pages` column says how many). A mode's peak is the daemon's
//! `kv.pages_peak`, the most KV pages held at once since the pool was last empty, read once
//! the daemon is idle again; the sequential mode reads it after each request (the pool empties
//! between them) and keeps the largest. Wall time runs from the first submission to the last
//! sample's end; for the sequential mode it is the sum of each request's own (the idle checks
//! between requests are left out).

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use nerva_client::{Client, Error, EventRef, GenerateParams, Prompt, Tag};
use serde_json::{Value, json};

use super::bench::{BenchArgs, DaemonFacts, token_prompt, wait_idle, write_out};
use super::table::{Column, Show, Table, col};

/// Columns of the fork comparison's table, one row per mode.
pub const MODE_COLUMNS: [Column; 9] = [
    col("mode", Show::Text),
    col("requests", Show::Number),
    col("samples", Show::Number),
    col("wall_s", Show::Duration),
    col("tokens", Show::Number),
    col("tokens_per_s", Show::Number),
    col("kv_pages_peak", Show::Number),
    col("prefix_hit_pages", Show::Number),
    col("errors", Show::Number),
];

/// The ratios under the table.
pub const RATIO_FIELDS: [(&str, Show); 3] = [
    ("sequential_over_fork", Show::Number),
    ("at_once_over_fork", Show::Number),
    ("kv_pages_peak_at_once_over_fork", Show::Number),
];

/// How the N samples are asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// One request with `n_samples` = N.
    Fork,
    /// N requests, all submitted before the first ends.
    AtOnce,
    /// N requests, each submitted when the previous one ended.
    Sequential,
}

impl Mode {
    const ALL: [Mode; 3] = [Mode::Fork, Mode::AtOnce, Mode::Sequential];

    fn name(self) -> &'static str {
        match self {
            Mode::Fork => "fork",
            Mode::AtOnce => "at_once",
            Mode::Sequential => "sequential",
        }
    }
}

/// What one batch of requests produced.
#[derive(Debug, Default, Clone, Copy)]
struct Outcome {
    tokens: u64,
    errors: u32,
}

/// Submit one request per entry of `requests` on `prompt`, all at once, and wait until every
/// sample of each has ended.
fn submit_and_wait(
    client: &mut Client,
    prompt: &[u32],
    requests: &[GenerateParams],
) -> Result<Outcome, Error> {
    let mut out = Outcome::default();
    // Tag → samples still running.
    let mut left: HashMap<Tag, u16> = HashMap::new();
    let mut next = 0;
    while next < requests.len() || !left.is_empty() {
        while let Some(params) = requests.get(next) {
            match client.submit_generate(Prompt::Tokens(prompt), params) {
                Ok(tag) => {
                    left.insert(tag, params.n_samples);
                    next += 1;
                }
                Err(Error::QueueFull) if !left.is_empty() => break,
                Err(e) => return Err(e),
            }
        }
        if !client.wait(Some(Duration::from_secs(120)))? {
            return Err(Error::Timeout);
        }
        client.poll_with(|e| match e {
            EventRef::Done { tag, timings, .. } => {
                out.tokens += u64::from(timings.generated_tokens);
                if let Some(n) = left.get_mut(&tag) {
                    *n -= 1;
                    if *n == 0 {
                        left.remove(&tag);
                    }
                }
            }
            EventRef::Error { tag, .. } => {
                out.errors += 1;
                left.remove(&tag);
            }
            _ => {}
        })?;
    }
    Ok(out)
}

fn pages_peak(status: &Value) -> Result<u64, Error> {
    status
        .pointer("/kv/pages_peak")
        .and_then(Value::as_u64)
        .ok_or_else(|| {
            Error::Protocol("status lacks kv.pages_peak (a daemon older than this nervactl)".into())
        })
}

fn prefix_hits(client: &mut Client) -> Result<u64, Error> {
    let stats: Value = serde_json::from_str(&client.stats()?)
        .map_err(|e| Error::Protocol(format!("stats is not JSON: {e}")))?;
    Ok(stats
        .pointer("/engine/live/prefix_hit_pages")
        .and_then(Value::as_u64)
        .unwrap_or(0))
}

/// The three modes, in turn, on an idle daemon.
pub fn run(socket: Option<&Path>, a: &BenchArgs, as_json: bool) -> Result<(), Error> {
    let samples = a.fork.unwrap_or(2);
    let (prompt_tokens, max_tokens, seed) = (a.prompt_tokens(), a.max_tokens(), a.seed());
    let mut client = Client::connect(socket)?;
    let facts = DaemonFacts::query(&mut client)?;
    facts.check_lengths(prompt_tokens, max_tokens)?;
    if u32::from(samples) > facts.max_batch {
        return Err(Error::InvalidArgument(format!(
            "--fork {samples}: a request's samples run at once and the daemon runs at most {} \
             sequences (start nervad with --max-batch {samples} or more)",
            facts.max_batch
        )));
    }
    let params = |n_samples: u16, seed: u64| GenerateParams {
        max_tokens,
        temperature: 1.0,
        seed,
        ignore_eos: true,
        n_samples,
        stream_tokens: false,
        stream_text: false,
        ..GenerateParams::default()
    };
    // Sample i of the fork draws with seed + i; request i of the other modes likewise.
    let singles: Vec<GenerateParams> = (0..u64::from(samples))
        .map(|i| params(1, seed.wrapping_add(i)))
        .collect();
    // Keys apart from the sweep's (stream << 32 | request), should both run with one --seed.
    let prompt = |mode: u64| {
        token_prompt(
            seed,
            (1 << 63) | mode,
            prompt_tokens as usize,
            facts.vocab_size,
        )
    };
    let mut modes = Vec::new();
    for (k, mode) in Mode::ALL.into_iter().enumerate() {
        let prompt = prompt(k as u64);
        wait_idle(&mut client)?;
        let hits_before = prefix_hits(&mut client)?;
        let (mut wall, mut outcome, mut peak) = (Duration::ZERO, Outcome::default(), 0);
        match mode {
            Mode::Fork | Mode::AtOnce => {
                let fork = [params(samples, seed)];
                let requests = if mode == Mode::Fork {
                    &fork[..]
                } else {
                    &singles
                };
                let t = Instant::now();
                outcome = submit_and_wait(&mut client, &prompt, requests)?;
                wall = t.elapsed();
                peak = pages_peak(&wait_idle(&mut client)?)?;
            }
            Mode::Sequential => {
                for one in &singles {
                    let t = Instant::now();
                    let o = submit_and_wait(&mut client, &prompt, std::slice::from_ref(one))?;
                    wall += t.elapsed();
                    outcome.tokens += o.tokens;
                    outcome.errors += o.errors;
                    peak = peak.max(pages_peak(&wait_idle(&mut client)?)?);
                }
            }
        }
        let hits = prefix_hits(&mut client)?.saturating_sub(hits_before);
        let wall_s = wall.as_secs_f64();
        modes.push(json!({
            "mode": mode.name(),
            "requests": if mode == Mode::Fork { 1 } else { samples },
            "samples": samples,
            "wall_s": wall_s,
            "tokens": outcome.tokens,
            "tokens_per_s": outcome.tokens as f64 / wall_s,
            "kv_pages_peak": peak,
            "prefix_hit_pages": hits,
            "errors": outcome.errors,
        }));
    }
    let ratio = |key: &str, mode: usize| {
        let (x, base) = (modes[mode][key].as_f64(), modes[0][key].as_f64());
        match (x, base) {
            (Some(x), Some(base)) if base > 0.0 => json!(x / base),
            _ => Value::Null,
        }
    };
    let result = json!({
        "mode": "fork",
        "params": {
            "samples": samples, "prompt_tokens": prompt_tokens, "max_tokens": max_tokens,
            "seed": seed, "temperature": 1.0, "ignore_eos": true,
        },
        "daemon": facts.to_json(),
        "prompt_full_pages": prompt_tokens / facts.page_tokens.max(1),
        "modes": modes,
        "sequential_over_fork": ratio("wall_s", 2),
        "at_once_over_fork": ratio("wall_s", 1),
        "kv_pages_peak_at_once_over_fork": ratio("kv_pages_peak", 1),
    });
    let failed: Vec<String> = modes
        .iter()
        .filter(|m| m["errors"].as_u64().unwrap_or(0) > 0)
        .map(|m| format!("{} requests of mode {}", m["errors"], m["mode"]))
        .collect();
    if !failed.is_empty() {
        // Wall times and peaks of failed requests compare nothing.
        return Err(Error::Protocol(format!(
            "the daemon failed {} (its log says why)",
            failed.join(", ")
        )));
    }
    write_out(a.out.as_deref(), &result)?;
    if as_json {
        println!("{result}");
    } else {
        println!(
            "{} on {}: {samples} samples of a {prompt_tokens}-token prompt, {max_tokens} new \
             tokens each (ignore_eos); the prompt fills {} KV pages of {} tokens",
            facts.identity["model"].as_str().unwrap_or("?"),
            facts.identity["backend"].as_str().unwrap_or("?"),
            result["prompt_full_pages"],
            facts.page_tokens
        );
        let mut t = Table::new(&MODE_COLUMNS);
        for m in result["modes"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default()
        {
            t.object_row(&MODE_COLUMNS, m);
        }
        t.print();
        println!();
        let mut t = Table::fields();
        t.fields_of(&result, &RATIO_FIELDS);
        t.print();
    }
    Ok(())
}

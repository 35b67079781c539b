//! `nervactl generate`: stream one generation.

use std::io::Write;
use std::path::Path;

use super::table::{Column, Show, Table, col, human_bytes, human_duration_ns};
use clap::Args;
use nerva_client::{Client, Error, EventRef, GenerateParams, Prompt, status_code};

/// Sampling and stopping flags.
#[derive(Debug, Args)]
pub struct GenerateArgs {
    /// The prompt (text; with --tokens comma-separated ids; with --chat a JSON message array).
    /// `-` reads it from stdin, `@FILE` from a file.
    pub prompt: String,
    /// Treat the prompt as comma-separated token ids.
    #[arg(long, conflicts_with = "chat")]
    pub tokens: bool,
    /// Treat the prompt as a JSON array of {"role","content"} messages.
    #[arg(long)]
    pub chat: bool,
    /// Most tokens to generate per sample.
    #[arg(long, default_value_t = 128)]
    pub max_tokens: u32,
    /// Temperature (0 = greedy).
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    /// Top-k (0 = off).
    #[arg(long, default_value_t = 0)]
    pub top_k: u32,
    /// Top-p (1 = off).
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    /// Min-p (0 = off).
    #[arg(long, default_value_t = 0.0)]
    pub min_p: f32,
    /// Repetition penalty (1 = off).
    #[arg(long, default_value_t = 1.0)]
    pub repetition_penalty: f32,
    /// Presence penalty (0 = off).
    #[arg(long, default_value_t = 0.0)]
    pub presence_penalty: f32,
    /// Frequency penalty (0 = off).
    #[arg(long, default_value_t = 0.0)]
    pub frequency_penalty: f32,
    /// Seed.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Stop string (repeatable).
    #[arg(long = "stop")]
    pub stop: Vec<String>,
    /// Stop token id (repeatable).
    #[arg(long = "stop-token")]
    pub stop_token: Vec<u32>,
    /// Keep generating past end-of-sequence.
    #[arg(long)]
    pub ignore_eos: bool,
    /// Samples (sample 0 streams; the others print when done).
    #[arg(long, default_value_t = 1)]
    pub n_samples: u16,
    /// Report this many alternatives per token (with --json).
    #[arg(long, default_value_t = 0)]
    pub top_logprobs: u8,
    /// Priority (higher first).
    #[arg(long, default_value_t = 0, allow_hyphen_values = true)]
    pub priority: i8,
    /// Print the log-probability of each generated token (a table after the text; with
    /// --json, a `logprobs` array per sample).
    #[arg(long)]
    pub logprobs: bool,
    /// After the generation, ask the daemon for this request's token ledger: each sample's
    /// sums (a line on stderr) and one row per token (a table after the text; with --json, a
    /// `ledger` array of the samples with their records).
    #[arg(long)]
    pub ledger: bool,
}

/// The prompt text: the argument, stdin for `-`, a file for `@FILE`.
fn read_prompt(arg: &str) -> Result<String, Error> {
    use std::io::Read;
    if arg == "-" {
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .map_err(|e| Error::InvalidArgument(format!("prompt from stdin: {e}")))?;
        return Ok(text);
    }
    if let Some(path) = arg.strip_prefix('@') {
        return std::fs::read_to_string(path)
            .map_err(|e| Error::InvalidArgument(format!("prompt file {path}: {e}")));
    }
    Ok(arg.to_owned())
}

/// A duration as an operator reads it.
fn human(d: std::time::Duration) -> String {
    let us = d.as_secs_f64() * 1e6;
    if us < 1000.0 {
        format!("{us:.0} µs")
    } else if us < 1e6 {
        format!("{:.1} ms", us / 1e3)
    } else {
        format!("{:.2} s", us / 1e6)
    }
}

/// Columns of the `--logprobs` table.
pub const LOGPROB_COLUMNS: [Column; 3] = [
    col("position", Show::Number),
    col("token", Show::Number),
    col("logprob", Show::Number),
];

/// Run it.
pub fn run(
    socket: Option<&Path>,
    a: &GenerateArgs,
    as_json: bool,
    timeout: Option<std::time::Duration>,
) -> Result<(), Error> {
    let prompt_text = read_prompt(&a.prompt)?;
    let deadline = timeout.map(|t| std::time::Instant::now() + t);
    let mut client = Client::connect(socket)?;
    if let Some(t) = timeout {
        client.set_reply_timeout(t);
    }
    let params = GenerateParams {
        user_data: 0,
        max_tokens: a.max_tokens,
        temperature: a.temperature,
        top_k: a.top_k,
        top_p: a.top_p,
        min_p: a.min_p,
        repetition_penalty: a.repetition_penalty,
        presence_penalty: a.presence_penalty,
        frequency_penalty: a.frequency_penalty,
        seed: a.seed,
        stop_strings: a.stop.clone(),
        stop_token_ids: a.stop_token.clone(),
        ignore_eos: a.ignore_eos,
        n_samples: a.n_samples,
        top_logprobs: a.top_logprobs,
        priority: a.priority,
        stream_tokens: as_json || a.logprobs,
        stream_text: true,
        logprobs: a.logprobs,
    };
    let ids: Vec<u32>;
    let prompt = if a.tokens {
        ids = prompt_text
            .split(',')
            .map(|t| t.trim().parse::<u32>())
            .collect::<Result<_, _>>()
            .map_err(|e| Error::InvalidArgument(format!("token ids: {e}")))?;
        Prompt::Tokens(&ids)
    } else if a.chat {
        Prompt::Chat(&prompt_text)
    } else {
        Prompt::Text(&prompt_text)
    };
    let tag = client.submit_generate(prompt, &params)?;
    let n = usize::from(a.n_samples);
    let mut texts = vec![String::new(); n];
    let mut tokens: Vec<Vec<u32>> = vec![Vec::new(); n];
    let mut logprobs: Vec<Vec<f32>> = vec![Vec::new(); n];
    let mut reader_gone = false;
    let mut finished = 0;
    let mut failure: Option<Error> = None;
    let mut summaries = Vec::new();
    let stdout = std::io::stdout();
    while finished < n && failure.is_none() {
        let left = deadline.map(|d| d.saturating_duration_since(std::time::Instant::now()));
        if left.is_some_and(|l| l.is_zero()) {
            return Err(Error::Timeout);
        }
        client.wait(left)?;
        client.poll_with(|e| match e {
            EventRef::Text { sample, text, .. } => {
                let i = usize::from(sample).min(n - 1);
                texts[i].push_str(text);
                if sample == 0 && !as_json && !reader_gone {
                    let mut out = stdout.lock();
                    // A reader that went away (closed pipe) ends the generation.
                    reader_gone = out
                        .write_all(text.as_bytes())
                        .and_then(|()| out.flush())
                        .is_err();
                }
            }
            EventRef::Tokens {
                sample,
                ids,
                logprobs: lps,
                ..
            } => {
                tokens[usize::from(sample).min(n - 1)].extend_from_slice(ids);
                logprobs[usize::from(sample).min(n - 1)].extend_from_slice(lps);
            }
            EventRef::Done {
                sample,
                reason,
                timings,
                ..
            } => {
                finished += 1;
                summaries.push(serde_json::json!({
                    "sample": sample,
                    "finish": reason.name(),
                    "prompt_tokens": timings.prompt_tokens,
                    "generated_tokens": timings.generated_tokens,
                    "queue_us": timings.queue.as_micros() as u64,
                    "ttft_us": timings.time_to_first_token.as_micros() as u64,
                    "inter_token_us": timings.inter_token().as_micros() as u64,
                }));
                if !as_json && sample == 0 {
                    eprintln!(
                        "\n[finish: {} | prompt: {} tokens | generated: {} tokens | queue: {} | first token: {} | inter-token: {}]",
                        reason.name(),
                        timings.prompt_tokens,
                        timings.generated_tokens,
                        human(timings.queue),
                        human(timings.time_to_first_token),
                        human(timings.inter_token())
                    );
                }
            }
            EventRef::Error { status, detail, .. } => {
                failure = Some(match status_code(status) {
                    Some(code) => Error::Refused {
                        status: code,
                        detail: detail.to_owned(),
                    },
                    None => Error::Protocol(format!("status {status}: {detail}")),
                });
            }
            EventRef::Shutdown => {
                failure = Some(Error::ShuttingDown);
            }
            EventRef::TopLogprobs { .. } => {}
        })?;
        if reader_gone {
            // Cancel explicitly (closing would too) and stop without an error.
            let _ = client.cancel(tag);
            return Ok(());
        }
    }
    if let Some(e) = failure {
        return Err(e);
    }
    // The daemon records a sample's ledger before it sends the sample's Done, so every sample
    // of this request is in the daemon's recent samples now.
    let ledger = if a.ledger {
        Some(own_ledger(&mut client, tag.0)?)
    } else {
        None
    };
    if as_json {
        let samples: Vec<_> = (0..n)
            .map(|i| {
                let mut s = serde_json::json!({"text": texts[i], "tokens": tokens[i]});
                if a.logprobs {
                    s["logprobs"] = serde_json::json!(logprobs[i]);
                }
                s
            })
            .collect();
        let mut out = serde_json::json!({"samples": samples, "finished": summaries});
        if let Some(ledger) = ledger {
            out["ledger"] = serde_json::Value::Array(ledger);
        }
        println!("{out}");
    } else {
        for (i, t) in texts.iter().enumerate().skip(1) {
            println!("\n--- sample {i} ---\n{t}");
        }
        if a.logprobs {
            for i in 0..n {
                println!("\n--- sample {i}: log-probabilities ---");
                let mut t = Table::new(&LOGPROB_COLUMNS);
                for (pos, (id, lp)) in tokens[i].iter().zip(&logprobs[i]).enumerate() {
                    let row = serde_json::json!({"position": pos, "token": id,
                                                 "logprob": format!("{lp:.4}")});
                    t.object_row(&LOGPROB_COLUMNS, &row);
                }
                t.print();
            }
        }
        for s in ledger.iter().flatten() {
            print_sample_ledger(s);
        }
    }
    Ok(())
}

/// This client's samples of request `tag` in the daemon's token ledger.
fn own_ledger(client: &mut Client, tag: u64) -> Result<Vec<serde_json::Value>, Error> {
    let reply = client.ledger()?;
    let doc: serde_json::Value = serde_json::from_str(&reply)
        .map_err(|e| Error::Protocol(format!("ledger reply is not JSON: {e}")))?;
    // Slot and generation name this connection (a slot is reused by later connections, and
    // each connection numbers its tags from 1).
    let (slot, generation) = (u64::from(client.slot()), u64::from(client.generation()));
    Ok(doc["samples"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .filter(|s| {
            s["client_slot"].as_u64() == Some(slot)
                && s["client_generation"].as_u64() == Some(generation)
                && s["tag"].as_u64() == Some(tag)
        })
        .cloned()
        .collect())
}

/// A sample's ledger sums as a labelled line on stderr, its records as a table on stdout.
fn print_sample_ledger(s: &serde_json::Value) {
    let ns = |k: &str| human_duration_ns(s[k].as_f64().unwrap_or(0.0));
    let n = |k: &str| s[k].as_u64().unwrap_or(0);
    eprintln!(
        "[ledger, sample {}: {} tokens | wall: {} | lag: {} | gpu: {} | host: {} | steps: {} | launches: {} | graph nodes: {} | syncs hard/policy/debug: {}/{}/{} | h2d: {} | d2h: {}]",
        n("sample"),
        n("tokens"),
        ns("wall_ns"),
        ns("lag_ns"),
        ns("gpu_ns"),
        ns("host_ns"),
        n("steps"),
        n("launches"),
        n("graph_nodes"),
        n("syncs_hard"),
        n("syncs_policy"),
        n("syncs_debug"),
        human_bytes(n("h2d_bytes") as f64),
        human_bytes(n("d2h_bytes") as f64),
    );
    println!("\n--- sample {}: token ledger ---", n("sample"));
    let mut t = Table::new(&super::ledger::RECORD_COLUMNS[3..]);
    for r in s["records"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
    {
        t.object_row(&super::ledger::RECORD_COLUMNS[3..], r);
    }
    t.print();
}

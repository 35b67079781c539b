//! `nervactl bench`: real client processes (this binary re-executed with a hidden
//! subcommand) submitting requests concurrently; the parent aggregates their measurements.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use clap::Args;
use nerva_client::{Client, Error, EventRef, GenerateParams, Prompt, Tag};

use super::display::percentile;
use super::table::{Show, Table};

/// Bench flags.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Client processes.
    #[arg(long, default_value_t = 4)]
    pub procs: u32,
    /// Requests per process.
    #[arg(long, default_value_t = 100)]
    pub requests: u32,
    /// Requests each process keeps in flight.
    #[arg(long, default_value_t = 4)]
    pub concurrency: u32,
    /// Tokens per request.
    #[arg(long, default_value_t = 32)]
    pub max_tokens: u32,
    /// Prompt text (each request appends its index so prompts differ).
    #[arg(long, default_value = "The quick brown fox")]
    pub prompt: String,
}

/// The hidden worker's flags.
#[derive(Debug, Args)]
pub struct WorkerArgs {
    /// Worker index.
    #[arg(long)]
    pub index: u32,
    /// Requests.
    #[arg(long)]
    pub requests: u32,
    /// In flight.
    #[arg(long)]
    pub concurrency: u32,
    /// Tokens per request.
    #[arg(long)]
    pub max_tokens: u32,
    /// Prompt.
    #[arg(long)]
    pub prompt: String,
}

/// One worker process: prints one JSON line with its measurements.
pub fn worker(socket: Option<&Path>, a: &WorkerArgs) -> Result<(), Error> {
    let mut client = Client::connect(socket)?;
    let params = GenerateParams {
        max_tokens: a.max_tokens,
        temperature: 0.0,
        ignore_eos: true,
        stream_tokens: false,
        ..GenerateParams::default()
    };
    let start = Instant::now();
    let mut sent = 0u32;
    let mut done = 0u32;
    let mut errors = 0u32;
    let mut tokens = 0u64;
    let mut started: std::collections::HashMap<Tag, (Instant, Option<Duration>)> =
        std::collections::HashMap::new();
    let mut e2e = Vec::with_capacity(a.requests as usize);
    let mut ttft = Vec::with_capacity(a.requests as usize);
    while done < a.requests {
        while sent < a.requests && sent - done < a.concurrency.max(1) {
            let prompt = format!("{} {}-{}", a.prompt, a.index, sent);
            match client.submit_generate(Prompt::Text(&prompt), &params) {
                Ok(tag) => {
                    started.insert(tag, (Instant::now(), None));
                    sent += 1;
                }
                Err(Error::QueueFull) => break,
                Err(e) => return Err(e),
            }
        }
        client.wait(Some(Duration::from_secs(30)))?;
        client.poll_with(|e| match e {
            EventRef::Text { tag, .. } | EventRef::Tokens { tag, .. } => {
                if let Some((t0, first)) = started.get_mut(&tag) {
                    first.get_or_insert_with(|| t0.elapsed());
                }
            }
            EventRef::Done { tag, timings, .. } => {
                done += 1;
                tokens += u64::from(timings.generated_tokens);
                if let Some((t0, first)) = started.remove(&tag) {
                    e2e.push(t0.elapsed().as_micros() as u64);
                    ttft.push(first.unwrap_or_else(|| t0.elapsed()).as_micros() as u64);
                }
            }
            EventRef::Error { tag, .. } => {
                done += 1;
                errors += 1;
                started.remove(&tag);
            }
            _ => {}
        })?;
    }
    println!(
        "{}",
        serde_json::json!({
            "requests": done, "errors": errors, "tokens": tokens,
            "elapsed_us": start.elapsed().as_micros() as u64, "e2e_us": e2e, "ttft_us": ttft,
        })
    );
    Ok(())
}

/// Rows of the human summary (JSON paths; durations and rates human-scaled).
pub const BENCH_FIELDS: [(&str, Show); 13] = [
    ("requests", Show::Text),
    ("errors", Show::Text),
    ("failed_procs", Show::Text),
    ("tokens", Show::Text),
    ("wall_s", Show::Duration),
    ("requests_per_s", Show::Number),
    ("tokens_per_s", Show::Number),
    ("e2e_us.p50", Show::Duration),
    ("e2e_us.p90", Show::Duration),
    ("e2e_us.p99", Show::Duration),
    ("ttft_us.p50", Show::Duration),
    ("ttft_us.p90", Show::Duration),
    ("ttft_us.p99", Show::Duration),
];

/// Spawn the workers and aggregate.
pub fn run(socket: Option<&Path>, a: &BenchArgs, as_json: bool) -> Result<(), Error> {
    let exe = std::env::current_exe()?;
    let start = Instant::now();
    let mut children = Vec::new();
    for i in 0..a.procs {
        let mut cmd = Command::new(&exe);
        if let Some(s) = socket {
            cmd.arg("--socket").arg(s);
        }
        cmd.args(["bench-worker", "--index", &i.to_string()])
            .args(["--requests", &a.requests.to_string()])
            .args(["--concurrency", &a.concurrency.to_string()])
            .args(["--max-tokens", &a.max_tokens.to_string()])
            .args(["--prompt", &a.prompt])
            .stdout(Stdio::piped());
        children.push(cmd.spawn()?);
    }
    let mut e2e = Vec::new();
    let mut ttft = Vec::new();
    let (mut requests, mut errors, mut tokens, mut failed) = (0u64, 0u64, 0u64, 0u32);
    for mut child in children {
        let out = child.stdout.take();
        let mut line = String::new();
        if let Some(out) = out {
            let _ = BufReader::new(out).read_line(&mut line);
        }
        let ok = child.wait().map(|s| s.success()).unwrap_or(false);
        let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) else {
            failed += 1;
            continue;
        };
        if !ok {
            failed += 1;
        }
        requests += v["requests"].as_u64().unwrap_or(0);
        errors += v["errors"].as_u64().unwrap_or(0);
        tokens += v["tokens"].as_u64().unwrap_or(0);
        for (dst, key) in [(&mut e2e, "e2e_us"), (&mut ttft, "ttft_us")] {
            if let Some(arr) = v[key].as_array() {
                dst.extend(arr.iter().filter_map(|x| x.as_u64()));
            }
        }
    }
    let wall = start.elapsed().as_secs_f64();
    e2e.sort_unstable();
    ttft.sort_unstable();
    let result = serde_json::json!({
        "procs": a.procs, "requests": requests, "errors": errors, "failed_procs": failed,
        "tokens": tokens, "wall_s": wall,
        "requests_per_s": requests as f64 / wall, "tokens_per_s": tokens as f64 / wall,
        "e2e_us": {"p50": percentile(&e2e, 0.5), "p90": percentile(&e2e, 0.9), "p99": percentile(&e2e, 0.99)},
        "ttft_us": {"p50": percentile(&ttft, 0.5), "p90": percentile(&ttft, 0.9), "p99": percentile(&ttft, 0.99)},
    });
    if as_json {
        println!("{result}");
    } else {
        println!(
            "{} procs × {} requests ({} tokens each, {} in flight per proc): {requests} done, {errors} errors, {failed} failed procs",
            a.procs, a.requests, a.max_tokens, a.concurrency
        );
        let mut t = Table::fields();
        t.fields_of(&result, &BENCH_FIELDS);
        t.print();
    }
    if failed > 0 {
        return Err(Error::Protocol(format!("{failed} worker processes failed")));
    }
    Ok(())
}

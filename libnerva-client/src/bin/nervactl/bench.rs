//! `nervactl bench`: real client processes (this binary re-executed with a hidden
//! subcommand) submitting requests concurrently; the parent aggregates their measurements.
//!
//! Three modes: the default (each process submits `--requests`, `--concurrency` at a time),
//! the closed-loop sweep `--streams` ([`super::sweep`]) and the fork comparison `--fork`
//! ([`super::fork`]). The helpers the last two share (the daemon's facts, token-id prompts,
//! the host's monotonic clock, waiting for an idle daemon) live here.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use clap::Args;
use nerva_client::{Client, Error, EventRef, GenerateParams, Prompt, Tag};
use serde_json::Value;

use super::display::percentile;
use super::table::{Show, Table};

/// Bench flags.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Client processes (with --streams: each level's streams are spread evenly over
    /// min(procs, streams) processes).
    #[arg(long, default_value_t = 4, value_parser = parse_positive)]
    pub procs: u32,
    /// Requests per process.
    #[arg(long, default_value_t = 100, conflicts_with_all = ["streams", "fork"])]
    pub requests: u32,
    /// Requests each process keeps in flight.
    #[arg(long, default_value_t = 4, conflicts_with_all = ["streams", "fork"])]
    pub concurrency: u32,
    /// Tokens per request (per sample) [default: 32; 256 with --streams; 128 with --fork].
    #[arg(long, value_parser = parse_positive)]
    pub max_tokens: Option<u32>,
    /// Prompt text (each request appends its index so prompts differ).
    #[arg(long, default_value = "The quick brown fox", conflicts_with_all = ["streams", "fork"])]
    pub prompt: String,
    /// Closed-loop sweep: one level per count of concurrent streams (e.g. 1,8,32,64,128,256);
    /// each stream submits its next request when its previous one finishes. Per level:
    /// aggregate tok/s, inter-token latency and TTFT p50/p99 after the first wave, and the
    /// share of the step roofline.
    #[arg(long, value_delimiter = ',', value_parser = parse_streams, conflicts_with = "fork")]
    pub streams: Option<Vec<u32>>,
    /// Fork comparison: one request of N samples (`n_samples`) against N requests submitted at
    /// once and N one after another, each on its own prompt of the same length: wall time and
    /// peak KV pages of each.
    #[arg(long, value_name = "N", value_parser = parse_samples)]
    pub fork: Option<u16>,
    /// With --streams or --fork: prompts of exactly this many token ids, pseudo-random below
    /// the model's vocabulary and distinct per request, so the prefix cache serves none of
    /// them [default: 512].
    #[arg(long, value_parser = parse_positive)]
    pub prompt_tokens: Option<u32>,
    /// With --streams: measured requests per stream: those it submits once every stream of
    /// the level finished its first (warm-up) request [default: 2 unless --duration is given].
    #[arg(long, requires = "streams", value_parser = parse_positive)]
    pub waves: Option<u32>,
    /// With --streams: seconds each level measures, from when every stream finished its first
    /// request; a stream submits nothing after it once it has run one measured request.
    #[arg(long, requires = "streams", value_parser = crate::parse_seconds)]
    pub duration: Option<Duration>,
    /// With --streams: each request asks for `--max-tokens` × (1 ± this fraction), drawn per
    /// request from the seed (uniform; 0, the default, gives every request the same length).
    /// Spread lengths keep the streams from finishing, and submitting their next prompts, in
    /// step: the closed loop uses none.
    #[arg(long, value_name = "FRACTION", requires = "streams", value_parser = parse_spread)]
    pub max_tokens_spread: Option<f64>,
    /// With --streams: the device's read bandwidth in bytes/s (e.g. 3.35e12) for the roofline,
    /// instead of the daemon's measurement (the CPU backend measures none).
    #[arg(long, value_name = "BYTES_PER_S", requires = "streams", value_parser = parse_rate)]
    pub read_bandwidth: Option<f64>,
    /// With --streams or --fork: seed of the prompts' token ids [default: from the clock and
    /// the pid, so that no two runs share a prompt].
    #[arg(long)]
    pub seed: Option<u64>,
    /// Also write the JSON result to FILE.
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
}

/// A count of at least 1.
fn parse_positive(s: &str) -> Result<u32, String> {
    match s.parse::<u32>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(_) => Err(format!("{s:?} is not a whole number")),
    }
}

/// `--max-tokens-spread`: a fraction in [0, 0.9].
fn parse_spread(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if (0.0..=0.9).contains(&v) => Ok(v),
        _ => Err(format!("{s:?} is not a fraction from 0 to 0.9")),
    }
}

/// One level of `--streams`.
fn parse_streams(s: &str) -> Result<u32, String> {
    match s.trim().parse::<u32>() {
        Ok(0) => Err("a level needs at least 1 stream".into()),
        Ok(n) => Ok(n),
        Err(_) => Err(format!(
            "{s:?} is not a count of streams (e.g. --streams 1,8,32)"
        )),
    }
}

/// Samples of `--fork`: what one request may ask for.
fn parse_samples(s: &str) -> Result<u16, String> {
    let max = nerva_client::MAX_SAMPLES;
    match s.parse::<u16>() {
        Ok(n) if (2..=max).contains(&n) => Ok(n),
        _ => Err(format!(
            "{s:?}: a fork has 2..={max} samples (one request's n_samples)"
        )),
    }
}

/// Bytes per second: a positive, finite number.
fn parse_rate(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
        _ => Err(format!(
            "{s:?} is not a positive number of bytes per second (e.g. 3.35e12)"
        )),
    }
}

impl BenchArgs {
    /// Tokens per request: `--max-tokens`, else the mode's default.
    pub fn max_tokens(&self) -> u32 {
        self.max_tokens.unwrap_or(if self.streams.is_some() {
            256
        } else if self.fork.is_some() {
            128
        } else {
            32
        })
    }

    /// Prompt length of the sweep and the fork comparison.
    pub fn prompt_tokens(&self) -> u32 {
        self.prompt_tokens.unwrap_or(512)
    }

    /// The prompts' seed: `--seed`, else one no earlier run used.
    pub fn seed(&self) -> u64 {
        self.seed.unwrap_or_else(|| {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64);
            nanos ^ (u64::from(std::process::id()) << 40)
        })
    }
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

/// Run the mode the flags ask for.
pub fn run(socket: Option<&Path>, a: &BenchArgs, as_json: bool) -> Result<(), Error> {
    if a.streams.is_some() {
        return super::sweep::run(socket, a, as_json);
    }
    if a.fork.is_some() {
        return super::fork::run(socket, a, as_json);
    }
    if a.prompt_tokens.is_some() || a.seed.is_some() {
        return Err(Error::InvalidArgument(
            "--prompt-tokens and --seed apply to --streams and --fork".into(),
        ));
    }
    run_requests(socket, a, as_json)
}

/// The default mode: spawn the workers and aggregate.
fn run_requests(socket: Option<&Path>, a: &BenchArgs, as_json: bool) -> Result<(), Error> {
    let max_tokens = a.max_tokens();
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
            .args(["--max-tokens", &max_tokens.to_string()])
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
    write_out(a.out.as_deref(), &result)?;
    if as_json {
        println!("{result}");
    } else {
        println!(
            "{} procs × {} requests ({max_tokens} tokens each, {} in flight per proc): {requests} done, {errors} errors, {failed} failed procs",
            a.procs, a.requests, a.concurrency
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

/// Write `result` to `--out FILE`, if given.
pub fn write_out(out: Option<&Path>, result: &Value) -> Result<(), Error> {
    if let Some(path) = out {
        let mut text = serde_json::to_string_pretty(result)
            .map_err(|e| Error::Protocol(format!("result as JSON: {e}")))?;
        text.push('\n');
        std::fs::write(path, text).map_err(|e| {
            Error::Io(std::io::Error::new(
                e.kind(),
                format!("writing {}: {e}", path.display()),
            ))
        })?;
    }
    Ok(())
}

/// What the sweep and the fork comparison need to know about the daemon (from `status`).
#[derive(Debug, Clone)]
pub struct DaemonFacts {
    /// Token ids below this are valid prompt tokens.
    pub vocab_size: u32,
    /// Longest sequence served (prompt + output).
    pub max_context: u32,
    /// Most sequences running at once (`--max-batch`), also the most samples of one request.
    pub max_batch: u32,
    /// Tokens per KV page.
    pub page_tokens: u32,
    /// Bytes of the weights every decode step reads (the daemon's `step_weight_bytes`: an
    /// untied input embedding table, of which a step reads only its tokens' rows, left out;
    /// from a daemon that does not say, all of its weights).
    pub weight_bytes: u64,
    /// Bytes one token takes in the KV pool; `None` from a daemon that does not say.
    pub kv_bytes_per_token: Option<u64>,
    /// The device's read bandwidth measured at the daemon's start; `None` on the CPU.
    pub read_bandwidth: Option<f64>,
    /// Model, backend and device, for the record.
    pub identity: Value,
}

impl DaemonFacts {
    /// Ask the daemon.
    pub fn query(client: &mut Client) -> Result<Self, Error> {
        let status = parse_status(&client.status()?)?;
        let num = |path: &str| -> Result<u64, Error> {
            status
                .pointer(path)
                .and_then(Value::as_u64)
                .ok_or_else(|| Error::Protocol(format!("status lacks {path}")))
        };
        let small = |path: &str| -> Result<u32, Error> {
            u32::try_from(num(path)?).map_err(|_| Error::Protocol(format!("status {path}")))
        };
        Ok(DaemonFacts {
            vocab_size: small("/model/vocab_size")?,
            max_context: small("/model/max_context")?,
            max_batch: small("/model/max_batch")?,
            page_tokens: small("/kv/page_tokens")?,
            weight_bytes: num("/model/step_weight_bytes")
                .or_else(|_| num("/model/weight_bytes"))?,
            kv_bytes_per_token: num("/kv/bytes_per_token").ok().filter(|&b| b > 0),
            read_bandwidth: status["read_bandwidth_bytes_per_s"]
                .as_f64()
                .filter(|b| *b > 0.0),
            identity: serde_json::json!({
                "model": status["model"]["name"],
                "backend": status["backend"],
                "device": status["device"],
            }),
        })
    }

    /// Refuse prompts the daemon cannot serve whole: every request must run to `max_tokens`.
    pub fn check_lengths(&self, prompt_tokens: u32, max_tokens: u32) -> Result<(), Error> {
        if self.vocab_size == 0 {
            return Err(Error::InvalidArgument(
                "the daemon reports no vocabulary to draw prompt tokens from".into(),
            ));
        }
        let need = u64::from(prompt_tokens) + u64::from(max_tokens);
        if need > u64::from(self.max_context) {
            return Err(Error::InvalidArgument(format!(
                "a prompt of {prompt_tokens} tokens plus {max_tokens} new tokens needs a context \
                 of {need}; the daemon serves at most {} (shorten --prompt-tokens or \
                 --max-tokens, or start nervad with a longer --max-context)",
                self.max_context
            )));
        }
        Ok(())
    }

    /// The facts as the result's `daemon` object.
    pub fn to_json(&self) -> Value {
        let mut v = self.identity.clone();
        v["vocab_size"] = self.vocab_size.into();
        v["max_context"] = self.max_context.into();
        v["max_batch"] = self.max_batch.into();
        v["page_tokens"] = self.page_tokens.into();
        v["weight_bytes"] = self.weight_bytes.into();
        v["kv_bytes_per_token"] = self.kv_bytes_per_token.into();
        v["read_bandwidth_bytes_per_s"] = self.read_bandwidth.into();
        v
    }
}

fn parse_status(text: &str) -> Result<Value, Error> {
    serde_json::from_str(text).map_err(|e| Error::Protocol(format!("status is not JSON: {e}")))
}

/// Wait until the daemon serves nothing (no KV page held, nothing running or queued) and
/// return its status then. The figures of a bench mean something only on an otherwise idle
/// daemon, and a KV peak (`kv.pages_peak`, kept per busy period) is read only once the pool
/// is empty again.
pub fn wait_idle(client: &mut Client) -> Result<Value, Error> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let status = parse_status(&client.status()?)?;
        let at = |path: &str| status.pointer(path).and_then(Value::as_u64).unwrap_or(0);
        let (held, running, queued) = (
            at("/kv/pages_used"),
            at("/scheduler/running"),
            at("/scheduler/queued") + at("/scheduler/parked") + at("/scheduler/preempted"),
        );
        if held == 0 && running == 0 && queued == 0 {
            return Ok(status);
        }
        if Instant::now() >= deadline {
            return Err(Error::ResourceExhausted(format!(
                "the daemon is still serving other work after 30 s ({held} KV pages held, \
                 {running} sequences running, {queued} waiting); the bench needs it to itself"
            )));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A prompt of `len` token ids below `vocab`, pseudo-random from `(seed, key)` (splitmix64):
/// prompts of distinct keys differ from their first tokens, so no KV page of one is cached
/// for another.
pub fn token_prompt(seed: u64, key: u64, len: usize, vocab: u32) -> Vec<u32> {
    let mut state = seed;
    let mixed = splitmix64(&mut state);
    state = mixed ^ key.wrapping_mul(0xD1B5_4A32_D192_ED03);
    (0..len)
        .map(|_| (splitmix64(&mut state) % u64::from(vocab.max(1))) as u32)
        .collect()
}

/// Steele, Lea and Flood's SplitMix64 step.
pub fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Nanoseconds on `CLOCK_MONOTONIC`: one clock for every process of the host, so times taken
/// by different worker processes compare.
pub fn monotonic_ns() -> u64 {
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .expect("CLOCK_MONOTONIC is always readable on Linux");
    t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_prompts_are_seeded_distinct_and_in_range() {
        let a = token_prompt(7, 1, 64, 1000);
        assert_eq!(
            a,
            token_prompt(7, 1, 64, 1000),
            "same seed and key, same prompt"
        );
        assert_eq!(a.len(), 64);
        assert!(a.iter().all(|&t| t < 1000));
        assert_ne!(a[..16], token_prompt(7, 2, 64, 1000)[..16], "another key");
        assert_ne!(a[..16], token_prompt(8, 1, 64, 1000)[..16], "another seed");
    }
}

//! `nervactl bench --streams 1,8,32`: a closed-loop sweep. Each level runs S streams spread
//! over worker processes (this binary re-executed as the hidden `bench-stream-worker`); a
//! stream submits its next request when its previous one finished. The workers record, on the
//! host's monotonic clock, when each request was submitted, when each of its tokens arrived
//! (streamed token events) and when it finished; the parent computes the level's figures over
//! its steady-state window:
//!
//! - the window opens when the last stream finished its first (warm-up) request and closes when
//!   the first stream finished its last one: throughout it every stream has a request in flight
//!   (bar the moment between one request's end and the next one's submission);
//! - tok/s: tokens that arrived inside the window, over its length;
//! - inter-token latency (ITL): the gaps between consecutive tokens of one request whose later
//!   token arrived inside the window;
//! - TTFT: the requests submitted inside the window, first token − submission; of that, the
//!   daemon's own view from its `Done` timings: queue (received → first scheduled) and its TTFT
//!   (received → first token sampled), so that the rest is the trip through the rings;
//! - the step roofline: a decode step of B = min(S, max_batch) sequences reads the weights once
//!   and each sequence's KV once, so at the device's read bandwidth it takes
//!   (weight_bytes + B × mean_context × kv_bytes_per_token) / bandwidth and yields B tokens
//!   (weight_bytes: the daemon's step_weight_bytes, what a decode step reads of the weights).
//!   `mean_context` is measured: the context (prompt + earlier output) of every token that
//!   arrived inside the window, averaged. tok/s is quoted as a share of B / step time, and each
//!   ITL percentile as the roofline step time's share of it.

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Duration;

use clap::Args;
use nerva_client::{Client, Error, EventRef, GenerateParams, Prompt, Tag};
use serde_json::{Value, json};

use super::bench::{
    BenchArgs, DaemonFacts, monotonic_ns, splitmix64, token_prompt, wait_idle, write_out,
};
use super::display::percentile;
use super::table::{Column, Show, Table, col};

/// Measured requests per stream when neither `--waves` nor `--duration` is given.
const DEFAULT_WAVES: u32 = 2;

/// A worker that sees no event for this long while requests are in flight gives up.
const STALL_LIMIT: Duration = Duration::from_secs(120);

/// The hidden sweep worker's flags: one process's share of a level's streams.
#[derive(Debug, Args)]
pub struct WorkerArgs {
    /// Level-wide index of this process's first stream.
    #[arg(long)]
    pub first_stream: u32,
    /// Streams this process runs.
    #[arg(long)]
    pub streams: u32,
    /// Prompt length in token ids.
    #[arg(long)]
    pub prompt_tokens: u32,
    /// Tokens per request (the mean, with a spread).
    #[arg(long)]
    pub max_tokens: u32,
    /// Each request's tokens are `max_tokens` × (1 ± this), drawn from the seed.
    #[arg(long, default_value_t = 0.0)]
    pub max_tokens_spread: f64,
    /// Prompt token ids are drawn below this.
    #[arg(long)]
    pub vocab: u32,
    /// Seed of the level's prompts.
    #[arg(long)]
    pub seed: u64,
    /// Measured requests per stream after its first.
    #[arg(long)]
    pub waves: Option<u32>,
    /// Milliseconds after the start past which streams submit nothing (once they have run
    /// their first request and one measured request).
    #[arg(long)]
    pub duration_ms: Option<u64>,
}

/// One request as a worker saw it; times are `CLOCK_MONOTONIC` nanoseconds.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RequestRecord {
    /// Level-wide stream index.
    pub stream: u32,
    /// The stream's n-th request (0: the warm-up wave).
    pub index: u32,
    /// Submitted after every stream of the level finished its first request (the worker had
    /// the parent's `measure`): one of the `--waves` a stream runs before it stops.
    pub measured: bool,
    /// When it was submitted.
    pub submit_ns: u64,
    /// When each of its tokens arrived, in order.
    pub arrivals_ns: Vec<u64>,
    /// When it finished (its `Done` or `Error` event).
    pub done_ns: u64,
    /// It ended with an `Error` event.
    pub error: bool,
    /// The daemon's timings (its `Done` event): received → first scheduled, and received →
    /// first token, in microseconds.
    pub queue_us: u64,
    pub daemon_ttft_us: u64,
}

impl RequestRecord {
    /// The worker's wire form: arrivals relative to the submission.
    fn to_json(&self) -> Value {
        let offsets: Vec<u64> = self
            .arrivals_ns
            .iter()
            .map(|&a| a.saturating_sub(self.submit_ns))
            .collect();
        json!({
            "stream": self.stream, "index": self.index, "submit_ns": self.submit_ns,
            "done_ns": self.done_ns, "error": self.error, "measured": self.measured,
            "arrival_offsets_ns": offsets, "queue_us": self.queue_us,
            "daemon_ttft_us": self.daemon_ttft_us,
        })
    }

    fn from_json(v: &Value) -> Option<Self> {
        let num = |k: &str| v[k].as_u64();
        let submit_ns = num("submit_ns")?;
        Some(RequestRecord {
            stream: u32::try_from(num("stream")?).ok()?,
            index: u32::try_from(num("index")?).ok()?,
            measured: v["measured"].as_bool()?,
            submit_ns,
            arrivals_ns: v["arrival_offsets_ns"]
                .as_array()?
                .iter()
                .map(|o| o.as_u64().map(|o| submit_ns + o))
                .collect::<Option<Vec<u64>>>()?,
            done_ns: num("done_ns")?,
            error: v["error"].as_bool()?,
            queue_us: num("queue_us").unwrap_or(0),
            daemon_ttft_us: num("daemon_ttft_us").unwrap_or(0),
        })
    }
}

#[derive(Debug, Default)]
struct StreamState {
    /// Requests submitted so far.
    submitted: u32,
    /// Of those, submitted after the level's warm point and finished.
    measured: u32,
    /// A request of this stream is in flight.
    busy: bool,
    /// It submits no more.
    finished: bool,
}

/// What the parent says on a worker's stdin after `go`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ParentSignal {
    /// Every stream of the level finished its first request: count from here.
    Measure,
    /// The parent went away (or said something else).
    Gone,
}

/// One worker process, driven by lines on stdin and stdout: connect and say `ready`; on `go`
/// run the streams closed loop; say `warm` once each of its streams finished its first
/// request; on `measure` (every process of the level is warm) count the requests submitted from
/// then on and let each stream stop after `--waves` of them, or at `--duration-ms` after the
/// signal once it has one; finally print one JSON line with every request's record.
pub fn worker(socket: Option<&Path>, a: &WorkerArgs) -> Result<(), Error> {
    let mut client = Client::connect(socket)?;
    let params = GenerateParams {
        max_tokens: a.max_tokens,
        temperature: 0.0,
        ignore_eos: true,
        stream_tokens: true,
        stream_text: false,
        ..GenerateParams::default()
    };
    // Every process of the level connects first, then all start together.
    let mut stdout = std::io::stdout();
    writeln!(stdout, "ready")?;
    stdout.flush()?;
    let mut line = String::new();
    std::io::stdin().read_line(&mut line)?;
    if line.trim() != "go" {
        return Err(Error::Protocol("the bench parent went away".into()));
    }
    let (signal_tx, signals) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let signal = match std::io::stdin().read_line(&mut line) {
            Ok(_) if line.trim() == "measure" => ParentSignal::Measure,
            _ => ParentSignal::Gone,
        };
        let _ = signal_tx.send(signal);
    });
    // Without a bound a stream would never stop; the parent always passes one.
    let waves = a.waves.or(a.duration_ms.is_none().then_some(DEFAULT_WAVES));
    let mut measure_from: Option<u64> = None;
    let mut warm_said = false;
    // Streams whose first request finished.
    let mut warm_streams = 0;
    let mut streams: Vec<StreamState> = (0..a.streams).map(|_| StreamState::default()).collect();
    let mut records: Vec<RequestRecord> = Vec::new();
    // Tag → (stream within this process, record).
    let mut by_tag: HashMap<Tag, (usize, usize)> = HashMap::new();
    let mut last_event = monotonic_ns();
    loop {
        match signals.try_recv() {
            Ok(ParentSignal::Measure) => measure_from = Some(monotonic_ns()),
            Ok(ParentSignal::Gone) => {
                return Err(Error::Protocol("the bench parent went away".into()));
            }
            Err(_) => {}
        }
        if !warm_said && warm_streams == streams.len() {
            writeln!(stdout, "warm")?;
            stdout.flush()?;
            warm_said = true;
        }
        let now = monotonic_ns();
        let deadline = measure_from
            .zip(a.duration_ms)
            .map(|(from, ms)| from + ms * 1_000_000);
        for (k, s) in streams.iter_mut().enumerate() {
            if s.busy || s.finished {
                continue;
            }
            if waves.is_some_and(|w| s.measured >= w)
                || deadline.is_some_and(|d| now >= d && s.measured >= 1)
            {
                s.finished = true;
                continue;
            }
            let stream = a.first_stream + k as u32;
            let index = s.submitted;
            let prompt = token_prompt(
                a.seed,
                (u64::from(stream) << 32) | u64::from(index),
                a.prompt_tokens as usize,
                a.vocab,
            );
            let max_tokens =
                request_max_tokens(a.seed, stream, index, a.max_tokens, a.max_tokens_spread);
            let request = GenerateParams {
                max_tokens,
                ..params.clone()
            };
            let submit_ns = monotonic_ns();
            match client.submit_generate(Prompt::Tokens(&prompt), &request) {
                Ok(tag) => {
                    by_tag.insert(tag, (k, records.len()));
                    records.push(RequestRecord {
                        stream,
                        index,
                        measured: measure_from.is_some(),
                        submit_ns,
                        arrivals_ns: Vec::with_capacity(max_tokens as usize),
                        ..RequestRecord::default()
                    });
                    s.submitted += 1;
                    s.busy = true;
                }
                // Ring or input region full: poll, then submit the rest.
                Err(Error::QueueFull) => break,
                Err(e) => return Err(e),
            }
        }
        if streams.iter().all(|s| s.finished) {
            break;
        }
        if !client.wait(Some(Duration::from_millis(100)))? {
            if monotonic_ns().saturating_sub(last_event) > STALL_LIMIT.as_nanos() as u64 {
                return Err(Error::Timeout);
            }
            continue;
        }
        let got = client.poll_with(|e| {
            let at = monotonic_ns();
            let (tag, error) = match e {
                EventRef::Tokens { tag, ids, .. } => {
                    if let Some(&(_, r)) = by_tag.get(&tag) {
                        records[r]
                            .arrivals_ns
                            .extend(std::iter::repeat_n(at, ids.len()));
                    }
                    return;
                }
                // One sample per request: its Done ends the request.
                EventRef::Done { tag, timings, .. } => {
                    if let Some(&(_, r)) = by_tag.get(&tag) {
                        records[r].queue_us = timings.queue.as_micros() as u64;
                        records[r].daemon_ttft_us = timings.time_to_first_token.as_micros() as u64;
                    }
                    (tag, false)
                }
                EventRef::Error { tag, .. } => (tag, true),
                _ => return,
            };
            if let Some((k, r)) = by_tag.remove(&tag) {
                records[r].done_ns = at;
                records[r].error = error;
                streams[k].busy = false;
                streams[k].measured += u32::from(records[r].measured);
                warm_streams += usize::from(records[r].index == 0);
            }
        })?;
        if got > 0 {
            last_event = monotonic_ns();
        }
    }
    let requests: Vec<Value> = records.iter().map(RequestRecord::to_json).collect();
    writeln!(stdout, "{}", json!({ "requests": requests }))?;
    stdout.flush()?;
    Ok(())
}

/// What a level's roofline needs besides its records.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RooflineInputs {
    /// Bytes of weights every step reads.
    pub weight_bytes: u64,
    /// Bytes of KV one token of context adds to a step's reads.
    pub kv_bytes_per_token: u64,
    /// Read bandwidth, bytes/s.
    pub read_bandwidth: f64,
}

/// The tokens request `index` of `stream` asks for: `base` × (1 + spread × u), u uniform in
/// [-1, 1] from (seed, stream, index), at least 1; `base` itself without a spread.
pub fn request_max_tokens(seed: u64, stream: u32, index: u32, base: u32, spread: f64) -> u32 {
    if spread <= 0.0 {
        return base;
    }
    let mut state =
        seed ^ (u64::from(stream) << 32 | u64::from(index)).wrapping_mul(0xA24B_AED4_963E_E407);
    let u = (splitmix64(&mut state) >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0;
    ((f64::from(base) * (1.0 + spread * u)).round() as u32).max(1)
}

/// Sequences of `streams` that run at once under `max_batch` (0: a daemon that sets none).
fn running(streams: u32, max_batch: u32) -> u32 {
    if max_batch == 0 {
        streams
    } else {
        streams.min(max_batch)
    }
}

fn us(ns: u64) -> f64 {
    ns as f64 / 1e3
}

/// A level's figures (the module docs define them). `max_batch` bounds the sequences a step
/// runs; `roofline` is `None` without a read bandwidth or KV size. The window's figures are
/// null when the level had no steady-state window.
pub fn level_figures(
    records: &[RequestRecord],
    streams: u32,
    prompt_tokens: u32,
    max_batch: u32,
    roofline: Option<RooflineInputs>,
) -> Value {
    let errors = records.iter().filter(|r| r.error).count();
    let measured = records.iter().filter(|r| r.measured).count();
    // Per stream: the end of its first request and of its last.
    let mut ends: BTreeMap<u32, (Option<u64>, (u32, u64))> = BTreeMap::new();
    for r in records {
        let e = ends.entry(r.stream).or_insert((None, (r.index, r.done_ns)));
        if r.index == 0 {
            e.0 = Some(r.done_ns);
        }
        if r.index >= e.1.0 {
            e.1 = (r.index, r.done_ns);
        }
    }
    let window = (ends.len() == streams as usize)
        .then(|| {
            let mut open = 0u64;
            let mut close = u64::MAX;
            for (first, (last_index, last_end)) in ends.values() {
                if *last_index == 0 {
                    return None;
                }
                open = open.max((*first)?);
                close = close.min(*last_end);
            }
            (close > open).then_some((open, close))
        })
        .flatten();
    let mut v = json!({
        "streams": streams,
        "batch": running(streams, max_batch),
        "requests": records.len(),
        "errors": errors,
        "measured_requests": measured,
        "window_s": null, "window_requests": null, "window_tokens": null,
        "tokens_per_s": null, "itl_p50_us": null, "itl_p99_us": null,
        "ttft_p50_us": null, "ttft_p99_us": null, "queue_p50_us": null,
        "queue_p99_us": null, "daemon_ttft_p50_us": null, "mean_context": null,
        "roofline_step_us": null, "roofline_tokens_per_s": null,
        "roofline_pct": null, "itl_p50_pct": null, "itl_p99_pct": null,
    });
    let Some((open, close)) = window else {
        return v;
    };
    let inside = |t: u64| t > open && t <= close;
    let (mut tokens, mut context) = (0u64, 0u64);
    let mut itl = Vec::new();
    let mut ttft = Vec::new();
    let (mut queue, mut daemon_ttft) = (Vec::new(), Vec::new());
    for r in records {
        for (i, &t) in r.arrivals_ns.iter().enumerate() {
            if inside(t) {
                tokens += 1;
                // Token i was computed over the prompt and the i tokens before it.
                context += u64::from(prompt_tokens) + i as u64;
            }
        }
        itl.extend(
            r.arrivals_ns
                .windows(2)
                .filter(|w| inside(w[1]))
                .map(|w| w[1] - w[0]),
        );
        if !r.error
            && r.submit_ns >= open
            && r.submit_ns < close
            && let Some(&first) = r.arrivals_ns.first()
        {
            ttft.push(first.saturating_sub(r.submit_ns));
            queue.push(r.queue_us * 1000);
            daemon_ttft.push(r.daemon_ttft_us * 1000);
        }
    }
    itl.sort_unstable();
    ttft.sort_unstable();
    queue.sort_unstable();
    daemon_ttft.sort_unstable();
    let window_s = (close - open) as f64 / 1e9;
    let tokens_per_s = tokens as f64 / window_s;
    let percentile_us =
        |sorted: &[u64], q: f64| (!sorted.is_empty()).then(|| us(percentile(sorted, q)));
    let (itl_p50, itl_p99) = (percentile_us(&itl, 0.5), percentile_us(&itl, 0.99));
    v["window_s"] = window_s.into();
    v["window_requests"] = records.iter().filter(|r| inside(r.done_ns)).count().into();
    v["window_tokens"] = tokens.into();
    v["tokens_per_s"] = tokens_per_s.into();
    v["itl_p50_us"] = itl_p50.into();
    v["itl_p99_us"] = itl_p99.into();
    v["ttft_p50_us"] = percentile_us(&ttft, 0.5).into();
    v["ttft_p99_us"] = percentile_us(&ttft, 0.99).into();
    v["queue_p50_us"] = percentile_us(&queue, 0.5).into();
    v["queue_p99_us"] = percentile_us(&queue, 0.99).into();
    v["daemon_ttft_p50_us"] = percentile_us(&daemon_ttft, 0.5).into();
    if tokens == 0 {
        return v;
    }
    let mean_context = context as f64 / tokens as f64;
    v["mean_context"] = mean_context.into();
    if let Some(r) = roofline {
        let batch = f64::from(running(streams, max_batch));
        let step_bytes = r.weight_bytes as f64 + batch * mean_context * r.kv_bytes_per_token as f64;
        let step_s = step_bytes / r.read_bandwidth;
        let roofline_tokens_per_s = batch / step_s;
        v["roofline_step_us"] = (step_s * 1e6).into();
        v["roofline_tokens_per_s"] = roofline_tokens_per_s.into();
        v["roofline_pct"] = (100.0 * tokens_per_s / roofline_tokens_per_s).into();
        let share = |itl_us: Option<f64>| {
            itl_us
                .filter(|&t| t > 0.0)
                .map(|t| 100.0 * step_s * 1e6 / t)
        };
        v["itl_p50_pct"] = share(itl_p50).into();
        v["itl_p99_pct"] = share(itl_p99).into();
    }
    v
}

/// Columns of the sweep's table (one row per level; `--json` has every figure).
pub const LEVEL_COLUMNS: [Column; 18] = [
    col("streams", Show::Number),
    col("procs", Show::Number),
    col("requests", Show::Number),
    col("errors", Show::Number),
    col("tokens_per_s", Show::Number),
    col("itl_p50_us", Show::Duration),
    col("itl_p99_us", Show::Duration),
    col("ttft_p50_us", Show::Duration),
    col("ttft_p99_us", Show::Duration),
    col("queue_p50_us", Show::Duration),
    col("queue_p99_us", Show::Duration),
    col("daemon_ttft_p50_us", Show::Duration),
    col("mean_context", Show::Number),
    col("roofline_tokens_per_s", Show::Number),
    col("roofline_pct", Show::Number),
    col("itl_p50_pct", Show::Number),
    col("itl_p99_pct", Show::Number),
    col("preemptions", Show::Number),
];

/// A spawned worker and its pipes.
struct Worker {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
}

impl Worker {
    fn read_line(&mut self) -> String {
        let mut line = String::new();
        // A worker that died reads as an empty line; the caller says which one failed.
        let _ = self.stdout.read_line(&mut line);
        line
    }
}

/// The flags of one level's run.
struct LevelPlan<'a> {
    socket: Option<&'a Path>,
    streams: u32,
    procs: u32,
    prompt_tokens: u32,
    max_tokens: u32,
    max_tokens_spread: f64,
    vocab: u32,
    seed: u64,
    waves: Option<u32>,
    duration: Option<Duration>,
}

/// Run one level: spawn its workers, start them together, gather their records.
fn run_level(plan: &LevelPlan<'_>) -> Result<Vec<RequestRecord>, Error> {
    let exe = std::env::current_exe()?;
    let mut workers = Vec::new();
    let mut first = 0u32;
    for p in 0..plan.procs {
        // Evenly: the first `streams % procs` processes take one more.
        let share = plan.streams / plan.procs + u32::from(p < plan.streams % plan.procs);
        let mut cmd = Command::new(&exe);
        if let Some(s) = plan.socket {
            cmd.arg("--socket").arg(s);
        }
        cmd.args(["bench-stream-worker", "--first-stream", &first.to_string()])
            .args(["--streams", &share.to_string()])
            .args(["--prompt-tokens", &plan.prompt_tokens.to_string()])
            .args(["--max-tokens", &plan.max_tokens.to_string()])
            .args(["--max-tokens-spread", &plan.max_tokens_spread.to_string()])
            .args(["--vocab", &plan.vocab.to_string()])
            .args(["--seed", &plan.seed.to_string()]);
        if let Some(w) = plan.waves {
            cmd.args(["--waves", &w.to_string()]);
        }
        if let Some(d) = plan.duration {
            cmd.args(["--duration-ms", &d.as_millis().max(1).to_string()]);
        }
        let mut child = cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).spawn()?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            return Err(Error::Protocol("worker pipes missing".into()));
        };
        workers.push(Worker {
            child,
            stdin: Some(stdin),
            stdout: BufReader::new(stdout),
        });
        first += share;
    }
    // Each step waits for every worker's line, then signals all of them; a worker that failed
    // ends the level (the others see their stdin close and stop).
    let mut missing = 0;
    for (expect, signal) in [("ready", "go"), ("warm", "measure")] {
        missing = workers
            .iter_mut()
            .map(|w| w.read_line().trim() != expect)
            .filter(|&failed| failed)
            .count();
        for w in &mut workers {
            let sent = missing == 0
                && w.stdin
                    .as_mut()
                    .is_some_and(|stdin| writeln!(stdin, "{signal}").is_ok());
            if !sent || signal == "measure" {
                w.stdin = None;
            }
        }
        if missing > 0 {
            break;
        }
    }
    let mut records = Vec::new();
    let mut failed = 0u32;
    for mut w in workers {
        let line = if missing == 0 {
            w.read_line()
        } else {
            String::new()
        };
        let ok = w.child.wait().map(|s| s.success()).unwrap_or(false);
        let parsed = serde_json::from_str::<Value>(&line).ok().and_then(|v| {
            v["requests"]
                .as_array()?
                .iter()
                .map(RequestRecord::from_json)
                .collect::<Option<Vec<_>>>()
        });
        match parsed {
            Some(r) if ok => records.extend(r),
            _ => failed += 1,
        }
    }
    if missing > 0 {
        return Err(Error::Protocol(format!(
            "{missing} of {} worker processes of the {}-stream level stopped early (their \
             errors are above)",
            plan.procs, plan.streams
        )));
    }
    if failed > 0 {
        return Err(Error::Protocol(format!(
            "{failed} of {} worker processes of the {}-stream level failed (their errors are \
             above)",
            plan.procs, plan.streams
        )));
    }
    Ok(records)
}

fn preemptions(status: &Value) -> u64 {
    status
        .pointer("/scheduler/preemptions")
        .and_then(Value::as_u64)
        .unwrap_or(0)
}

/// The sweep: every level in turn, on an idle daemon.
pub fn run(socket: Option<&Path>, a: &BenchArgs, as_json: bool) -> Result<(), Error> {
    let levels = a.streams.clone().unwrap_or_default();
    let (prompt_tokens, max_tokens, seed) = (a.prompt_tokens(), a.max_tokens(), a.seed());
    let spread = a.max_tokens_spread.unwrap_or(0.0);
    let waves = a.waves.or(a.duration.is_none().then_some(DEFAULT_WAVES));
    let mut client = Client::connect(socket)?;
    let facts = DaemonFacts::query(&mut client)?;
    // The longest a spread can draw must fit too.
    let longest = (f64::from(max_tokens) * (1.0 + spread)).round() as u32;
    facts.check_lengths(prompt_tokens, longest)?;
    let bandwidth = a
        .read_bandwidth
        .map(|b| (b, "flag"))
        .or(facts.read_bandwidth.map(|b| (b, "daemon")));
    let roofline = match (bandwidth, facts.kv_bytes_per_token) {
        (Some((read_bandwidth, _)), Some(kv_bytes_per_token)) => Some(RooflineInputs {
            weight_bytes: facts.weight_bytes,
            kv_bytes_per_token,
            read_bandwidth,
        }),
        _ => None,
    };
    if let Some(&over) = levels.iter().find(|&&s| running(s, facts.max_batch) < s) {
        eprintln!(
            "nervactl bench: {over} streams > the daemon's --max-batch {}: the rest wait in its \
             queue (the roofline counts the {} that run)",
            facts.max_batch, facts.max_batch
        );
    }
    // The result so far: written to --out after every level (`complete` false until the last),
    // so a sweep stopped part-way keeps the levels it finished.
    let sweep_json = |rows: &[Value], complete: bool| {
        json!({
            "mode": "sweep",
            "complete": complete,
            "params": {
                "streams": levels, "procs": a.procs, "prompt_tokens": prompt_tokens,
                "max_tokens": max_tokens, "max_tokens_spread": spread, "waves": waves,
                "duration_s": a.duration.map(|d| d.as_secs_f64()), "seed": seed,
                "temperature": 0.0, "ignore_eos": true,
                "read_bandwidth_bytes_per_s": bandwidth.map(|b| b.0),
                "read_bandwidth_source": bandwidth.map(|b| b.1),
            },
            "daemon": facts.to_json(),
            "levels": rows,
        })
    };
    let mut rows = Vec::new();
    for (i, &streams) in levels.iter().enumerate() {
        let procs = a.procs.min(streams);
        let before = wait_idle(&mut client)?;
        eprintln!(
            "nervactl bench: level {}/{}: {streams} streams over {procs} processes",
            i + 1,
            levels.len()
        );
        let records = run_level(&LevelPlan {
            socket,
            streams,
            procs,
            prompt_tokens,
            max_tokens,
            max_tokens_spread: spread,
            vocab: facts.vocab_size,
            // Each level its own prompts: none is cached from an earlier level.
            seed: seed.wrapping_add(i as u64),
            waves,
            duration: a.duration,
        })?;
        let after = wait_idle(&mut client)?;
        let mut row = level_figures(&records, streams, prompt_tokens, facts.max_batch, roofline);
        row["procs"] = procs.into();
        row["preemptions"] = preemptions(&after)
            .saturating_sub(preemptions(&before))
            .into();
        eprintln!("nervactl bench: {streams} streams: {}", level_summary(&row));
        rows.push(row);
        if i + 1 < levels.len() {
            write_out(a.out.as_deref(), &sweep_json(&rows, false))?;
        }
    }
    let result = sweep_json(&rows, true);
    // Every stream's measured requests start after every stream's first ended, so a level
    // without a window means records went missing: no figures rather than wrong ones.
    let empty: Vec<u64> = rows
        .iter()
        .filter(|r| r["tokens_per_s"].is_null())
        .filter_map(|r| r["streams"].as_u64())
        .collect();
    if !empty.is_empty() {
        return Err(Error::Protocol(format!(
            "no steady-state window at {empty:?} streams: some stream's requests went unrecorded"
        )));
    }
    write_out(a.out.as_deref(), &result)?;
    if as_json {
        println!("{result}");
    } else {
        print_table(&result, &facts);
    }
    Ok(())
}

/// One level's headline figures in a line (progress on stderr while the sweep goes on).
fn level_summary(row: &Value) -> String {
    let num = |k: &str| row[k].as_f64().map_or("-".into(), |v| format!("{v:.0}"));
    let ms = |k: &str| {
        row[k]
            .as_f64()
            .map_or("-".into(), |v| format!("{:.1} ms", v / 1e3))
    };
    format!(
        "{} tok/s ({}% of roofline), ITL p50 {} p99 {}, TTFT p50 {} p99 {} (queued p50 {})",
        num("tokens_per_s"),
        num("roofline_pct"),
        ms("itl_p50_us"),
        ms("itl_p99_us"),
        ms("ttft_p50_us"),
        ms("ttft_p99_us"),
        ms("queue_p50_us"),
    )
}

fn print_table(result: &Value, facts: &DaemonFacts) {
    let p = &result["params"];
    let bound = match (p["waves"].as_u64(), p["duration_s"].as_f64()) {
        (Some(w), Some(d)) => format!("{w} measured requests per stream or {d} s"),
        (Some(w), None) => format!("{w} measured requests per stream"),
        (None, Some(d)) => format!("{d} s per level"),
        (None, None) => String::new(),
    };
    let spread = match p["max_tokens_spread"].as_f64() {
        Some(s) if s > 0.0 => format!(" ± {:.0}%", s * 100.0),
        _ => String::new(),
    };
    println!(
        "{} on {}: prompt {} tokens, {}{spread} new (ignore_eos), closed loop, {bound}, after the \
         first wave",
        facts.identity["model"].as_str().unwrap_or("?"),
        facts.identity["backend"].as_str().unwrap_or("?"),
        p["prompt_tokens"],
        p["max_tokens"],
    );
    let mut t = Table::new(&LEVEL_COLUMNS);
    for row in result["levels"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
    {
        t.object_row(&LEVEL_COLUMNS, row);
    }
    t.print();
    match (
        p["read_bandwidth_bytes_per_s"].as_f64(),
        facts.kv_bytes_per_token,
    ) {
        (Some(bw), Some(_)) => println!(
            "(roofline: weights + batch × MEAN CONTEXT × KV bytes per token read once per step at \
             {} ({}); ROOFLINE PCT: tok/s as % of it; ITL P50/P99 PCT: the roofline step time \
             as % of the ITL; QUEUE: received → first scheduled and DAEMON TTFT: received → \
             first token, as the daemon timed them)",
            super::table::human_byte_rate(bw),
            p["read_bandwidth_source"].as_str().unwrap_or("?")
        ),
        (None, _) => println!(
            "(no roofline: the daemon measured no read bandwidth; pass --read-bandwidth \
             BYTES_PER_S)"
        ),
        (_, None) => println!("(no roofline: the daemon does not report its KV bytes per token)"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    /// A request of `stream` submitted at `submit` ms with tokens every `gap` ms, the first
    /// after `first` ms.
    fn request(
        stream: u32,
        index: u32,
        submit: u64,
        first: u64,
        gap: u64,
        n: u64,
    ) -> RequestRecord {
        let arrivals_ns: Vec<u64> = (0..n).map(|i| (submit + first + i * gap) * MS).collect();
        RequestRecord {
            stream,
            index,
            measured: index > 0,
            submit_ns: submit * MS,
            done_ns: *arrivals_ns.last().unwrap_or(&(submit * MS)),
            arrivals_ns,
            error: false,
            // The daemon queued it for a tenth of its time to the first token.
            queue_us: first * 100,
            daemon_ttft_us: first * 1000,
        }
    }

    #[test]
    fn window_spans_from_the_last_first_wave_to_the_first_last_request() {
        // Stream 0: requests at 0, 50, 100 ms (first token after 10 ms, then every 10 ms, 5
        // tokens: each lasts 50 ms). Stream 1 the same, 20 ms later.
        let mut records = Vec::new();
        for (stream, offset) in [(0, 0), (1, 20)] {
            for index in 0..3 {
                records.push(request(
                    stream,
                    index,
                    offset + 50 * u64::from(index),
                    10,
                    10,
                    5,
                ));
            }
        }
        // Ends: stream 0 at 50, 100, 150 ms; stream 1 at 70, 120, 170 ms: window (70, 150].
        let v = level_figures(&records, 2, 100, 16, None);
        assert_eq!(v["requests"], 6);
        assert_eq!(v["measured_requests"], 4);
        assert!(
            (v["window_s"].as_f64().unwrap() - 0.080).abs() < 1e-9,
            "{v}"
        );
        // Stream 0's tokens at 80..100 and 110..150 ms (8), stream 1's at 80..120 and 130..150
        // (8): 16 tokens in 80 ms.
        assert_eq!(v["window_tokens"], 16);
        assert!((v["tokens_per_s"].as_f64().unwrap() - 16.0 / 0.080).abs() < 1e-6);
        // Gaps are taken within a request only: all 10 ms.
        assert_eq!(v["itl_p50_us"], 10_000.0);
        assert_eq!(v["itl_p99_us"], 10_000.0);
        // Submitted in the window: stream 0 at 100, stream 1 at 70 and 120; TTFT 10 ms each.
        assert_eq!(v["ttft_p50_us"], 10_000.0);
        // The daemon's timings of the same requests.
        assert_eq!(v["queue_p50_us"], 1_000.0);
        assert_eq!(v["daemon_ttft_p50_us"], 10_000.0);
        assert_eq!(v["roofline_pct"], Value::Null, "no bandwidth given");
    }

    #[test]
    fn roofline_counts_weights_once_and_kv_per_sequence() {
        let records: Vec<RequestRecord> = (0..3)
            .map(|index| request(0, index, 100 * u64::from(index), 10, 10, 10))
            .collect();
        let roofline = RooflineInputs {
            weight_bytes: 1_000_000,
            kv_bytes_per_token: 1_000,
            read_bandwidth: 1e9,
        };
        let v = level_figures(&records, 1, 100, 16, Some(roofline));
        // Window (100, 300] ms: the last two requests, 20 tokens at contexts 100..109 each.
        assert_eq!(v["window_tokens"], 20);
        assert!((v["mean_context"].as_f64().unwrap() - 104.5).abs() < 1e-9);
        // Step: (1e6 + 104.5 × 1e3) B at 1 GB/s = 1.1045 ms; achieved 20 tokens in 200 ms.
        let step_us = v["roofline_step_us"].as_f64().unwrap();
        assert!((step_us - 1104.5).abs() < 1e-6, "{v}");
        let pct = v["roofline_pct"].as_f64().unwrap();
        assert!((pct - 100.0 * 100.0 / (1e6 / 1104.5)).abs() < 1e-6, "{v}");
        assert!((v["itl_p50_pct"].as_f64().unwrap() - 100.0 * 1104.5 / 10_000.0).abs() < 1e-6);
    }

    #[test]
    fn no_window_without_a_measured_request_everywhere() {
        let records = vec![request(0, 0, 0, 10, 10, 5), request(1, 0, 0, 10, 10, 5)];
        let v = level_figures(&records, 2, 100, 16, None);
        assert_eq!(v["tokens_per_s"], Value::Null);
        // A stream with no record at all: no window either.
        let records: Vec<RequestRecord> = (0..3)
            .map(|i| request(0, i, 60 * u64::from(i), 10, 10, 5))
            .collect();
        assert_eq!(
            level_figures(&records, 2, 100, 16, None)["tokens_per_s"],
            Value::Null
        );
    }

    #[test]
    fn spread_lengths_are_seeded_bounded_and_centred() {
        assert_eq!(
            request_max_tokens(1, 2, 3, 256, 0.0),
            256,
            "no spread: the base"
        );
        let draws: Vec<u32> = (0..4000)
            .map(|i| request_max_tokens(9, i % 64, i / 64, 256, 0.5))
            .collect();
        assert!(draws.iter().all(|&n| (128..=384).contains(&n)));
        let mean = draws.iter().map(|&n| f64::from(n)).sum::<f64>() / draws.len() as f64;
        assert!((mean - 256.0).abs() < 6.0, "mean {mean}");
        // Spread over the range, not a few values.
        assert!(draws.iter().any(|&n| n < 150) && draws.iter().any(|&n| n > 360));
        assert_eq!(
            request_max_tokens(9, 5, 7, 256, 0.5),
            request_max_tokens(9, 5, 7, 256, 0.5)
        );
        // A request never asks for no token, however short the base.
        assert!((0..200).all(|i| (1..=2).contains(&request_max_tokens(3, i, 0, 1, 0.9))));
    }

    #[test]
    fn records_round_trip_through_the_workers_json() {
        let r = request(3, 2, 1000, 7, 3, 4);
        assert_eq!(RequestRecord::from_json(&r.to_json()), Some(r));
    }
}

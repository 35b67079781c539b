//! CUDA decode against the device's read bandwidth, measured in the same run.
//!
//! ```text
//! cargo bench -p nervad --bench gpu_decode -- --model DIR [--preset qwen3-8b] [--prompt 128]
//!     [--tokens 256] [--batch 1,8] [--mixed 64:960] [--prefill 128,1024]
//! ```
//! Prints (a) the device's streaming read bandwidth (16-byte loads over large buffers, median
//! of 20 passes each, the fastest buffer counted), (b) per batch size, the whole engine
//! decoding: ms/step p50/p99, tok/s, weight bytes read per step, achieved GB/s and its share of
//! (a), launches, graph nodes and syncs per step, (c) per `--mixed` entry, steps that carry a
//! prompt chunk beside decode tokens, (d) per `--prefill` length, one prompt's time to its first
//! token. Without a CUDA device it says so and exits 0.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Parser;
use nervad::backend::cuda::{CudaBackend, CudaOptions, GpuMemory};
use nervad::backend::{Backend, BackendStats};
use nervad::engine::{
    AheadMiss, ClientId, Engine, EngineEvent, EngineModel, EngineOptions, EventSink,
    GenerateRequest, InferenceEngine, Prompt, RequestKey,
};
use nervad::model::generate::{Preset, make_checkpoint};
use nervad::model::{LoadOptions, LoadedModel, ModelConfig};

#[derive(Parser, Debug)]
struct Args {
    /// Hugging Face snapshot directory.
    #[arg(long)]
    model: PathBuf,
    /// Generate this preset into --model first if the directory does not exist.
    #[arg(long)]
    preset: Option<Preset>,
    /// Prompt tokens.
    #[arg(long, default_value_t = 128)]
    prompt: usize,
    /// New tokens per sequence (all timed after 8 warm-up steps).
    #[arg(long, default_value_t = 256)]
    tokens: usize,
    /// Batch sizes to run, comma separated.
    #[arg(long, default_value = "1")]
    batch: String,
    /// CUDA device.
    #[arg(long, default_value_t = 0)]
    device: usize,
    /// Device memory budget.
    #[arg(long, default_value = "0.9")]
    gpu_memory: GpuMemory,
    /// Bandwidth buffers, MiB: each measured, the fastest is the ceiling (on some H200s an
    /// 8 GiB buffer read 10% slower than a 1.25 GiB one, on others not).
    #[arg(long, value_delimiter = ',', default_value = "1024,8192")]
    buffer_mib: Vec<usize>,
    /// Prompt lengths for the prefill table (time to the first token, one request alone).
    #[arg(long, default_value = "128,1024")]
    prefill: String,
    /// Most tokens in one step: prompts are prefilled in chunks of this many (the daemon's
    /// --max-step-tokens; at least the largest batch).
    #[arg(long, default_value_t = 256)]
    max_step_tokens: usize,
    /// Mixed steps to time, comma separated DECODERS:CHUNK pairs (e.g. 64:960): while DECODERS
    /// sequences decode, a CHUNK-token prompt arrives and rides in one step with their decode
    /// tokens (--max-step-tokens must hold both).
    #[arg(long, default_value = "")]
    mixed: String,
    /// Prefill projections through cuBLAS instead of the decode kernels (implied by
    /// --projections gemv|mixed).
    #[arg(long)]
    fast_prefill: bool,
    /// Decode-projection kernels: tensor, gemv or mixed.
    #[arg(long, default_value = "tensor")]
    projections: nervad::backend::cuda::Projections,
    /// Print one JSON line per batch size as well.
    #[arg(long)]
    json: bool,
    /// Passed by `cargo bench`; ignored.
    #[arg(long, hide = true)]
    bench: bool,
}

/// Tokens emitted, in all and per request tag.
#[derive(Default)]
struct Tally {
    tokens: usize,
    per_tag: std::collections::HashMap<u64, usize>,
}

impl Tally {
    /// Whether every request of tags `tags` has emitted at least `n` tokens.
    fn all_have(&self, tags: std::ops::RangeInclusive<u64>, n: usize) -> bool {
        tags.into_iter()
            .all(|t| self.per_tag.get(&t).is_some_and(|&k| k >= n))
    }
}

impl EventSink for Tally {
    fn emit(&mut self, event: EngineEvent<'_>) {
        if let EngineEvent::Tokens { key, ids, .. } = event {
            self.tokens += ids.len();
            *self.per_tag.entry(key.tag).or_default() += ids.len();
        }
    }
}

fn delta(a: BackendStats, b: BackendStats) -> BackendStats {
    BackendStats {
        steps: b.steps - a.steps,
        graph_steps: b.graph_steps - a.graph_steps,
        launches: b.launches - a.launches,
        graph_launches: b.graph_launches - a.graph_launches,
        graph_nodes: b.graph_nodes - a.graph_nodes,
        hard_syncs: b.hard_syncs - a.hard_syncs,
        policy_syncs: b.policy_syncs - a.policy_syncs,
        debug_syncs: b.debug_syncs - a.debug_syncs,
        h2d_bytes: b.h2d_bytes - a.h2d_bytes,
        d2h_bytes: b.d2h_bytes - a.d2h_bytes,
        device_allocs: b.device_allocs - a.device_allocs,
        pinned_allocs: b.pinned_allocs - a.pinned_allocs,
        gpu_ms: b.gpu_ms - a.gpu_ms,
        host_ns: b.host_ns - a.host_ns,
    }
}

/// Submit a greedy request of `prompt` for `max_tokens` tokens (eos ignored) from client slot
/// `slot`.
fn submit(engine: &mut Engine, slot: u32, tag: u64, prompt: Vec<u32>, max_tokens: usize) {
    let key = RequestKey {
        client: ClientId {
            slot,
            generation: 0,
        },
        tag,
    };
    engine
        .submit(GenerateRequest::fixed_length(
            key,
            Prompt::Tokens(prompt),
            max_tokens as u32,
        ))
        .expect("submit");
}

/// A pseudo-random prompt of `n` tokens below `vocab`, distinct per `salt` (prompts that share
/// a whole page would reuse KV pages through the prefix cache).
fn prompt_of(n: usize, salt: u32, vocab: u32) -> Vec<u32> {
    // The salt spread over the high bits first: added as it was, salts a few apart gave nearly
    // the same tokens after the shift, so a prompt's "runs" were one prompt timed again (and
    // a prompt's time depends on its tokens by a few percent on a power-limited card).
    let salt = salt.wrapping_mul(0x9E37_79B9);
    (0..n as u32)
        .map(|i| (i.wrapping_mul(2_246_822_519).wrapping_add(salt) >> 9) % vocab)
        .collect()
}

/// The multiply-adds (×2) of one `n`-token prompt: the projections (each token through every
/// layer's q, k, v, o, gate, up and down weights; the LM head for the last token only) and the
/// causal attention (per layer and query head, q·k and p·v over the positions up to each
/// token's own: n(n + 1)/2 pairs of head_dim each).
fn prompt_flops(c: &ModelConfig, n: usize) -> (f64, f64) {
    let (h, d) = (c.hidden_size as f64, c.head_dim as f64);
    let (q, kv) = (
        c.num_attention_heads as f64 * d,
        c.num_key_value_heads as f64 * d,
    );
    let layer = h * (q + 2.0 * kv) + q * h + 3.0 * h * c.intermediate_size as f64;
    let layers = c.num_hidden_layers as f64;
    let n = n as f64;
    let proj = 2.0 * (n * layers * layer + h * c.vocab_size as f64);
    let attn = 2.0 * 2.0 * layers * q * n * (n + 1.0) / 2.0;
    (proj, attn)
}

/// One `--mixed` entry: `n` sequences decode (after `prompt`-token prompts and 8 warm-up steps)
/// while six `chunk`-token prompts arrive one after another, each riding in one step with their
/// decode tokens. Prints the decode-only step's GPU time, the prompts' time to the first token
/// and the mixed step's GPU time (the GPU time from submission to the first token less the
/// decode-only steps in it).
fn mixed_steps(
    engine: &mut Engine,
    tag: &mut u64,
    n: usize,
    chunk: usize,
    prompt: usize,
    vocab: u32,
    json: bool,
) {
    const RUNS: usize = 6;
    for c in 0..n {
        *tag += 1;
        let salt = (c as u32).wrapping_mul(7_919).wrapping_add(1);
        submit(
            engine,
            c as u32,
            *tag,
            prompt_of(prompt, salt, vocab),
            8 + 16 * RUNS,
        );
    }
    let mut sink = Tally::default();
    let tags = *tag + 1 - n as u64..=*tag;
    while !sink.all_have(tags.clone(), 8) {
        assert!(engine.step(&mut sink), "the requests ended during warm-up");
    }
    // Eight collected decode-only steps (not eight engine calls: a call may only hold the
    // next launch for a follow-up request, e.g. while the previous --batch row's requests
    // finish, and then collects nothing, which read as a 0-ms step).
    let before = engine.backend_stats();
    let mut collected = 0u32;
    while collected < 8 {
        let emitted = sink.tokens;
        assert!(engine.step(&mut sink), "the requests ended during warm-up");
        collected += u32::from(sink.tokens > emitted);
    }
    let d = delta(before, engine.backend_stats());
    let decode_ms = d.gpu_ms / f64::from(collected);
    let (mut ttft, mut step_ms) = (Vec::new(), Vec::new());
    for run in 0..RUNS {
        *tag += 1;
        let at = *tag;
        let salt = (chunk as u32)
            .wrapping_mul(65_537)
            .wrapping_add(run as u32 * 131 + 7);
        let before = engine.backend_stats();
        let t0 = Instant::now();
        submit(engine, n as u32, at, prompt_of(chunk, salt, vocab), 1);
        while !sink.per_tag.contains_key(&at) {
            assert!(engine.step(&mut sink), "the requests ended early");
        }
        ttft.push(t0.elapsed());
        let d = delta(before, engine.backend_stats());
        step_ms.push(d.gpu_ms - d.steps.saturating_sub(1) as f64 * decode_ms);
    }
    while engine.step(&mut sink) {}
    ttft.sort();
    step_ms.sort_by(f64::total_cmp);
    let ms = pct(&ttft, 0.5);
    let mixed_ms = step_ms[RUNS / 2];
    println!();
    println!(
        "mixed steps: {n} decoding + a {chunk}-token prompt: decode-only step {decode_ms:.3} GPU \
         ms; the prompt's first token after {ms:.2} ms (p50 of {RUNS}); mixed step ~{mixed_ms:.3} \
         GPU ms (median)"
    );
    if json {
        println!(
            "{}",
            serde_json::json!({"mixed_decoders": n, "mixed_chunk": chunk,
                "decode_gpu_ms": decode_ms, "ttft_ms_p50": ms, "mixed_gpu_ms": mixed_ms})
        );
    }
}

fn pct(sorted: &[Duration], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1e3
}

fn main() {
    let args = Args::parse();
    if let Err(why) = nervad::backend::cuda::probe(args.device) {
        println!("gpu_decode: skipped, no usable CUDA device ({why})");
        return;
    }
    if let Some(preset) = args.preset
        && !args.model.join("config.json").exists()
    {
        let t0 = Instant::now();
        make_checkpoint(preset, &args.model, 1234, None).expect("generate checkpoint");
        eprintln!(
            "generated {preset:?} in {:.1} s",
            t0.elapsed().as_secs_f64()
        );
    }
    let batches: Vec<usize> = args
        .batch
        .split(',')
        .map(|b| b.trim().parse().expect("--batch: numbers"))
        .collect();
    let mixed: Vec<(usize, usize)> = args
        .mixed
        .split(',')
        .filter(|m| !m.trim().is_empty())
        .map(|m| {
            let (d, c) = m.split_once(':').expect("--mixed: DECODERS:CHUNK");
            let num = |x: &str| x.trim().parse::<usize>().expect("--mixed: numbers");
            (num(d), num(c))
        })
        .collect();
    let max_batch = batches
        .iter()
        .copied()
        .chain(mixed.iter().map(|&(d, _)| d + 1))
        .max()
        .expect("--batch: at least one");
    let load = LoadOptions {
        prefault: true,
        progress: false,
    };
    let t0 = Instant::now();
    let model = EngineModel::from_loaded(LoadedModel::load_with(&args.model, load).expect("load"));
    let load_s = t0.elapsed().as_secs_f64();
    let prefills: Vec<usize> = args
        .prefill
        .split(',')
        .filter(|p| !p.trim().is_empty())
        .map(|p| p.trim().parse().expect("--prefill: numbers"))
        .collect();
    let longest = (prefills.iter().copied())
        .chain(mixed.iter().map(|&(_, c)| c))
        .max()
        .unwrap_or(0);
    let context = (args.prompt + args.tokens).max(longest) + 16;
    let options = EngineOptions {
        max_batch,
        max_context: context.min(model.config.max_position_embeddings),
        kv_budget_bytes: 0,
        threads: 0,
        max_step_tokens: args.max_step_tokens.max(max_batch),
        page_tokens: 16,
        max_queued: max_batch,
        ..EngineOptions::default()
    };
    let t0 = Instant::now();
    let mut backend = CudaBackend::new(
        &model.config,
        &model.weights,
        options.backend_options(&model.config),
        CudaOptions {
            device: args.device,
            memory: args.gpu_memory,
            fast_prefill: args.fast_prefill,
            projections: args.projections,
            ..CudaOptions::default()
        },
    )
    .expect("CUDA backend");
    let build_s = t0.elapsed().as_secs_f64();
    let bandwidths: Vec<(usize, f64)> = (args.buffer_mib.iter())
        .map(|&mib| {
            let bytes_per_s = backend
                .measure_read_bandwidth(mib << 20, 20)
                .expect("bandwidth");
            (mib, bytes_per_s)
        })
        .collect();
    let bandwidth = (bandwidths.iter().map(|&(_, b)| b))
        .max_by(f64::total_cmp)
        .expect("--buffer-mib: at least one buffer");
    let weight_bytes = backend.weight_bytes_per_token();
    let tuning = backend.tuning();
    let info = backend.info();
    let nodes1 = backend.graph_nodes(1);
    let vocab = model.config.vocab_size as u32;
    let config = model.config.clone();
    let mut engine = Engine::new(model, Box::new(backend), options);
    println!("device: {}", info.device);
    println!("kernels: {:?}", tuning);
    println!(
        "load {load_s:.1} s, backend build (upload, compile or cache, graph capture) {build_s:.1} s"
    );
    let each: Vec<String> = (bandwidths.iter())
        .map(|&(mib, b)| format!("{mib} MiB {:.2}", b / 1e12))
        .collect();
    println!(
        "read bandwidth: {:.2} TB/s (the fastest of {} TB/s, median of 20 passes each)",
        bandwidth / 1e12,
        each.join(", ")
    );
    println!(
        "weights read per step: {:.3} GB; roofline {:.1} steps/s; decode graph nodes (batch 1): {}",
        weight_bytes as f64 / 1e9,
        bandwidth / weight_bytes as f64,
        nodes1.map_or("-".into(), |n| n.to_string())
    );
    println!(
        "| batch | tok/s | ms/step p50 | p99 | GB/s | % of read roofline | launches/step | graph nodes/step | syncs/step | GPU ms/step |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    let mut tag = 0u64;
    for &n in &batches {
        for c in 0..n {
            tag += 1;
            // A fixed pseudo-random prompt of exactly --prompt tokens.
            let prompt: Vec<u32> = (0..args.prompt as u32)
                .map(|i| (i.wrapping_mul(2_654_435_761).wrapping_add(c as u32 * 97) >> 7) % vocab)
                .collect();
            submit(&mut engine, c as u32, tag, prompt, args.tokens + 16);
        }
        let mut sink = Tally::default();
        // Prefill (one step per 256 prompt tokens of every sequence) and 8 decode warm-up steps
        // of every sequence: a sequence whose prompt the prefix cache already holds (an earlier
        // batch row submitted the same prompt) decodes at once, and the timed steps must not
        // still carry the others' prompt chunks.
        let tags = tag + 1 - n as u64..=tag;
        while !sink.all_have(tags.clone(), 8) {
            assert!(
                engine.step(&mut sink),
                "the requests ended during warm-up (see the log)"
            );
        }
        let before = engine.backend_stats();
        let ahead_before = engine.launch_ahead();
        let tokens_before = sink.tokens;
        let mut times = Vec::with_capacity(args.tokens);
        let t_all = Instant::now();
        // A step's time runs from one collected step to the next: an engine call that collects
        // nothing (it planned a step not launched ahead, or held a launch for a follow-up
        // request) adds its time to the next collected step's.
        let mut last = t_all;
        while times.len() < args.tokens {
            let emitted = sink.tokens;
            let more = engine.step(&mut sink);
            assert!(more, "the requests ended early (see the log)");
            if sink.tokens > emitted {
                let now = Instant::now();
                times.push(now - last);
                last = now;
            }
        }
        let wall = t_all.elapsed().as_secs_f64();
        let tokens = sink.tokens - tokens_before;
        let d = delta(before, engine.backend_stats());
        let ahead = engine.launch_ahead();
        let missed: Vec<(&str, u64)> = AheadMiss::ALL
            .iter()
            .map(|&why| (why.name(), ahead.missed(why) - ahead_before.missed(why)))
            .filter(|&(_, n)| n > 0)
            .collect();
        let launched_ahead = ahead.launched - ahead_before.launched;
        while engine.step(&mut sink) {}
        times.sort();
        let steps = args.tokens as f64;
        let p50 = pct(&times, 0.5);
        let gbs = weight_bytes as f64 / (p50 / 1e3) / 1e9;
        let line = format!(
            "| {n} | {:.0} | {p50:.3} | {:.3} | {gbs:.0} | {:.1}% | {:.1} | {:.1} | {:.2} | {:.3} |",
            tokens as f64 / wall,
            pct(&times, 0.99),
            100.0 * gbs * 1e9 / bandwidth,
            d.launches as f64 / steps,
            d.graph_nodes as f64 / steps,
            (d.hard_syncs + d.policy_syncs) as f64 / steps,
            d.gpu_ms / steps
        );
        println!("{line}");
        if launched_ahead < args.tokens as u64 || !missed.is_empty() {
            println!(
                "  batch {n}: {launched_ahead} of {} steps launched ahead of the one in flight; \
                 passed up: {missed:?}",
                args.tokens
            );
        }
        if args.json {
            let missed_json: serde_json::Map<_, _> = missed
                .iter()
                .map(|&(k, n)| (k.to_owned(), serde_json::json!(n)))
                .collect();
            println!(
                "{}",
                serde_json::json!({
                    "batch": n,
                    "tok_s": tokens as f64 / wall,
                    "ms_step_p50": p50,
                    "ms_step_p99": pct(&times, 0.99),
                    "weight_bytes": weight_bytes,
                    "read_bw_bytes_s": bandwidth,
                    "roofline_pct": 100.0 * gbs * 1e9 / bandwidth,
                    "launched_ahead": launched_ahead,
                    "ahead_missed": missed_json,
                    "launches_per_step": d.launches as f64 / steps,
                    "graph_nodes_per_step": d.graph_nodes as f64 / steps,
                    "device_allocs": d.device_allocs,
                    "pinned_allocs": d.pinned_allocs,
                })
            );
        }
    }
    for &(n, chunk) in &mixed {
        mixed_steps(
            &mut engine,
            &mut tag,
            n,
            chunk,
            args.prompt,
            vocab,
            args.json,
        );
    }
    if prefills.is_empty() {
        return;
    }
    println!();
    println!(
        "prefill ({}): time to the first token of one request alone, median of 5 distinct prompts",
        if args.fast_prefill || args.projections != nervad::backend::cuda::Projections::Tensor {
            "cuBLAS projections"
        } else {
            "tensor-core decode kernels"
        }
    );
    // GPU ms: the device time of the steps that ran until the first token (each step timed by
    // its own events), so what the wall time has beyond it was spent between or around steps.
    // TFLOP/s: the prompt's tensor work over its wall time p50, the projections' alone (every
    // token through every layer's weights, the LM head for the last) and with the causal
    // attention's two products (each query against the positions up to its own); issue 8 asks
    // it against the bf16 GEMM peak measured in the same run (gpu_kernels).
    println!(
        "| prompt tokens | ms p50 | prompt tok/s | steps | GPU ms p50 | ms min / max | TFLOP/s \
         (projections / + attention) |"
    );
    println!("|---|---|---|---|---|---|---|");
    for &p in &prefills {
        let mut times = Vec::new();
        let mut gpu = Vec::new();
        let mut steps = 0;
        for run in 0..6 {
            tag += 1;
            // Distinct per length and run: a prompt sharing a whole page with an earlier one
            // would reuse its KV pages from the prefix cache and time only the rest.
            let salt = (p as u32).wrapping_mul(40_503).wrapping_add(run * 31);
            let mut sink = Tally::default();
            let before = engine.backend_stats();
            let t0 = Instant::now();
            submit(&mut engine, 0, tag, prompt_of(p, salt, vocab), 1);
            steps = 0;
            loop {
                let more = engine.step(&mut sink);
                steps += 1;
                if sink.tokens > 0 {
                    break;
                }
                assert!(more, "the request ended without a token");
            }
            // The first run warms the cuBLAS heuristics and caches; it is not counted.
            if run > 0 {
                times.push(t0.elapsed());
                gpu.push(delta(before, engine.backend_stats()).gpu_ms);
            }
            while engine.step(&mut sink) {}
        }
        times.sort();
        gpu.sort_by(f64::total_cmp);
        let ms = pct(&times, 0.5);
        let gpu_ms = gpu[gpu.len() / 2];
        let (proj, attn) = prompt_flops(&config, p);
        let tflops = |f: f64| f / (ms / 1e3) / 1e12;
        println!(
            "| {p} | {ms:.2} | {:.0} | {steps} | {gpu_ms:.2} | {:.2} / {:.2} | {:.1} / {:.1} |",
            p as f64 / (ms / 1e3),
            pct(&times, 0.0),
            pct(&times, 1.0),
            tflops(proj),
            tflops(proj + attn)
        );
        if args.json {
            println!(
                "{}",
                serde_json::json!({"prefill_tokens": p, "ttft_ms_p50": ms, "gpu_ms_p50": gpu_ms, "fast_prefill": args.fast_prefill})
            );
        }
    }
}

//! CPU decode against the machine's memory bandwidth, measured in the same run.
//!
//! ```text
//! cargo bench -p nervad --bench cpu_decode -- --model DIR [--tokens 128] [--threads N]
//! cargo bench -p nervad --bench cpu_decode -- --preset qwen3-0.6b --model DIR   # generate first
//! ```
//! Prints (a) streaming read bandwidth of a large buffer over the same worker pool, (b) batch-1
//! decode: median step time, tok/s, weight bytes read per token (every layer matrix + LM head),
//! achieved GB/s and its share of (a), and (c) batch-8 throughput.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Parser;
use nervad::backend::cpu::CpuBackend;
use nervad::backend::cpu::pool::{SharedMut, WorkerPool};
use nervad::backend::{Backend, BackendOptions, SeqStep, StepOutput, kv_bytes_per_token};
use nervad::engine::{
    ClientId, Engine, EngineEvent, EngineModel, EngineOptions, EventSink, GenerateRequest,
    InferenceEngine, Prompt, RequestKey, SamplingParams,
};
use nervad::model::generate::{Preset, make_checkpoint};
use nervad::model::{LoadOptions, LoadedModel};

#[derive(Parser, Debug)]
struct Args {
    /// Hugging Face snapshot directory.
    #[arg(long)]
    model: PathBuf,
    /// Generate this preset into --model first if the directory does not exist.
    #[arg(long)]
    preset: Option<Preset>,
    /// Decode steps to time (after warm-up).
    #[arg(long, default_value_t = 128)]
    tokens: usize,
    /// Worker threads (0 = all cores).
    #[arg(long, default_value_t = 0)]
    threads: usize,
    /// Sequences of the batched run.
    #[arg(long, default_value_t = 8)]
    batch: usize,
    /// Size of the bandwidth buffer in MiB.
    #[arg(long, default_value_t = 2048)]
    buffer_mib: usize,
    /// Skip the whole-engine runs.
    #[arg(long)]
    no_engine: bool,
    /// Passed by `cargo bench`; ignored.
    #[arg(long, hide = true)]
    bench: bool,
}

/// Counts tokens; keeps nothing.
#[derive(Default)]
struct Tally {
    tokens: usize,
}

impl EventSink for Tally {
    fn emit(&mut self, event: EngineEvent<'_>) {
        if let EngineEvent::Tokens { ids, .. } = event {
            self.tokens += ids.len();
        }
    }
}

/// Median step time of the whole engine (scheduler, backend, sampling, detokenization,
/// events) decoding `n` requests from `n` clients.
fn engine_run(dir: &std::path::Path, n: usize, steps: usize, threads: usize) -> Duration {
    // The bench's first load already faulted the weights in; reloading for each batch size
    // only needs the mapping (the warm-up steps take the page-table faults).
    let reuse = LoadOptions {
        prefault: false,
        progress: false,
    };
    let model = EngineModel::from_loaded(LoadedModel::load_with(dir, reuse).expect("load model"));
    let options = EngineOptions {
        max_batch: n,
        max_context: 512.min(model.config.max_position_embeddings),
        kv_budget_bytes: n * 512 * kv_bytes_per_token(&model.config, 4),
        threads,
        max_step_tokens: 256,
        page_tokens: 16,
        max_queued: n,
        ..EngineOptions::default()
    };
    let mut engine = Engine::with_cpu_backend(model, options).expect("engine");
    for c in 0..n {
        let key = RequestKey {
            client: ClientId {
                slot: c as u32,
                generation: 0,
            },
            tag: 1,
        };
        let prompt = Prompt::Text(format!("Benchmark prompt number {c}: tell a long story."));
        engine
            .submit(GenerateRequest::fixed_length(
                key,
                prompt,
                (steps + 16) as u32,
            ))
            .expect("submit");
    }
    let mut sink = Tally::default();
    // Prefill and warm-up.
    for _ in 0..4 {
        engine.step(&mut sink);
    }
    let mut times = Vec::with_capacity(steps);
    for _ in 0..steps {
        let t0 = Instant::now();
        engine.step(&mut sink);
        times.push(t0.elapsed());
    }
    median(times)
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// Best-of-runs read bandwidth (GB/s) of a buffer much larger than any cache, summed in
/// 16-lane f32 chunks by every thread of the pool.
fn read_bandwidth(pool: &WorkerPool, mib: usize) -> (f64, f64) {
    let n = mib * (1 << 20) / 4;
    let mut buf = vec![0f32; n];
    let tasks = pool.threads() * 8;
    let per = n.div_ceil(tasks);
    {
        // First touch from the workers, so pages spread as the reads will.
        let shared = SharedMut::new(&mut buf);
        pool.run(tasks, &|t, _| {
            let start = (t * per).min(n);
            let len = per.min(n - start);
            // SAFETY: task t owns start..start+len alone.
            let part = unsafe { shared.slice_mut(start, len) };
            for (i, v) in part.iter_mut().enumerate() {
                *v = (i % 7) as f32;
            }
        });
    }
    let sums: Vec<std::sync::atomic::AtomicU32> = (0..tasks)
        .map(|_| std::sync::atomic::AtomicU32::new(0))
        .collect();
    let mut rates = Vec::new();
    for _ in 0..7 {
        let t0 = Instant::now();
        pool.run(tasks, &|t, _| {
            let start = (t * per).min(n);
            let end = (start + per).min(n);
            let mut acc = [0f32; 16];
            for c in buf[start..end].chunks_exact(16) {
                for j in 0..16 {
                    acc[j] += c[j];
                }
            }
            sums[t].store(
                acc.iter().sum::<f32>().to_bits(),
                std::sync::atomic::Ordering::Relaxed,
            );
        });
        let dt = t0.elapsed().as_secs_f64();
        rates.push((n * 4) as f64 / dt / 1e9);
    }
    rates.sort_by(|a, b| a.total_cmp(b));
    (rates[rates.len() - 1], rates[rates.len() / 2])
}

fn main() {
    let args = Args::parse();
    if let Some(preset) = args.preset
        && !args.model.exists()
    {
        let t0 = Instant::now();
        make_checkpoint(preset, &args.model, 0, None).expect("generate checkpoint");
        eprintln!("generated {preset:?} in {:.1}s", t0.elapsed().as_secs_f64());
    }
    let t0 = Instant::now();
    let model = LoadedModel::load(&args.model).expect("load model");
    let load_s = t0.elapsed().as_secs_f64();
    let c = &model.config;
    let prompt_len = 16usize;
    let context = (prompt_len + args.tokens + 32).min(c.max_position_embeddings);
    let page_tokens = 16;
    let pages_per_seq = context.div_ceil(page_tokens);
    let batch = args.batch.max(1);
    let mut backend = CpuBackend::new(
        c,
        &model.weights,
        BackendOptions {
            max_seqs: batch,
            max_step_tokens: (prompt_len * batch).max(64),
            page_tokens,
            kv_budget_bytes: pages_per_seq * batch * page_tokens * kv_bytes_per_token(c, 4),
            max_context: context,
            threads: args.threads,
            swap: nervad::backend::SwapSpace::None,
        },
    )
    .expect("backend");
    let info = backend.info();
    let weight_bytes = backend.weight_bytes_per_token();
    println!(
        "model: {} ({:?}, {:?}), loaded in {load_s:.2}s",
        args.model.display(),
        c.architecture,
        c.dtype
    );
    println!("backend: {}", info.device);

    let pool = WorkerPool::new(backend.threads()).expect("pool");
    let (bw_best, bw_median) = read_bandwidth(&pool, args.buffer_mib);
    drop(pool);
    println!(
        "(a) streaming read bandwidth, {} threads, {} MiB buffer: best {bw_best:.1} GB/s, median {bw_median:.1} GB/s",
        backend.threads(),
        args.buffer_mib
    );

    let run = |backend: &mut CpuBackend, n: usize, steps: usize| -> Vec<Duration> {
        let tables: Vec<Vec<u32>> = (0..n)
            .map(|s| ((s * pages_per_seq) as u32..((s + 1) * pages_per_seq) as u32).collect())
            .collect();
        let prompts: Vec<Vec<u32>> = (0..n)
            .map(|s| {
                (0..prompt_len as u32)
                    .map(|i| (i * 31 + s as u32 * 7) % 1000)
                    .collect()
            })
            .collect();
        let mut out = StepOutput::with_capacity(n);
        let params = SamplingParams::default();
        for (s, p) in prompts.iter().enumerate() {
            backend
                .start_sequence(s as u32, &params, 0, p)
                .expect("start");
        }
        let prefill: Vec<SeqStep<'_>> = (0..n)
            .map(|s| SeqStep {
                slot: s as u32,
                tokens: &prompts[s],
                start_pos: 0,
                block_table: &tables[s],
                sample: true,
                want_logits: false,
                from_last_sample: false,
            })
            .collect();
        backend.step(&prefill, &mut out).expect("prefill");
        let mut input: Vec<[u32; 1]> = (0..n)
            .map(|s| [out.samples[s].map_or(0, |t| t.token)])
            .collect();
        let mut times = Vec::with_capacity(steps);
        for k in 0..steps {
            let pos = (prompt_len + k) as u32;
            let batch: Vec<SeqStep<'_>> = (0..n)
                .map(|s| SeqStep {
                    slot: s as u32,
                    tokens: &input[s],
                    start_pos: pos,
                    block_table: &tables[s],
                    sample: true,
                    want_logits: false,
                    from_last_sample: false,
                })
                .collect();
            let t0 = Instant::now();
            backend.step(&batch, &mut out).expect("decode");
            times.push(t0.elapsed());
            for (slot, inp) in input.iter_mut().enumerate() {
                *inp = [out.samples[slot].map_or(0, |t| t.token)];
            }
        }
        times
    };

    let warm = 8.min(args.tokens);
    let times = run(&mut backend, 1, args.tokens);
    let m = median(times[warm..].to_vec());
    let tok_s = 1.0 / m.as_secs_f64();
    let gbs = weight_bytes as f64 / m.as_secs_f64() / 1e9;
    println!(
        "(b) batch 1: median step {:.2} ms over {} steps => {tok_s:.1} tok/s; weights read per token {:.1} MB => {gbs:.1} GB/s = {:.0}% of best measured bandwidth ({:.0}% of median)",
        m.as_secs_f64() * 1e3,
        times.len() - warm,
        weight_bytes as f64 / 1e6,
        100.0 * gbs / bw_best,
        100.0 * gbs / bw_median,
    );
    if batch > 1 {
        let steps = args.tokens.min(64);
        let times = run(&mut backend, batch, steps);
        let m = median(times[warm.min(steps / 2)..].to_vec());
        println!(
            "(c) batch {batch}: median step {:.2} ms => {:.1} tok/s aggregate ({:.1} tok/s per sequence)",
            m.as_secs_f64() * 1e3,
            batch as f64 / m.as_secs_f64(),
            1.0 / m.as_secs_f64(),
        );
    }
    if !args.no_engine {
        let threads = backend.threads();
        drop(backend);
        for n in [1, batch] {
            let m = engine_run(&args.model, n, args.tokens.min(64), threads);
            println!(
                "(d) whole engine, {n} request(s) from {n} client(s): median step {:.2} ms => {:.1} tok/s",
                m.as_secs_f64() * 1e3,
                n as f64 / m.as_secs_f64()
            );
        }
    }
}

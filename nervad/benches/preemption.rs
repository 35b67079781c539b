//! Preemption by swap against preemption by recompute, on the same overload workload.
//!
//! ```text
//! cargo bench -p nervad --bench preemption -- --preset tiny --model /tmp/nerva-tiny
//! cargo bench -p nervad --bench preemption -- --backend cuda --preset qwen3-0.6b \
//!     --model /tmp/nerva-qwen3-0.6b --seqs 32 --prompt 256 --tokens 256 --kv-pages 256
//! ```
//! `--seqs` requests (one per client, all admitted at once) of a `--prompt`-token prompt and
//! `--tokens` greedy tokens run three times: on a pool with room for all (the reference), and
//! on a pool of `--kv-pages` pages in recompute mode and in swap mode. Each run prints its
//! wall time, tokens/s, preemptions, sequences and pages swapped, prefill positions computed
//! again, and whether every token and log-probability bit equals the reference. The ceiling a
//! swap is compared with is measured in the same run through the backend's own swap path: a
//! round trip of pages out to the host swap area and back (a memcpy on the CPU; pinned
//! device↔host copies on a GPU), timed to a collected step.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Parser;
use nervad::backend::cuda::{CudaBackend, CudaOptions, GpuMemory};
use nervad::backend::{
    Backend, BackendChoice, SamplingParams as BackendSampling, SeqStep, StepOutput, SwapSpace,
    kv_bytes_per_token,
};
use nervad::engine::{
    ClientId, Engine, EngineEvent, EngineModel, EngineOptions, EventSink, GenerateRequest,
    InferenceEngine, Preemption, Prompt, RequestKey,
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
    /// `cpu` or `cuda`.
    #[arg(long, value_enum, default_value = "cpu")]
    backend: BackendChoice,
    /// Requests, all running at once (also the batch size).
    #[arg(long, default_value_t = 16)]
    seqs: usize,
    /// Prompt tokens per request.
    #[arg(long, default_value_t = 64)]
    prompt: usize,
    /// Tokens generated per request.
    #[arg(long, default_value_t = 64)]
    tokens: usize,
    /// Tokens per KV page.
    #[arg(long, default_value_t = 16)]
    page_tokens: usize,
    /// KV pages of the tight pool (the workload needs seqs × ⌈(prompt + tokens) / page⌉).
    #[arg(long, default_value_t = 48)]
    kv_pages: usize,
    /// Tokens per step.
    #[arg(long, default_value_t = 256)]
    step_tokens: usize,
    /// CPU worker threads (0 = all cores).
    #[arg(long, default_value_t = 0)]
    threads: usize,
    /// Passed by `cargo bench`; ignored.
    #[arg(long, hide = true)]
    bench: bool,
}

/// Token ids and log-probability bits per request.
struct Outputs {
    seqs: Vec<(Vec<u32>, Vec<u32>)>,
}

impl EventSink for Outputs {
    fn emit(&mut self, event: EngineEvent<'_>) {
        if let EngineEvent::Tokens {
            key, ids, logprobs, ..
        } = event
        {
            let (t, l) = &mut self.seqs[key.tag as usize];
            t.extend_from_slice(ids);
            l.extend(logprobs.iter().map(|x| x.to_bits()));
        }
    }
}

struct Run {
    wall: Duration,
    outputs: Outputs,
    preemptions: u64,
    swap_outs: u64,
    pages_out: u64,
    pages_in: u64,
    recomputed: u64,
    h2d: u64,
    d2h: u64,
}

fn load(dir: &std::path::Path) -> EngineModel {
    let opts = LoadOptions {
        prefault: false,
        progress: false,
    };
    EngineModel::from_loaded(LoadedModel::load_with(dir, opts).expect("load model"))
}

fn cuda_options(memory: GpuMemory) -> CudaOptions {
    CudaOptions {
        memory,
        ..CudaOptions::default()
    }
}

/// The workload on a pool of `pages` pages (CPU: from the KV budget; CUDA: from `memory`).
fn run(
    args: &Args,
    pages: usize,
    memory: GpuMemory,
    preemption: Preemption,
    swap: SwapSpace,
) -> Run {
    let model = load(&args.model);
    let vocab = model.config.vocab_size as u32;
    let context = (args.prompt + args.tokens).min(model.config.max_position_embeddings);
    let options = EngineOptions {
        max_batch: args.seqs,
        max_context: context,
        kv_budget_bytes: pages * args.page_tokens * kv_bytes_per_token(&model.config, 4),
        threads: args.threads,
        max_step_tokens: args.step_tokens,
        prefill_chunk: 0,
        page_tokens: args.page_tokens,
        max_queued: args.seqs,
        preemption,
        swap,
    };
    let mut engine =
        Engine::with_backend(model, options, args.backend, cuda_options(memory)).expect("engine");
    assert_eq!(engine.limits().num_pages, pages, "pool size");
    for i in 0..args.seqs {
        let prompt = (0..args.prompt as u32)
            .map(|t| (7 + t * 13 + i as u32 * 101) % vocab)
            .collect();
        let key = RequestKey {
            client: ClientId {
                slot: i as u32,
                generation: 0,
            },
            tag: i as u64,
        };
        engine
            .submit(GenerateRequest::fixed_length(
                key,
                Prompt::Tokens(prompt),
                args.tokens as u32,
            ))
            .expect("submit");
    }
    let mut outputs = Outputs {
        seqs: vec![(Vec::new(), Vec::new()); args.seqs],
    };
    let before = engine.backend_stats();
    let start = Instant::now();
    while engine.step(&mut outputs) {}
    let wall = start.elapsed();
    let after = engine.backend_stats();
    let (pages_out, pages_in) = engine.pages_swapped();
    Run {
        wall,
        outputs,
        preemptions: engine.preemptions(),
        swap_outs: engine.swap_outs(),
        pages_out,
        pages_in,
        recomputed: engine.recomputed_tokens(),
        h2d: after.h2d_bytes - before.h2d_bytes,
        d2h: after.d2h_bytes - before.d2h_bytes,
    }
}

/// GB/s of the backend's swap path: `rounds` round trips of `pages` pages out to the host and
/// back, ended by a collected one-token step (which waits for every copy before it on a
/// device). Returns (GB/s, page bytes).
fn swap_bandwidth(b: &mut dyn Backend, page_bytes: usize, rounds: usize) -> f64 {
    let l = b.limits();
    let n = l.num_pages.min(l.swap_pages);
    let pages: Vec<u32> = (0..n as u32).collect();
    let sync = |b: &mut dyn Backend| {
        b.start_sequence(0, &BackendSampling::default(), 0, &[1])
            .expect("start");
        let table = [0u32];
        let step = SeqStep {
            slot: 0,
            tokens: &[1],
            start_pos: 0,
            block_table: &table,
            sample: true,
            want_logits: false,
            from_last_sample: false,
        };
        b.step(&[step], &mut StepOutput::with_capacity(1))
            .expect("step");
    };
    sync(b);
    let start = Instant::now();
    for _ in 0..rounds {
        b.swap_out(&pages, &pages).expect("swap out");
        b.swap_in(&pages, &pages).expect("swap in");
    }
    sync(b);
    let bytes = 2 * rounds * n * page_bytes;
    bytes as f64 / start.elapsed().as_secs_f64() / 1e9
}

fn main() {
    let args = Args::parse();
    if let Some(preset) = args.preset
        && !args.model.join("config.json").exists()
    {
        make_checkpoint(preset, &args.model, 1234, None).expect("generate checkpoint");
    }
    let model = load(&args.model);
    let config = model.config.clone();
    let per_seq = (args.prompt + args.tokens).div_ceil(args.page_tokens);
    let roomy = args.seqs * per_seq;
    let cuda = args.backend == BackendChoice::Cuda;
    // Swap area: room for every page of the tight pool.
    let elem = if cuda { 2 } else { 4 };
    let page_bytes = args.page_tokens * kv_bytes_per_token(&config, elem);
    let swap = SwapSpace::Bytes(roomy * page_bytes);

    // The ceiling, through a backend of its own; on a GPU it also tells how much device memory
    // gives `--kv-pages` pages (the CUDA pool is what --gpu-memory leaves after the rest).
    let mut options = EngineOptions {
        max_batch: args.seqs,
        max_context: args.prompt + args.tokens,
        kv_budget_bytes: roomy * args.page_tokens * kv_bytes_per_token(&config, 4),
        threads: args.threads,
        max_step_tokens: args.step_tokens,
        page_tokens: args.page_tokens,
        swap,
        ..EngineOptions::default()
    }
    .backend_options(&config);
    let (ceiling, memory_for): (f64, Box<dyn Fn(usize) -> GpuMemory>) = if cuda {
        let b0 = CudaBackend::new(
            &config,
            &model.weights,
            options,
            cuda_options(GpuMemory::Fraction(0.9)),
        )
        .expect("cuda backend");
        let pb = b0.kv_page_bytes();
        assert_eq!(pb, page_bytes, "bf16/f16 KV");
        let (arena, pages) = (b0.arena_bytes(), b0.limits().num_pages);
        drop(b0);
        // num_pages = (budget - fixed - 256) / page_bytes, fixed = arena - kv - 256.
        let fixed = arena - (pages * pb).next_multiple_of(256) - 256;
        let memory_for = move |n: usize| GpuMemory::Bytes(fixed + 256 + n * pb);
        let mut b = CudaBackend::new(
            &config,
            &model.weights,
            options,
            cuda_options(memory_for(roomy)),
        )
        .expect("cuda backend");
        (swap_bandwidth(&mut b, pb, 20), Box::new(memory_for))
    } else {
        options.swap = swap;
        let mut b = nervad::backend::cpu::CpuBackend::new(&config, &model.weights, options)
            .expect("cpu backend");
        let unused = |_: usize| GpuMemory::Fraction(0.9);
        (swap_bandwidth(&mut b, page_bytes, 20), Box::new(unused))
    };
    drop(model);
    println!(
        "{} backend, {} layers, page {} tokens = {} KiB; {} requests × ({} prompt + {} tokens) \
         = {} pages; tight pool {} pages",
        if cuda { "cuda" } else { "cpu" },
        config.num_hidden_layers,
        args.page_tokens,
        page_bytes / 1024,
        args.seqs,
        args.prompt,
        args.tokens,
        roomy,
        args.kv_pages
    );
    println!("ceiling: swap round trip through the backend {ceiling:.2} GB/s");

    let reference = run(
        &args,
        roomy,
        memory_for(roomy),
        Preemption::Recompute,
        SwapSpace::None,
    );
    assert_eq!(reference.preemptions, 0, "the roomy pool preempts nothing");
    let total_tokens = (args.seqs * args.tokens) as f64;
    println!(
        "{:<10} {:>9} {:>9} {:>8} {:>6} {:>9} {:>9} {:>10} {:>11} {:>9}",
        "mode",
        "wall ms",
        "tok/s",
        "preempt",
        "swaps",
        "pages out",
        "pages in",
        "recomputed",
        "swap ms@ceil",
        "exact"
    );
    let row = |name: &str, r: &Run| {
        let swapped_bytes = (r.pages_out + r.pages_in) as f64 * page_bytes as f64;
        let exact = r.outputs.seqs == reference.outputs.seqs;
        println!(
            "{:<10} {:>9.1} {:>9.1} {:>8} {:>6} {:>9} {:>9} {:>10} {:>11.2} {:>9}",
            name,
            r.wall.as_secs_f64() * 1e3,
            total_tokens / r.wall.as_secs_f64(),
            r.preemptions,
            r.swap_outs,
            r.pages_out,
            r.pages_in,
            r.recomputed,
            swapped_bytes / (ceiling * 1e9) * 1e3,
            exact
        );
        if cuda {
            println!(
                "{:<10} device copies in the run: h2d {:.1} MiB, d2h {:.1} MiB",
                "",
                r.h2d as f64 / (1 << 20) as f64,
                r.d2h as f64 / (1 << 20) as f64
            );
        }
    };
    row("roomy", &reference);
    let tight = memory_for(args.kv_pages);
    let recompute = run(
        &args,
        args.kv_pages,
        tight,
        Preemption::Recompute,
        SwapSpace::None,
    );
    row("recompute", &recompute);
    let swapped = run(&args, args.kv_pages, tight, Preemption::Swap, swap);
    row("swap", &swapped);
}

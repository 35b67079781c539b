//! The CUDA backend against the CPU reference (the oracle), on generated checkpoints.
//!
//! Every test prints why and passes when no usable CUDA device is present (CI has none); run
//! them on the GPU machine before resolving GPU work:
//! `NERVA_CUDA_INCLUDE=/usr/local/cuda/include cargo test -p nervad --test cuda_backend`
//! (or the built test binary with `--nocapture`).
//!
//! Gates (bf16 weights and KV, f32 accumulation): teacher-forced logits within 2e-2 of the CPU
//! reference's max |logit| at every position; greedy tokens identical up to the first step
//! whose CPU top-2 margin is below that bound.

use std::time::Instant;

use nervad::backend::cuda::{CudaOptions, GpuMemory};
use nervad::backend::{BackendChoice, BackendStats};
use nervad::engine::dump::dump_model_on;
use nervad::engine::{
    ClientId, Engine, EngineEvent, EngineModel, EngineOptions, EventSink, GenerateRequest,
    InferenceEngine, Prompt, RequestKey, SamplingParams,
};
use nervad::model::LoadedModel;
use nervad::model::generate::{Preset, make_checkpoint};

const REL_TOL: f32 = 2e-2;

fn device() -> Option<CudaOptions> {
    match nervad::backend::cuda::probe(0) {
        Ok(_) => Some(CudaOptions {
            device: 0,
            memory: GpuMemory::Fraction(0.5),
            ..CudaOptions::default()
        }),
        Err(why) => {
            println!("skipped: no usable CUDA device ({why})");
            None
        }
    }
}

/// `small`, then `big` too when NERVA_GPU_BIG is set (real shapes: slower, GPU machine only).
fn presets(small: &[Preset], big: &[Preset]) -> Vec<Preset> {
    let mut all = small.to_vec();
    if std::env::var_os("NERVA_GPU_BIG").is_some() {
        all.extend_from_slice(big);
    }
    all
}

fn checkpoint(preset: Preset) -> std::path::PathBuf {
    let dir =
        std::env::temp_dir().join(format!("nerva-cuda-test-{}-{preset:?}", std::process::id()));
    if !dir.join("config.json").exists() {
        make_checkpoint(preset, &dir, 1234, None).expect("generate checkpoint");
    }
    dir
}

fn load(dir: &std::path::Path) -> EngineModel {
    EngineModel::from_loaded(LoadedModel::load(dir).expect("load"))
}

fn parity(preset: Preset, cuda: CudaOptions) {
    let dir = checkpoint(preset);
    let vocab = load(&dir).config.vocab_size as u32;
    let prompt: Vec<u32> = (0..40).map(|i| (1 + 4 * i) % vocab).collect();
    let steps = 48;
    let cpu = dump_model_on(load(&dir), &prompt, steps, 0, BackendChoice::Cpu, cuda).unwrap();
    let gpu = dump_model_on(load(&dir), &prompt, steps, 0, BackendChoice::Cuda, cuda).unwrap();
    let v = vocab as usize;
    let mut worst = 0f32;
    let scale = cpu.logits.iter().fold(0f32, |m, x| m.max(x.abs()));
    let bound = REL_TOL * scale;
    for (p, (c, g)) in cpu.logits.chunks(v).zip(gpu.logits.chunks(v)).enumerate() {
        let diff = c.iter().zip(g).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        assert!(diff.is_finite(), "{preset:?}: non-finite logits at {p}");
        worst = worst.max(diff);
        // Teacher-forced argmax equal wherever the reference's top-2 margin exceeds the bound.
        let mut order: Vec<usize> = (0..v).collect();
        order.sort_by(|&a, &b| c[b].total_cmp(&c[a]));
        let gpu_best = (0..v).max_by(|&a, &b| g[a].total_cmp(&g[b])).unwrap();
        if c[order[0]] - c[order[1]] > bound {
            assert_eq!(gpu_best, order[0], "{preset:?}: argmax at position {p}");
        }
    }
    assert!(
        worst <= bound,
        "{preset:?}: max |Δlogit| {worst} > {bound} (2e-2 × {scale})"
    );
    // Greedy: identical, or diverging only where the CPU's own continuation is near a tie.
    // The CPU's margins along its greedy path come from a teacher-forced dump of that path.
    let agree = cpu
        .greedy_tokens
        .iter()
        .zip(&gpu.greedy_tokens)
        .take_while(|(a, b)| a == b)
        .count();
    if agree < cpu.greedy_tokens.len() {
        let mut path = prompt.clone();
        path.extend_from_slice(&cpu.greedy_tokens[..agree]);
        let tf = dump_model_on(load(&dir), &path, 0, 0, BackendChoice::Cpu, cuda).unwrap();
        let row = &tf.logits[(path.len() - 1) * v..path.len() * v];
        let mut sorted = row.to_vec();
        sorted.sort_by(|a, b| b.total_cmp(a));
        let margin = sorted[0] - sorted[1];
        assert!(
            margin < bound,
            "{preset:?}: greedy diverged at step {agree} with a CPU margin {margin} ≥ {bound}"
        );
        println!("{preset:?}: greedy diverged at {agree} on a near tie (margin {margin})");
    }
    println!(
        "{preset:?}: max |Δlogit| {worst:.3e} ({:.3e} of max), greedy {agree}/{steps}",
        worst / scale
    );
}

#[test]
fn cuda_matches_the_cpu_reference_on_the_tiny_presets() {
    let Some(cuda) = device() else { return };
    for preset in [
        Preset::Tiny,
        Preset::TinyLlama,
        Preset::TinyQwen2,
        Preset::TinyMistral,
    ] {
        parity(preset, cuda);
    }
}

#[test]
fn cuda_matches_the_cpu_reference_on_real_shapes() {
    let Some(cuda) = device() else { return };
    if std::env::var_os("NERVA_GPU_BIG").is_none() {
        println!("skipped: set NERVA_GPU_BIG=1 for qwen3-0.6b, llama3-1b, qwen2.5-0.5b");
        return;
    }
    for preset in [Preset::Qwen3_0_6b, Preset::Llama3_1b, Preset::Qwen2_5_0_5b] {
        parity(preset, cuda);
    }
}

#[derive(Default)]
struct Collect {
    tokens: Vec<(u64, u32)>,
}

impl EventSink for Collect {
    fn emit(&mut self, event: EngineEvent<'_>) {
        if let EngineEvent::Tokens { key, ids, .. } = event {
            for &id in ids {
                self.tokens.push((key.tag, id));
            }
        }
    }
}

fn request(tag: u64, prompt: Vec<u32>, sampling: SamplingParams, n: u32) -> GenerateRequest {
    let key = RequestKey {
        client: ClientId {
            slot: tag as u32,
            generation: 0,
        },
        tag,
    };
    GenerateRequest {
        sampling,
        ..GenerateRequest::fixed_length(key, Prompt::Tokens(prompt), n)
    }
}

fn engine(dir: &std::path::Path, cuda: CudaOptions, batch: usize) -> Engine {
    let options = EngineOptions {
        max_batch: batch,
        max_context: 256,
        ..EngineOptions::default()
    };
    Engine::with_backend(load(dir), options, BackendChoice::Cuda, cuda).expect("CUDA engine")
}

fn tokens_of(sink: &Collect, tag: u64) -> Vec<u32> {
    sink.tokens
        .iter()
        .filter(|(t, _)| *t == tag)
        .map(|(_, id)| *id)
        .collect()
}

#[test]
fn seeded_sampling_is_reproducible_and_batch_independent() {
    let Some(cuda) = device() else { return };
    let dir = checkpoint(Preset::Tiny);
    let sampling = SamplingParams {
        temperature: 0.9,
        top_k: 50,
        top_p: 0.9,
        min_p: 0.01,
        repetition_penalty: 1.1,
        presence_penalty: 0.2,
        frequency_penalty: 0.1,
        seed: 42,
        top_logprobs: 3,
    };
    let prompt: Vec<u32> = (10..30).collect();
    let mut alone = Collect::default();
    let mut e = engine(&dir, cuda, 4);
    e.submit(request(1, prompt.clone(), sampling, 40)).unwrap();
    while e.step(&mut alone) {}
    let first = tokens_of(&alone, 1);
    assert_eq!(first.len(), 40);

    // Same seed again, now beside three other requests with other seeds and prompts.
    let mut crowd = Collect::default();
    e.submit(request(1, prompt.clone(), sampling, 40)).unwrap();
    for tag in 2..5u64 {
        let other = SamplingParams {
            seed: tag,
            ..sampling
        };
        e.submit(request(
            tag,
            (tag as u32..tag as u32 + 7).collect(),
            other,
            40,
        ))
        .unwrap();
    }
    while e.step(&mut crowd) {}
    assert_eq!(
        tokens_of(&crowd, 1),
        first,
        "same seed, same tokens in any batch"
    );
    assert_ne!(
        tokens_of(&crowd, 2),
        first,
        "other seeds and prompts differ"
    );
}

#[test]
fn steady_decode_allocates_nothing_and_replays_graphs() {
    let Some(cuda) = device() else { return };
    let dir = checkpoint(Preset::Tiny);
    let mut e = engine(&dir, cuda, 4);
    let mut sink = Collect::default();
    for tag in 1..=3u64 {
        e.submit(request(
            tag,
            vec![3, 4, 5, 6],
            SamplingParams::default(),
            100,
        ))
        .unwrap();
    }
    // Warm-up: prefill and a few decode steps.
    for _ in 0..6 {
        e.step(&mut sink);
    }
    let before: BackendStats = e.backend_stats();
    for _ in 0..50 {
        e.step(&mut sink);
    }
    let after = e.backend_stats();
    assert_eq!(
        after.device_allocs, before.device_allocs,
        "no device allocation"
    );
    assert_eq!(
        after.pinned_allocs, before.pinned_allocs,
        "no pinned allocation"
    );
    assert_eq!(
        after.launches, before.launches,
        "decode steps launch no plain kernels"
    );
    assert_eq!(
        after.graph_launches - before.graph_launches,
        50,
        "one graph per step"
    );
    assert_eq!(
        after.hard_syncs - before.hard_syncs,
        50,
        "one wait per step, for its tokens"
    );
    assert_eq!(
        after.policy_syncs, before.policy_syncs,
        "no policy sync while decoding"
    );
    while e.step(&mut sink) {}
    for tag in 1..=3 {
        assert_eq!(tokens_of(&sink, tag).len(), 100);
    }
}

/// One sequence's entry of a backend step that returns the logits of its new positions and
/// samples nothing.
fn logits_step<'a>(
    slot: u32,
    tokens: &'a [u32],
    start_pos: u32,
    table: &'a [u32],
) -> nervad::backend::SeqStep<'a> {
    nervad::backend::SeqStep {
        slot,
        tokens,
        start_pos,
        block_table: table,
        sample: false,
        want_logits: true,
        from_last_sample: false,
    }
}

/// By default a prompt run as one prefill step (tensor-core projections, rope_append +
/// attn_split + attn_combine) and the same tokens fed one per step (the fused attn_decode) give
/// bit-identical logits at every position, and so do two sequences decoded side by side: the
/// kernels reduce each output in one order whatever the step looks like. The fast prefill
/// (cuBLAS) stays within the parity bound of it.
#[test]
fn prefill_and_fused_decode_give_identical_bits() {
    use nervad::backend::cuda::CudaBackend;
    use nervad::backend::{Backend, BackendOptions, StepOutput};
    let Some(cuda) = device() else { return };
    for preset in presets(&[Preset::Tiny, Preset::TinyQwen2], &[Preset::Qwen3_0_6b]) {
        let dir = checkpoint(preset);
        let model = LoadedModel::load(&dir).expect("load");
        let config = model.config.clone();
        let vocab = config.vocab_size;
        let options = BackendOptions {
            max_seqs: 4,
            max_step_tokens: 128,
            page_tokens: 16,
            kv_budget_bytes: 64 << 20,
            max_context: 256,
            threads: 0,
            swap: nervad::backend::SwapSpace::None,
        };
        let n = 70usize; // three attention tiles, the last partly filled
        let tokens: Vec<u32> = (0..n as u32).map(|i| (7 + 13 * i) % vocab as u32).collect();
        let table_a: Vec<u32> = (0..5).collect();
        let table_b: Vec<u32> = (5..10).collect();
        let params = SamplingParams::default();
        // The default: prefill through the decode kernels.
        let exact = cuda;
        let prefill = {
            let mut b = CudaBackend::new(&config, &model.weights, options, exact).expect("backend");
            b.start_sequence(0, &params, 0, &tokens).unwrap();
            b.start_sequence(1, &params, 0, &tokens).unwrap();
            let mut out = StepOutput::default();
            b.step(&[logits_step(0, &tokens[..], 0, &table_a)], &mut out)
                .unwrap();
            let prefill = out.logits.clone();
            assert_eq!(prefill.len(), n * vocab);
            for i in 0..n {
                let one = &tokens[i..i + 1];
                let batch = [
                    logits_step(1, one, i as u32, &table_b),
                    logits_step(0, one, i as u32, &table_a),
                ];
                // Slot 0 rewrites the KV values its prefill wrote.
                b.step(&batch, &mut out).unwrap();
                let want = &prefill[i * vocab..(i + 1) * vocab];
                for (which, got) in out.logits.chunks(vocab).enumerate() {
                    assert!(
                        got.iter()
                            .zip(want)
                            .all(|(a, b)| a.to_bits() == b.to_bits()),
                        "{preset:?}: position {i}: decode logits of batch entry {which} differ \
                         from the prefill's"
                    );
                }
            }
            prefill
        };
        let fast = CudaOptions {
            fast_prefill: true,
            ..cuda
        };
        let mut b = CudaBackend::new(&config, &model.weights, options, fast).expect("backend");
        b.start_sequence(0, &params, 0, &tokens).unwrap();
        let mut out = StepOutput::default();
        b.step(&[logits_step(0, &tokens[..], 0, &table_a)], &mut out)
            .unwrap();
        let scale = prefill.iter().fold(0f32, |m, x| m.max(x.abs()));
        let worst = prefill
            .iter()
            .zip(&out.logits)
            .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        assert!(
            worst <= REL_TOL * scale,
            "{preset:?}: fast (cuBLAS) prefill off by {worst} (max |logit| {scale})"
        );
        println!(
            "{preset:?}: {n} positions bit-identical (default prefill, fused decode, batch of \
             2); fast prefill within {:.2e} of max",
            worst / scale
        );
    }
}

/// `--projections blas` (cuBLAS for every projection launch of 16 tokens or more, decode
/// batches included, the tensor cores below) stays within the parity bound of the default
/// kernels: 16 sequences decoded side by side through cuBLAS, and one alone through the tensor
/// kernels, against the default backend's prefill of the same tokens at every position.
#[test]
fn blas_projections_stay_within_the_parity_bound() {
    use nervad::backend::cuda::{CudaBackend, Projections};
    use nervad::backend::{Backend, BackendOptions, SeqStep, StepOutput};
    let Some(cuda) = device() else { return };
    for preset in presets(&[Preset::Tiny, Preset::TinyQwen2], &[Preset::Qwen3_0_6b]) {
        let dir = checkpoint(preset);
        let model = LoadedModel::load(&dir).expect("load");
        let config = model.config.clone();
        let vocab = config.vocab_size;
        let seqs = 16usize;
        let n = 40usize; // two attention tiles, the second partly filled
        let pages = n.div_ceil(16);
        let options = BackendOptions {
            max_seqs: seqs + 1,
            max_step_tokens: 128,
            page_tokens: 16,
            kv_budget_bytes: 256 << 20,
            max_context: 256,
            threads: 0,
            swap: nervad::backend::SwapSpace::None,
        };
        let tokens: Vec<u32> = (0..n as u32)
            .map(|i| (11 + 17 * i) % vocab as u32)
            .collect();
        let tables: Vec<Vec<u32>> = (0..=seqs)
            .map(|s| ((s * pages) as u32..((s + 1) * pages) as u32).collect())
            .collect();
        let params = SamplingParams::default();
        let want = {
            let mut b = CudaBackend::new(&config, &model.weights, options, cuda).expect("backend");
            b.start_sequence(0, &params, 0, &tokens).unwrap();
            let mut out = StepOutput::default();
            b.step(&[logits_step(0, &tokens[..], 0, &tables[0])], &mut out)
                .unwrap();
            out.logits.clone()
        };
        let scale = want.iter().fold(0f32, |m, x| m.max(x.abs()));
        let blas = CudaOptions {
            projections: Projections::Blas,
            ..cuda
        };
        let mut b = CudaBackend::new(&config, &model.weights, options, blas).expect("backend");
        for s in 0..=seqs {
            b.start_sequence(s as u32, &params, 0, &tokens).unwrap();
        }
        let mut out = StepOutput::default();
        let (mut many, mut alone) = (0f32, 0f32);
        for i in 0..n {
            let one = &tokens[i..i + 1];
            let want = &want[i * vocab..(i + 1) * vocab];
            let off = |got: &[f32]| {
                got.iter()
                    .zip(want)
                    .fold(0f32, |m, (a, b)| m.max((a - b).abs()))
            };
            let batch: Vec<SeqStep> = (0..seqs)
                .map(|s| logits_step(s as u32, one, i as u32, &tables[s]))
                .collect();
            b.step(&batch, &mut out).unwrap();
            assert_eq!(out.logits.len(), seqs * vocab);
            many = out.logits.chunks(vocab).map(off).fold(many, f32::max);
            b.step(
                &[logits_step(seqs as u32, one, i as u32, &tables[seqs])],
                &mut out,
            )
            .unwrap();
            alone = alone.max(off(&out.logits));
        }
        assert!(
            many.max(alone) <= REL_TOL * scale,
            "{preset:?}: blas projections off by {many} in a batch of {seqs}, {alone} alone \
             (max |logit| {scale})"
        );
        println!(
            "{preset:?}: blas projections within {:.2e} of max in a batch of {seqs}, {:.2e} alone",
            many / scale,
            alone / scale
        );
    }
}

/// The speed-only kernel variants (`KernelTuning`: the deep one-n-tile projection, inputs
/// prepared for one n-tile, token-split multi-tile projections, the serial-split and the
/// cluster decode attention, the fixed-order GEMM on mma.sync and on wgmma) give the same bits
/// as the default kernels. Twenty sequences, one
/// of them past 16 attention tiles (so some splits hold two), are prefilled and then decoded in
/// steps of 20, 5 and 1 sequences (the split, prepared and one-token paths; the 5 and the 1
/// beside a chunk of another prompt: mixed steps) by backends with the variants on and by one
/// with none; every logit of every step must match bit for bit (and the prompts' KV, written
/// by the variants' prefill launches, feeds those logits).
#[test]
fn kernel_variants_give_identical_bits() {
    use nervad::backend::cuda::{
        CudaBackend, GemmSplit, KernelTuning, RingUse, WgStream, WideTiles,
    };
    use nervad::backend::{Backend, BackendOptions, SeqStep, StepOutput};
    let Some(cuda) = device() else { return };
    // TinyLlama: an untied LM head and an intermediate size (160) that is no multiple of the
    // tiled layout's 64 columns, so down_proj's tiles are padded.
    // Qwen2.5-0.5B: head dim 64 with q|k|v biases and 7 query heads per kv head, for the
    // q|k|v GEMM's rope epilogue (head dims 64 and 128 only, so not on the tiny presets).
    let presets = presets(
        &[Preset::Tiny, Preset::TinyLlama],
        &[Preset::Qwen3_0_6b, Preset::Qwen2_5_0_5b],
    );
    const PAGES: u32 = 48;
    const SEQS: usize = 20;
    let lengths: Vec<usize> = (0..SEQS)
        .map(|s| match s {
            0 => 600,
            1 => 130,
            s => 17 + 7 * s,
        })
        .collect();
    // Sequences in each decode step: all, the first five, all, the first five, one, all.
    let steps = [SEQS, 5, SEQS, 5, 1, SEQS];
    // Steps 1 and 4 also carry a chunk of one more sequence's prompt (ahead of the decode
    // entries in the batch), so that they mix decode tokens with prompt rows.
    const CHUNKS: [(usize, std::ops::Range<usize>); 2] = [(1, 0..70), (4, 70..130)];
    let extra_len = CHUNKS[1].1.end;
    for &preset in &presets {
        let dir = checkpoint(preset);
        let model = LoadedModel::load(&dir).expect("load");
        let config = model.config.clone();
        let vocab = config.vocab_size;
        let options = BackendOptions {
            max_seqs: 24,
            max_step_tokens: 640,
            page_tokens: 16,
            kv_budget_bytes: 64 << 20,
            max_context: 768,
            threads: 0,
            swap: nervad::backend::SwapSpace::None,
        };
        let prompts: Vec<Vec<u32>> = lengths
            .iter()
            .enumerate()
            .map(|(s, &n)| {
                (0..n as u32)
                    .map(|i| (5 + 31 * s as u32 + 11 * i) % vocab as u32)
                    .collect()
            })
            .collect();
        let tables: Vec<Vec<u32>> = (0..=SEQS as u32)
            .map(|s| (s * PAGES..(s + 1) * PAGES).collect())
            .collect();
        let extra: Vec<u32> = (0..extra_len as u32)
            .map(|i| (3 + 19 * i) % vocab as u32)
            .collect();
        let params = SamplingParams::default();
        let run = |tuning: KernelTuning| -> Vec<f32> {
            let opts = CudaOptions { tuning, ..cuda };
            let mut b = CudaBackend::new(&config, &model.weights, options, opts).expect("backend");
            let mut out = StepOutput::default();
            let mut logits = Vec::new();
            for (s, prompt) in prompts.iter().enumerate() {
                b.start_sequence(s as u32, &params, s as u64, prompt)
                    .unwrap();
                // The prompt's KV; logits from the decode steps.
                let step = SeqStep {
                    slot: s as u32,
                    tokens: prompt,
                    start_pos: 0,
                    block_table: &tables[s],
                    sample: false,
                    want_logits: false,
                    from_last_sample: false,
                };
                b.step(&[step], &mut out).unwrap();
            }
            b.start_sequence(SEQS as u32, &params, SEQS as u64, &extra)
                .unwrap();
            let mut pos = lengths.clone();
            for (k, &n) in steps.iter().enumerate() {
                let toks: Vec<u32> = (0..n as u32)
                    .map(|s| (17 + 7 * k as u32 + 3 * s) % vocab as u32)
                    .collect();
                let chunk = CHUNKS.iter().find(|c| c.0 == k).map(|(_, r)| SeqStep {
                    slot: SEQS as u32,
                    tokens: &extra[r.clone()],
                    start_pos: r.start as u32,
                    block_table: &tables[SEQS],
                    sample: false,
                    want_logits: true,
                    from_last_sample: false,
                });
                let decodes = (0..n).map(|s| SeqStep {
                    slot: s as u32,
                    tokens: &toks[s..s + 1],
                    start_pos: pos[s] as u32,
                    block_table: &tables[s],
                    sample: false,
                    want_logits: true,
                    from_last_sample: false,
                });
                let batch: Vec<SeqStep<'_>> = chunk.into_iter().chain(decodes).collect();
                b.step(&batch, &mut out).unwrap();
                logits.extend_from_slice(&out.logits);
                for p in &mut pos[..n] {
                    *p += 1;
                }
            }
            logits
        };
        // The baseline (row-major weights, every variant off) against the defaults and against
        // every variant on, over both weight layouts.
        let plain = run(KernelTuning::baseline());
        assert_eq!(
            plain.len(),
            (steps.iter().sum::<usize>() + extra_len) * vocab
        );
        let variants = [
            (
                "the default variants (tiled weights)",
                KernelTuning::default(),
            ),
            (
                "tiled weights + the persistent one-n-tile projections in 5 blocks",
                KernelTuning {
                    n1_persistent: true,
                    n1_persistent_blocks: 5,
                    ..KernelTuning::default()
                },
            ),
            (
                "row-major weights + the persistent one-n-tile projections, one wave of blocks",
                KernelTuning {
                    n1_persistent: true,
                    ..KernelTuning::baseline()
                },
            ),
            (
                "the default variants with the prompt attention's fold on wgmma (Hopper)",
                KernelTuning {
                    prefill_wgmma: true,
                    ..KernelTuning::default()
                },
            ),
            (
                "tiled weights + deep projections + serial attention + L2 prefetch",
                KernelTuning {
                    deep_n1_blocks_per_sm: 1 << 20,
                    serial_attention_from: Some(1),
                    l2_prefetch_bytes: 64 << 20,
                    l2_prefetch_until: 1 << 20,
                    ..KernelTuning::default()
                },
            ),
            (
                "tiled weights + serial attention in blocks of 4 warps (two per SM) from 1 token",
                KernelTuning {
                    serial_attention_from: Some(1),
                    serial_pairs_per_sm: Some(0),
                    ..KernelTuning::default()
                },
            ),
            (
                "serial attention from 1 token, its partials through global memory",
                KernelTuning {
                    serial_attention_from: Some(1),
                    serial_parts_shared: false,
                    ..KernelTuning::default()
                },
            ),
            (
                "tiled weights + the fixed-order GEMM from 9 tokens, 64-token tiles where fewer \
                 waves, chains in 4 blocks per tile",
                KernelTuning {
                    gemm_from: Some(9),
                    gemm_min_k: 0,
                    gemm_narrow: true,
                    gemm_split: GemmSplit::Fixed(4),
                    ..KernelTuning::default()
                },
            ),
            (
                "row-major weights + the fixed-order GEMM from 9 tokens, chains in 8 blocks per tile",
                KernelTuning {
                    gemm_from: Some(9),
                    gemm_split: GemmSplit::Fixed(8),
                    ..KernelTuning::baseline()
                },
            ),
            (
                "tiled weights + the fixed-order GEMM from 9 tokens, 128-token tiles, chains split \
                 where that saves waves",
                KernelTuning {
                    gemm_from: Some(9),
                    gemm_min_k: 0,
                    gemm_narrow: false,
                    gemm_split: GemmSplit::Auto,
                    ..KernelTuning::default()
                },
            ),
            (
                "tiled weights + the mma.sync GEMM (wgmma off) from 9 tokens, chains in 4 blocks \
                 per tile",
                KernelTuning {
                    gemm_from: Some(9),
                    gemm_min_k: 0,
                    gemm_split: GemmSplit::Fixed(4),
                    wgmma: false,
                    ..KernelTuning::default()
                },
            ),
            (
                "row-major weights + the wgmma GEMM (Hopper) from 9 tokens, 64-token tiles where \
                 fewer waves, chains in 8 blocks per tile",
                KernelTuning {
                    gemm_from: Some(9),
                    gemm_min_k: 0,
                    gemm_narrow: true,
                    gemm_split: GemmSplit::Fixed(8),
                    wgmma: true,
                    ..KernelTuning::baseline()
                },
            ),
            (
                "tiled weights + the warp-specialized wgmma GEMM (Hopper) from 9 tokens, \
                 128-token tiles, chains in 4 blocks per tile, persistent in 5 blocks",
                KernelTuning {
                    gemm_from: Some(9),
                    gemm_min_k: 0,
                    gemm_narrow: false,
                    gemm_split: GemmSplit::Fixed(4),
                    wg_specialized: true,
                    wg_persistent: true,
                    wg_persistent_blocks: 5,
                    ..KernelTuning::default()
                },
            ),
            (
                "row-major weights + the warp-specialized wgmma GEMM (Hopper) from 9 tokens, \
                 chains in 8 blocks per tile",
                KernelTuning {
                    gemm_from: Some(9),
                    gemm_min_k: 0,
                    gemm_split: GemmSplit::Fixed(8),
                    wgmma: true,
                    wg_specialized: true,
                    ..KernelTuning::baseline()
                },
            ),
            (
                "tiled weights + the wgmma GEMM staged by tensor copies (Hopper) from 9 tokens, \
                 64-token tiles where fewer waves, chains in 8 blocks per tile",
                KernelTuning {
                    gemm_from: Some(9),
                    gemm_min_k: 0,
                    gemm_narrow: true,
                    gemm_split: GemmSplit::Fixed(8),
                    wg_tma: true,
                    ..KernelTuning::default()
                },
            ),
            (
                "tiled weights + the wgmma GEMM staged by tensor copies (Hopper) from 9 tokens, \
                 whole chains per block, persistent in 3 blocks",
                KernelTuning {
                    gemm_from: Some(9),
                    gemm_min_k: 0,
                    gemm_narrow: false,
                    gemm_split: GemmSplit::Fixed(1),
                    wg_tma: true,
                    wg_persistent: true,
                    wg_persistent_blocks: 3,
                    ..KernelTuning::default()
                },
            ),
            (
                "tiled weights + the wgmma GEMM staged by tensor copies on 192-token tiles \
                 (Hopper) from 9 tokens, chains in 4 blocks per tile",
                KernelTuning {
                    gemm_from: Some(9),
                    gemm_min_k: 0,
                    gemm_narrow: false,
                    gemm_split: GemmSplit::Fixed(4),
                    wg_tma: true,
                    wg_wide_from: Some(9),
                    wg_wide_tiles: WideTiles::Wide,
                    ..KernelTuning::default()
                },
            ),
            (
                "tiled weights + the wgmma GEMM staged by tensor copies on 144-token tiles \
                 (Hopper) from 9 tokens, chains in 8 blocks per tile",
                KernelTuning {
                    gemm_from: Some(9),
                    gemm_min_k: 0,
                    gemm_narrow: false,
                    gemm_split: GemmSplit::Fixed(8),
                    wg_tma: true,
                    wg_wide_from: Some(9),
                    wg_wide_tiles: WideTiles::Mid,
                    ..KernelTuning::default()
                },
            ),
            (
                "tiled weights + the wgmma GEMM staged by tensor copies on 192-token tiles \
                 (Hopper) from 9 tokens, whole chains per block, persistent in 3 blocks",
                KernelTuning {
                    gemm_from: Some(9),
                    gemm_min_k: 0,
                    gemm_narrow: false,
                    gemm_split: GemmSplit::Fixed(1),
                    wg_tma: true,
                    wg_wide_from: Some(9),
                    wg_wide_tiles: WideTiles::Wide,
                    wg_persistent: true,
                    wg_persistent_blocks: 3,
                    ..KernelTuning::default()
                },
            ),
            (
                "tiled weights + the wgmma GEMM staged by tensor copies (Hopper) from 9 tokens, \
                 128-token tiles, whole waves of 3 tiles and the rest's chains in 4 blocks",
                KernelTuning {
                    gemm_from: Some(9),
                    gemm_min_k: 0,
                    gemm_narrow: false,
                    gemm_split: GemmSplit::Fixed(4),
                    gemm_tail: Some(3),
                    wg_tma: true,
                    ..KernelTuning::default()
                },
            ),
            (
                "tiled weights + the wgmma GEMM (Hopper) from 9 tokens, 64-token tiles where \
                 fewer waves, whole waves of 5 tiles and the rest's chains in 8 blocks",
                KernelTuning {
                    gemm_from: Some(9),
                    gemm_min_k: 0,
                    gemm_narrow: true,
                    gemm_split: GemmSplit::Fixed(8),
                    gemm_tail: Some(5),
                    ..KernelTuning::default()
                },
            ),
            (
                "row-major weights + the mma.sync GEMM from 9 tokens, whole waves of 3 tiles and \
                 the rest's chains in 4 blocks",
                KernelTuning {
                    gemm_from: Some(9),
                    gemm_split: GemmSplit::Fixed(4),
                    gemm_tail: Some(3),
                    ..KernelTuning::baseline()
                },
            ),
            (
                "tiled weights + the persistent wgmma GEMM (Hopper) from 9 tokens in 5 blocks",
                KernelTuning {
                    gemm_from: Some(9),
                    gemm_min_k: 0,
                    gemm_narrow: true,
                    gemm_split: GemmSplit::Auto,
                    wg_tma: false,
                    wg_stream: WgStream::Always,
                    wg_stream_blocks: 5,
                    ..KernelTuning::default()
                },
            ),
            (
                "row-major weights + the persistent wgmma GEMM (Hopper) from 9 tokens in 3 \
                 blocks (tiles shared in odd places)",
                KernelTuning {
                    gemm_from: Some(9),
                    gemm_min_k: 0,
                    gemm_narrow: true,
                    gemm_split: GemmSplit::Auto,
                    wgmma: true,
                    wg_stream: WgStream::Always,
                    wg_stream_blocks: 3,
                    ..KernelTuning::baseline()
                },
            ),
            (
                "the default variants + the weight ring in shared memory (n1r, n1dr, n1hr)",
                KernelTuning {
                    weight_ring: RingUse::Always,
                    weight_ring_deep: RingUse::Always,
                    ..KernelTuning::default()
                },
            ),
            (
                "the default variants + the deep projections' weight ring (n1dr)",
                KernelTuning {
                    weight_ring_deep: RingUse::Always,
                    ..KernelTuning::default()
                },
            ),
            (
                "row-major weights + the weight ring, every one-n-tile projection deep",
                KernelTuning {
                    weight_ring: RingUse::Always,
                    weight_ring_deep: RingUse::Always,
                    deep_n1_blocks_per_sm: 1000,
                    ..KernelTuning::baseline()
                },
            ),
            (
                "the default variants + the q|k|v GEMM's rope epilogue instead of rope_append",
                KernelTuning {
                    rope_epilogue: true,
                    ..KernelTuning::default()
                },
            ),
            (
                "the default variants + the q|k|v rope epilogue on 128-token GEMM tiles from 9 \
                 tokens (mixed steps: decode rows stored for the decode attention)",
                KernelTuning {
                    gemm_from: Some(9),
                    gemm_narrow: false,
                    gemm_min_k: 0,
                    rope_epilogue: true,
                    ..KernelTuning::default()
                },
            ),
            (
                "the default variants + L2 prefetch",
                KernelTuning {
                    l2_prefetch_bytes: 24 << 20,
                    l2_prefetch_until: 8,
                    ..KernelTuning::default()
                },
            ),
            (
                "row-major weights + prompt attention over shared KV tiles",
                KernelTuning {
                    prefill_attention: true,
                    ..KernelTuning::baseline()
                },
            ),
            (
                "the default variants, every prompt launch's splits folded in its blocks \
                 (attn_prefill_fold)",
                KernelTuning {
                    prefill_fold_from: Some(1),
                    ..KernelTuning::default()
                },
            ),
            (
                "the default variants, no prompt launch folded (attn_prefill + attn_combine)",
                KernelTuning {
                    prefill_fold_from: None,
                    ..KernelTuning::default()
                },
            ),
            (
                "the default variants, mixed steps' prompt rows through attn_split and their \
                 decode tokens through the default decode attention",
                KernelTuning {
                    prefill_attention: false,
                    ..KernelTuning::default()
                },
            ),
            (
                "the default variants, mixed steps' decode tokens through attn_prefill",
                KernelTuning {
                    mixed_decode_attention: false,
                    ..KernelTuning::default()
                },
            ),
            (
                "row-major weights + prepared inputs + token-split projections + cluster attention",
                KernelTuning {
                    prepared_from: 3,
                    token_split: true,
                    cluster_attention: true,
                    ..KernelTuning::baseline()
                },
            ),
        ];
        // NERVA_GPU_VARIANTS=<text>: only the variants whose description contains it (a quick
        // check of one kernel change on the GPU machine; unset in the full run).
        let only = std::env::var("NERVA_GPU_VARIANTS").unwrap_or_default();
        for (name, tuning) in variants {
            if !name.contains(only.as_str()) {
                continue;
            }
            let got = run(tuning);
            assert_eq!(plain.len(), got.len());
            if let Some(i) = plain
                .iter()
                .zip(&got)
                .position(|(a, b)| a.to_bits() != b.to_bits())
            {
                panic!(
                    "{preset:?}: logit {i} differs with {name}: {} vs {}",
                    plain[i], got[i]
                );
            }
            println!(
                "{preset:?}: {name} bit-identical to the baseline (decode steps of {steps:?} \
                 sequences, two of them with a prompt chunk, spans up to {})",
                lengths[0] + steps.len()
            );
        }
    }
}

#[test]
fn step_reports_add_up_to_the_cumulative_stats() {
    use nervad::backend::{SeqStep, StepOutput, StepReport};
    let Some(cuda) = device() else { return };
    let dir = checkpoint(Preset::Tiny);
    let m = load(&dir);
    let options = EngineOptions {
        max_batch: 2,
        max_context: 256,
        ..EngineOptions::default()
    };
    let mut b = nervad::backend::build(
        BackendChoice::Cuda,
        &m.config,
        &m.weights,
        options.backend_options(&m.config),
        cuda,
    )
    .expect("CUDA backend");
    let before: BackendStats = b.stats();
    let prompt = [3u32, 4, 5, 6];
    b.start_sequence(0, &SamplingParams::default(), 0, &prompt)
        .expect("start");
    let table: Vec<u32> = (0..16).collect();
    let mut out = StepOutput::with_capacity(2);
    let mut reports: Vec<StepReport> = Vec::new();
    let token = [0u32];
    // Prefill, then decode steps launched two deep (step t+1 before collecting t), as the
    // engine does: each report must still hold only its own step's figures.
    b.launch(
        &[SeqStep {
            slot: 0,
            tokens: &prompt,
            start_pos: 0,
            block_table: &table,
            sample: true,
            want_logits: false,
            from_last_sample: false,
        }],
        &mut out,
    )
    .expect("prefill");
    for pos in 4..20u32 {
        b.launch(
            &[SeqStep {
                slot: 0,
                tokens: &token,
                start_pos: pos,
                block_table: &table,
                sample: true,
                want_logits: false,
                from_last_sample: true,
            }],
            &mut out,
        )
        .expect("decode");
        b.collect(&mut out).expect("collect");
        let seen = Instant::now();
        let finished = out
            .report
            .finished_at
            .expect("device end on the host clock");
        assert!(finished <= seen + std::time::Duration::from_micros(50));
        reports.push(out.report);
    }
    b.collect(&mut out).expect("last collect");
    reports.push(out.report);
    let after = b.stats();
    let sum = |f: fn(&StepReport) -> u64| reports.iter().map(f).sum::<u64>();
    assert_eq!(after.steps - before.steps, reports.len() as u64);
    assert_eq!(after.launches - before.launches, sum(|r| r.launches));
    assert_eq!(
        after.graph_launches - before.graph_launches,
        sum(|r| r.graph_replays)
    );
    assert_eq!(
        after.graph_nodes - before.graph_nodes,
        sum(|r| r.graph_nodes)
    );
    assert_eq!(after.hard_syncs - before.hard_syncs, sum(|r| r.hard_syncs));
    assert_eq!(
        after.policy_syncs - before.policy_syncs,
        sum(|r| r.policy_syncs)
    );
    assert_eq!(
        after.debug_syncs - before.debug_syncs,
        sum(|r| r.debug_syncs)
    );
    assert_eq!(after.h2d_bytes - before.h2d_bytes, sum(|r| r.h2d_bytes));
    assert_eq!(after.d2h_bytes - before.d2h_bytes, sum(|r| r.d2h_bytes));
    assert_eq!(
        after.device_allocs - before.device_allocs,
        sum(|r| r.device_allocs)
    );
    assert_eq!(
        after.pinned_allocs - before.pinned_allocs,
        sum(|r| r.pinned_allocs)
    );
    assert_eq!(after.host_ns - before.host_ns, sum(|r| r.host_ns));
    let gpu_ms = sum(|r| r.gpu_ns) as f64 / 1e6;
    assert!(
        ((after.gpu_ms - before.gpu_ms) - gpu_ms).abs() < 1e-3 * reports.len() as f64,
        "device time: {} ms cumulative vs {gpu_ms} ms in the reports",
        after.gpu_ms - before.gpu_ms
    );
    assert!(
        reports.iter().all(|r| r.gpu_ns > 0 && r.hard_syncs == 1),
        "every step ran on the device and was waited for once"
    );
    assert!(
        reports
            .windows(2)
            .all(|w| w[0].finished_at <= w[1].finished_at),
        "steps finish in launch order"
    );
}

/// The default (tensor-core) projections are batch-invariant: one sequence's decode logits
/// are bit-identical alone and in batches of every size that picks another kernel variant
/// (1–8 tokens prepared in the kernel; 9–16, 17–32, 33–64 and 65+ prepared by to_half, with
/// 16- or 32-row blocks and one or two passes), wherever it sits in the batch. With
/// the default prefill (the same kernels), its prompt's prefill (one 40-token step) also
/// matches decoding it.
#[test]
fn tensor_projections_are_batch_invariant() {
    use nervad::backend::cuda::{CudaBackend, KernelTuning, Projections};
    use nervad::backend::{Backend, BackendOptions, SeqStep, StepOutput};
    let Some(cuda) = device() else { return };
    let presets = presets(&[Preset::Tiny], &[Preset::Qwen3_0_6b]);
    const SEQS: usize = 80;
    const PROMPT: usize = 40;
    for &preset in &presets {
        let dir = checkpoint(preset);
        let model = LoadedModel::load(&dir).expect("load");
        let config = model.config.clone();
        let vocab = config.vocab_size;
        let options = BackendOptions {
            max_seqs: SEQS,
            max_step_tokens: SEQS.max(PROMPT),
            page_tokens: 16,
            kv_budget_bytes: 1 << 30,
            max_context: 64,
            threads: 0,
            swap: nervad::backend::SwapSpace::None,
        };
        // The defaults, and the norm prologues reading the residual adds' chunk sums of squares
        // at every hidden size (by default only from 2,048 columns, past these presets).
        let sums = KernelTuning {
            norm_sums_from: Some(8),
            ..cuda.tuning
        };
        for tuning in [cuda.tuning, sums] {
            let exact = CudaOptions {
                projections: Projections::Tensor,
                tuning,
                ..cuda
            };
            let mut b = CudaBackend::new(&config, &model.weights, options, exact).expect("backend");
            let params = SamplingParams::default();
            let prompts: Vec<Vec<u32>> = (0..SEQS as u32)
                .map(|s| {
                    (0..PROMPT as u32)
                        .map(|i| (11 + 17 * s + 13 * i) % vocab as u32)
                        .collect()
                })
                .collect();
            let tables: Vec<Vec<u32>> = (0..SEQS as u32)
                .map(|s| (4 * s..4 * s + 4).collect())
                .collect();
            let mut out = StepOutput::default();
            // Prefill every prompt but the last token, one sequence per step.
            let mut prefill_last = Vec::new();
            for s in 0..SEQS {
                b.start_sequence(s as u32, &params, s as u64, &prompts[s])
                    .unwrap();
                let one = SeqStep {
                    slot: s as u32,
                    tokens: &prompts[s][..],
                    start_pos: 0,
                    block_table: &tables[s],
                    sample: false,
                    want_logits: s == 0,
                    from_last_sample: false,
                };
                b.step(&[one], &mut out).unwrap();
                if s == 0 {
                    prefill_last = out.logits[(PROMPT - 1) * vocab..PROMPT * vocab].to_vec();
                }
            }
            // Re-decode every sequence's last prompt token (rewriting the same KV values) in
            // batches of several sizes, sequence 0 at different places in the batch.
            let mut alone: Option<Vec<f32>> = None;
            for &n in &[1usize, 2, 7, 8, 9, 16, 17, 33, 64, 65, SEQS] {
                let at = (n / 2).min(n - 1);
                let order: Vec<usize> = (0..n).map(|i| (i + n - at) % n).collect();
                let batch: Vec<SeqStep<'_>> = order
                    .iter()
                    .map(|&s| SeqStep {
                        slot: s as u32,
                        tokens: &prompts[s][PROMPT - 1..],
                        start_pos: (PROMPT - 1) as u32,
                        block_table: &tables[s],
                        sample: false,
                        want_logits: true,
                        from_last_sample: false,
                    })
                    .collect();
                b.step(&batch, &mut out).unwrap();
                assert_eq!(order[at], 0);
                let got = out.logits[at * vocab..(at + 1) * vocab].to_vec();
                match &alone {
                    None => {
                        assert!(
                            got.iter()
                                .zip(&prefill_last)
                                .all(|(a, b)| a.to_bits() == b.to_bits()),
                            "{preset:?}, norm sums from {:?}: decode alone differs from the \
                             exact prefill",
                            tuning.norm_sums_from
                        );
                        alone = Some(got);
                    }
                    Some(want) => assert!(
                        got.iter()
                            .zip(want)
                            .all(|(a, b)| a.to_bits() == b.to_bits()),
                        "{preset:?}, norm sums from {:?}: sequence 0's logits in a batch of {n} \
                         differ from alone",
                        tuning.norm_sums_from
                    ),
                }
            }
            println!(
                "{preset:?}, norm sums from {:?}: tensor projections bit-identical alone, in \
                 batches of 2..{SEQS} and against the exact prefill",
                tuning.norm_sums_from
            );
        }
    }
}

/// Preemption by swap on the device: a sequence's KV pages are copied out to the pinned host
/// swap area while its next step is still in flight (the copy must wait for that step's KV
/// writes), its pages are then overwritten, and the copies come back into other pages; the
/// greedy tokens and log-probability bits that follow equal those of an uninterrupted run of
/// the same prompt, and the swaps allocate nothing.
#[test]
fn swapped_kv_pages_come_back_bit_exact_mid_generation() {
    use nervad::backend::cuda::CudaBackend;
    use nervad::backend::{Backend, BackendOptions, SeqStep, StepOutput, SwapSpace};
    let Some(cuda) = device() else { return };
    let dir = checkpoint(Preset::Tiny);
    let model = LoadedModel::load(&dir).expect("load");
    let config = model.config.clone();
    let vocab = config.vocab_size as u32;
    let page_tokens = 16;
    let page_bytes = page_tokens * nervad::backend::kv_bytes_per_token(&config, 2);
    let options = BackendOptions {
        max_seqs: 3, // the pool holds 3 × 6 pages: room to overwrite
        max_step_tokens: 64,
        page_tokens,
        kv_budget_bytes: 0,
        max_context: 96,
        threads: 0,
        swap: SwapSpace::Bytes(8 * page_bytes),
    };
    let mut b = CudaBackend::new(&config, &model.weights, options, cuda).expect("backend");
    assert_eq!(b.kv_page_bytes(), page_bytes);
    assert_eq!(b.limits().swap_pages, 8);
    assert!(b.limits().num_pages >= 16);
    let prompt: Vec<u32> = (0..40).map(|i| (3 + 11 * i) % vocab).collect();
    let params = SamplingParams::default();
    let (steps, swap_at) = (48usize, 16usize);
    let one = |slot, tokens: &'static [u32], pos: usize, table: &'static [u32]| SeqStep {
        slot,
        tokens,
        start_pos: pos as u32,
        block_table: table,
        sample: true,
        want_logits: false,
        from_last_sample: false,
    };
    let leak = |v: Vec<u32>| -> &'static [u32] { Box::leak(v.into_boxed_slice()) };
    let mut out = StepOutput::with_capacity(2);
    let mut generate = |b: &mut CudaBackend, slot: u32, tables: [&'static [u32]; 2]| {
        b.start_sequence(slot, &params, 0, &prompt).unwrap();
        b.step(&[one(slot, leak(prompt.clone()), 0, tables[0])], &mut out)
            .unwrap();
        let first = out.samples[0].unwrap();
        let mut got = vec![(first.token, first.logprob.to_bits())];
        for i in 0..steps {
            let pos = prompt.len() + i;
            let token = leak(vec![got.last().unwrap().0]);
            if i == swap_at && tables[0] != tables[1] {
                // Out while this step (which writes position `pos`) is in flight: the copy is
                // ordered after it. Then the old pages are scribbled over, and the copies come
                // back into other pages.
                b.launch(&[one(slot, token, pos, tables[0])], &mut out)
                    .unwrap();
                let written = (pos + 1).div_ceil(page_tokens);
                let before = b.stats().driver;
                let host: Vec<u32> = (0..written as u32).collect();
                b.swap_out(&tables[0][..written], &host).unwrap();
                b.collect(&mut out).unwrap();
                for &p in &tables[0][..written] {
                    b.copy_page(15, p).unwrap();
                }
                b.swap_in(&host, &tables[1][..written]).unwrap();
                let after = b.stats().driver;
                assert_eq!(after.device_allocs, before.device_allocs);
                assert_eq!(after.pinned_allocs, before.pinned_allocs);
                assert!(after.d2h_bytes - before.d2h_bytes >= (written * page_bytes) as u64);
                assert!(after.h2d_bytes - before.h2d_bytes >= (written * page_bytes) as u64);
            } else {
                let table = if i > swap_at { tables[1] } else { tables[0] };
                b.step(&[one(slot, token, pos, table)], &mut out).unwrap();
            }
            let s = out.samples[0].unwrap();
            got.push((s.token, s.logprob.to_bits()));
        }
        got
    };
    let plain = leak((0..6).collect());
    let want = generate(&mut b, 0, [plain, plain]);
    let before = leak((6..12).collect());
    let after = leak(vec![12, 13, 14, 15, 10, 11]);
    let got = generate(&mut b, 1, [before, after]);
    assert_eq!(got, want, "tokens and log-probability bits after a swap");
}

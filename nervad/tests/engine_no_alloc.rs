//! After warm-up, a decode step allocates nothing: neither the CPU backend's step (forward,
//! sampling with penalties/top-p/top-logprobs) nor the whole engine step (scheduler, backend,
//! sampling, detokenization with stop strings, event emission). Counted with a global allocator.
//! One test function only, so no other test thread allocates while we count.

mod engine_support;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use engine_support::*;
use nervad::backend::cpu::CpuBackend;
use nervad::backend::{Backend, BackendOptions, SeqStep, StepOutput};
use nervad::engine::{
    Engine, EngineEvent, EngineOptions, EventSink, InferenceEngine, Prompt, SamplingParams,
};

struct Counting;

static COUNTING: AtomicBool = AtomicBool::new(false);
static ALLOCS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards every call to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: same contract as ours.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: same contract as ours.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn count<R>(f: impl FnOnce() -> R) -> (R, usize) {
    ALLOCS.store(0, Ordering::SeqCst);
    COUNTING.store(true, Ordering::SeqCst);
    let r = f();
    COUNTING.store(false, Ordering::SeqCst);
    (r, ALLOCS.load(Ordering::SeqCst))
}

/// Counts events without keeping them (a sink that copied them would allocate).
#[derive(Default)]
struct Tally {
    tokens: usize,
    texts: usize,
    done: usize,
}

impl EventSink for Tally {
    fn emit(&mut self, event: EngineEvent<'_>) {
        match event {
            EngineEvent::Tokens { ids, .. } => self.tokens += ids.len(),
            EngineEvent::Text { .. } => self.texts += 1,
            EngineEvent::Done { .. } => self.done += 1,
            _ => {}
        }
    }
}

#[test]
fn decode_steps_allocate_nothing_after_warm_up() {
    // The counter does count.
    let (v, n) = count(|| std::hint::black_box(vec![1u8; 64]));
    drop(v);
    assert!(n > 0, "counting allocator is not installed");

    let sampling = SamplingParams {
        temperature: 0.8,
        top_k: 40,
        top_p: 0.9,
        min_p: 0.02,
        repetition_penalty: 1.2,
        presence_penalty: 0.3,
        frequency_penalty: 0.1,
        seed: 5,
        top_logprobs: 5,
    };

    // Backend alone, batch of 3.
    let c = config();
    let w = weights(&c, 3);
    let mut b = CpuBackend::new(
        &c,
        &w,
        BackendOptions {
            max_seqs: 4,
            max_step_tokens: 16,
            page_tokens: 4,
            kv_budget_bytes: 1 << 20,
            max_context: 128,
            threads: 2,
            swap: nervad::backend::SwapSpace::None,
        },
    )
    .unwrap();
    // 12 pages of 4 positions each: the 3 + 40 steps of a release build (10 in debug).
    let tables: [Vec<u32>; 3] = [(0..12).collect(), (12..24).collect(), (24..36).collect()];
    let mut pos = [0u32; 3];
    let mut input = [[1u32], [2], [3]];
    for (i, p) in pos.iter_mut().enumerate() {
        b.start_sequence(i as u32, &sampling, i as u64, &[1, 2, 3])
            .unwrap();
        *p = 0;
    }
    let mut out = StepOutput::with_capacity(4);
    let step = |b: &mut CpuBackend,
                out: &mut StepOutput,
                pos: &mut [u32; 3],
                input: &mut [[u32; 1]; 3]| {
        let batch: [SeqStep<'_>; 3] = std::array::from_fn(|i| SeqStep {
            slot: i as u32,
            tokens: &input[i],
            start_pos: pos[i],
            block_table: &tables[i],
            sample: true,
            want_logits: false,
            from_last_sample: false,
        });
        b.step(&batch, out).unwrap();
        for i in 0..3 {
            input[i] = [out.samples[i].unwrap().token];
            pos[i] += 1;
        }
    };
    for _ in 0..3 {
        step(&mut b, &mut out, &mut pos, &mut input);
    }
    let steps = if cfg!(debug_assertions) { 10 } else { 40 };
    let ((), n) = count(|| {
        for _ in 0..steps {
            step(&mut b, &mut out, &mut pos, &mut input);
        }
    });
    assert_eq!(n, 0, "backend: {n} allocations in {steps} decode steps");

    // Whole engine: three clients, one with two samples, stop strings, top logprobs.
    let options = EngineOptions {
        max_batch: 6,
        kv_budget_bytes: 1 << 20,
        threads: 2,
        max_step_tokens: 16,
        page_tokens: 4,
        ..EngineOptions::default()
    };
    let mut e = Engine::with_cpu_backend(model(4), options).unwrap();
    for client in 0..3u32 {
        let mut r = request(
            key(client, 1),
            Prompt::Text(format!("prompt of client {client}")),
            60,
        );
        r.sampling = sampling;
        r.stop.ignore_eos = true;
        r.stop.stop_strings = vec!["\u{1F600}never".into(), "zzzzzz".into()];
        r.n_samples = if client == 1 { 2 } else { 1 };
        e.submit(r).unwrap();
    }
    let mut tally = Tally::default();
    // Warm-up: prefill everything and a few decode steps.
    for _ in 0..8 {
        e.step(&mut tally);
    }
    let before = tally.tokens;
    let ((), n) = count(|| {
        for _ in 0..steps {
            e.step(&mut tally);
        }
    });
    assert_eq!(tally.done, 0, "all samples still running");
    assert_eq!(
        tally.tokens - before,
        4 * steps,
        "four samples decoded every step"
    );
    assert_eq!(
        n, 0,
        "engine: {n} allocations in {steps} steady-state steps"
    );
}

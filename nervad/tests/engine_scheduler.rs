//! Scheduler behaviour on the exact CPU backend: KV pages taken as sequences grow, preemption
//! with recompute and with swap to the host (and swap falling back to recompute), chunked
//! prefill, fairness between clients, prefix sharing. Outputs are compared bit for bit (token
//! ids and log-probabilities) with unconstrained runs.

mod engine_support;

use engine_support::*;
use nervad::backend::SwapSpace;
use nervad::engine::{
    Engine, EngineOptions, GenerateRequest, InferenceEngine, Preemption, Prompt, RequestKey,
    SamplingParams,
};

/// Bytes of KV per token of the test model (2 layers, K and V, 2 heads of 8, f32).
const KV_TOKEN_BYTES: usize = 2 * 2 * 16 * 4;

fn options(pages: usize) -> EngineOptions {
    EngineOptions {
        max_batch: 6,
        max_context: 48,
        kv_budget_bytes: pages * 4 * KV_TOKEN_BYTES,
        threads: 2,
        max_step_tokens: 16,
        page_tokens: 4,
        preemption: Preemption::Recompute,
        ..EngineOptions::default()
    }
}

/// `options(pages)` preempting by swap, with a host swap area of `swap_pages` pages.
fn swap_options(pages: usize, swap_pages: usize) -> EngineOptions {
    EngineOptions {
        preemption: Preemption::Swap,
        swap: SwapSpace::Bytes(swap_pages * 4 * KV_TOKEN_BYTES),
        ..options(pages)
    }
}

fn run(engine: &mut Engine, rec: &mut Recorder) {
    let mut guard = 0;
    while engine.step(rec) {
        guard += 1;
        assert!(guard < 5000, "engine did not finish");
    }
}

/// Token ids and the bits of their log-probabilities, per (request, sample).
fn outputs(rec: &Recorder, k: RequestKey, sample: u16) -> (Vec<u32>, Vec<u32>) {
    let mut ids = Vec::new();
    let mut bits = Vec::new();
    for e in &rec.events {
        if let Ev::Tokens(kk, s, t, l) = e
            && *kk == k
            && *s == sample
        {
            ids.extend_from_slice(t);
            bits.extend(l.iter().map(|x| x.to_bits()));
        }
    }
    (ids, bits)
}

/// A mix of greedy, seeded sampling with penalties, and a 3-sample fork, from three clients.
fn workload() -> Vec<GenerateRequest> {
    let sampled = SamplingParams {
        temperature: 0.9,
        top_k: 40,
        top_p: 0.95,
        repetition_penalty: 1.2,
        presence_penalty: 0.3,
        frequency_penalty: 0.2,
        seed: 77,
        ..SamplingParams::default()
    };
    let mut reqs = Vec::new();
    for i in 0..4u32 {
        let prompt: Vec<u32> = (0..9 + i).map(|t| (t * 7 + i * 13) % 250).collect();
        let mut r = request(key(i % 3, u64::from(i)), Prompt::Tokens(prompt), 30);
        r.stop.ignore_eos = true;
        if i % 2 == 1 {
            r.sampling = SamplingParams {
                seed: 77 + u64::from(i),
                ..sampled
            };
        }
        reqs.push(r);
    }
    let mut fork = request(key(2, 9), Prompt::Tokens((40..51).collect()), 14);
    fork.stop.ignore_eos = true;
    fork.sampling = sampled;
    fork.n_samples = 3;
    reqs.push(fork);
    reqs
}

fn serve(pages: usize, reqs: &[GenerateRequest]) -> (Recorder, u64) {
    serve_with(options(pages), reqs)
}

fn serve_with(options: EngineOptions, reqs: &[GenerateRequest]) -> (Recorder, u64) {
    let (rec, e) = serve_engine(options, reqs);
    (rec, e.preemptions())
}

/// Serve `reqs` to the end; every KV page and host swap slot is back at the end.
fn serve_engine(options: EngineOptions, reqs: &[GenerateRequest]) -> (Recorder, Engine) {
    let pages = options.kv_budget_bytes / (options.page_tokens * KV_TOKEN_BYTES);
    let mut e = Engine::with_cpu_backend(model(3), options).unwrap();
    let mut rec = Recorder::default();
    for r in reqs {
        e.submit(r.clone()).unwrap();
    }
    run(&mut e, &mut rec);
    assert_eq!(e.free_pages(), pages, "every page returned");
    assert_eq!(e.host_swap_pages().0, 0, "every host swap slot returned");
    assert_eq!(
        e.swap_ins(),
        e.swap_outs(),
        "every swapped sequence came back"
    );
    (rec, e)
}

/// Every sample of every request of `reqs` has the tokens, log-probability bits and finish
/// of `want`.
fn assert_same_outputs(reqs: &[GenerateRequest], got: &Recorder, want: &Recorder, what: &str) {
    for r in reqs {
        for s in 0..r.n_samples {
            let w = outputs(want, r.key, s);
            assert!(!w.0.is_empty());
            assert_eq!(outputs(got, r.key, s), w, "{what}: {:?} sample {s}", r.key);
            assert_eq!(got.done(r.key, s), want.done(r.key, s), "{what}");
        }
    }
}

/// Preemption under a tiny KV pool (18 pages; a full-context sequence takes 12) gives every request
/// and every sample exactly the tokens and log-probability bits of a run with room for all:
/// recompute re-prefills the prefix (the CPU's prefill and decode math give identical bits)
/// and the sampler resumes at its exact penalty counts and random-stream position.
#[test]
fn preemption_under_a_tiny_pool_gives_identical_outputs() {
    let reqs = workload();
    let (roomy, none) = serve(96, &reqs);
    assert_eq!(none, 0, "96 pages hold everything");
    let (tight, preempted) = serve(18, &reqs);
    assert!(preempted >= 3, "only {preempted} preemptions");
    for r in &reqs {
        for s in 0..r.n_samples {
            let want = outputs(&roomy, r.key, s);
            assert!(!want.0.is_empty());
            assert_eq!(outputs(&tight, r.key, s), want, "{:?} sample {s}", r.key);
            assert_eq!(tight.done(r.key, s), roomy.done(r.key, s));
        }
    }
}

/// Preemption by swap under the same tiny pool: the victims' own pages go to the host swap
/// area and back (a fork's shared prompt pages stay resident), nothing is recomputed, and
/// every request and sample (greedy, seeded sampling with penalties, a 3-sample fork) has
/// exactly the tokens and log-probability bits of the run with room for all.
#[test]
fn swap_preemption_under_a_tiny_pool_gives_identical_outputs() {
    let reqs = workload();
    let (roomy, _) = serve(96, &reqs);
    let (tight, e) = serve_engine(swap_options(18, 64), &reqs);
    assert!(e.preemptions() >= 3, "only {} preemptions", e.preemptions());
    assert_eq!(e.swap_outs(), e.preemptions(), "every preemption swapped");
    assert!(e.pages_swapped().0 > 0);
    assert_eq!(e.recomputed_tokens(), 0, "nothing recomputed");
    assert_same_outputs(&reqs, &tight, &roomy, "swap");
}

/// A host swap area of 3 pages holds some victims and not others: those recompute, and the
/// outputs are still exactly those of the roomy run.
#[test]
fn a_full_swap_area_falls_back_to_recompute_and_stays_identical() {
    let reqs = workload();
    let (roomy, _) = serve(96, &reqs);
    let (tight, e) = serve_engine(swap_options(18, 3), &reqs);
    let swaps = e.swap_outs();
    assert!(swaps > 0, "the area held some victims");
    assert!(
        swaps < e.preemptions(),
        "{swaps} of {} swapped",
        e.preemptions()
    );
    assert!(e.recomputed_tokens() > 0, "the others recomputed");
    assert_same_outputs(&reqs, &tight, &roomy, "swap area full");
}

/// Run `reqs` on a tiny pool until a sequence is swapped out, then `end` some of them (cancel,
/// or the client's death): the host slots of the swapped sequences ended are free at once,
/// and the requests left finish with exactly their roomy outputs.
fn end_while_swapped(end: impl Fn(&mut Engine, &[GenerateRequest]), ended: &[usize]) {
    // A low-priority request is admitted first and is the victim when the others (priority
    // 5) need its pages.
    let mut reqs = workload();
    reqs.truncate(4);
    for (i, r) in reqs.iter_mut().enumerate() {
        r.priority = if i == 0 { 0 } else { 5 };
    }
    let (roomy, _) = serve(96, &reqs);
    let mut e = Engine::with_cpu_backend(model(3), swap_options(14, 64)).unwrap();
    let mut rec = Recorder::default();
    for r in &reqs {
        e.submit(r.clone()).unwrap();
    }
    let mut guard = 0;
    while e.swapped() == 0 {
        assert!(e.step(&mut rec), "finished without a swap");
        guard += 1;
        assert!(guard < 5000);
    }
    assert!(
        e.host_swap_pages().0 > 0,
        "a swapped sequence holds host pages"
    );
    end(&mut e, &reqs);
    e.step(&mut rec);
    assert_eq!(e.swapped(), 0, "the swapped request ended");
    assert_eq!(e.host_swap_pages().0, 0, "its host pages are free");
    run(&mut e, &mut rec);
    assert_eq!(e.free_pages(), 14);
    let left: Vec<_> = (0..reqs.len())
        .filter(|i| !ended.contains(i))
        .map(|i| reqs[i].clone())
        .collect();
    assert_same_outputs(&left, &rec, &roomy, "after the end of a swapped request");
}

#[test]
fn cancelling_a_swapped_request_frees_its_host_pages() {
    end_while_swapped(|e, reqs| e.cancel(reqs[0].key), &[0]);
}

#[test]
fn a_swapped_requests_client_dying_frees_its_host_pages() {
    // Client 0 sent requests 0 and 3.
    end_while_swapped(|e, reqs| e.drop_client(reqs[0].key.client), &[0, 3]);
}

/// A 33-token prompt of client 1 asking for 8 tokens (ignore_eos): 7 chunks of 5.
fn long_prompt() -> GenerateRequest {
    let mut long = request(
        key(1, 20),
        Prompt::Tokens((0..33).map(|t| (t * 11) % 256).collect()),
        8,
    );
    long.stop.ignore_eos = true;
    long
}

/// Chunked prefill (a 5-token budget: 33-token prompts in 7 chunks, chunks sharing steps with
/// decodes) gives exactly the tokens and log-probability bits of whole-prompt prefill.
#[test]
fn chunked_prefill_gives_identical_outputs() {
    let mut reqs = workload();
    let long = long_prompt();
    reqs.push(long);
    let whole = EngineOptions {
        max_step_tokens: 64,
        ..options(96)
    };
    let chunked = EngineOptions {
        max_step_tokens: 5,
        max_batch: 5,
        ..options(96)
    };
    let (want, _) = serve_with(whole, &reqs);
    let (got, _) = serve_with(chunked, &reqs);
    for r in &reqs {
        for s in 0..r.n_samples {
            assert_eq!(
                outputs(&got, r.key, s),
                outputs(&want, r.key, s),
                "{:?} {s}",
                r.key
            );
        }
    }
}

/// Steps until `then` has its first token, submitted once `first` (served alone until then)
/// has its first token and decodes.
fn steps_to_first_token_beside(
    options: EngineOptions,
    first: &GenerateRequest,
    then: &GenerateRequest,
) -> usize {
    let mut e = Engine::with_cpu_backend(model(3), options).unwrap();
    let mut rec = Recorder::default();
    let has_token = |rec: &Recorder, k: RequestKey| {
        rec.events
            .iter()
            .any(|ev| matches!(ev, Ev::Tokens(kk, ..) if *kk == k))
    };
    e.submit(first.clone()).unwrap();
    while !has_token(&rec, first.key) {
        assert!(
            e.step(&mut rec),
            "engine finished before {:?} had a token",
            first.key
        );
    }
    e.submit(then.clone()).unwrap();
    for step in 1..5000 {
        assert!(
            e.step(&mut rec),
            "engine finished before {:?} had a token",
            then.key
        );
        if has_token(&rec, then.key) {
            return step;
        }
    }
    panic!("{:?} had no token", then.key);
}

/// Steps until `k` has its first token, serving `reqs` on `options`.
fn steps_to_first_token(options: EngineOptions, reqs: &[GenerateRequest], k: RequestKey) -> usize {
    let mut e = Engine::with_cpu_backend(model(3), options).unwrap();
    let mut rec = Recorder::default();
    for r in reqs {
        e.submit(r.clone()).unwrap();
    }
    for step in 1..5000 {
        assert!(e.step(&mut rec), "engine finished before {k:?} had a token");
        if rec
            .events
            .iter()
            .any(|ev| matches!(ev, Ev::Tokens(kk, ..) if *kk == k))
        {
            return step;
        }
    }
    panic!("{k:?} had no token");
}

/// `prefill_chunk` caps the prompt tokens a step carries beside decoding requests, whatever
/// room the step budget leaves: beside one decoding request a 33-token prompt takes
/// ceil(33 / 5) = 7 steps to its first token under a chunk of 5 (one step under a budget of 64
/// without a chunk). A lone prompt (nothing decoding, nothing else waiting) takes the whole
/// budget with or without the chunk: one step. Beside the requests of `workload` every output
/// keeps its bits.
#[test]
fn prefill_chunk_caps_prompt_tokens_per_step() {
    let mut reqs = workload();
    let long = long_prompt();
    let whole = EngineOptions {
        max_step_tokens: 64,
        ..options(96)
    };
    let chunked = EngineOptions {
        prefill_chunk: 5,
        ..whole
    };
    // The long prompt beside one decoding request: its chunks are the only prompt tokens of
    // their steps.
    let mut decoding = request(key(2, 21), Prompt::Tokens(vec![3, 1, 4]), 40);
    decoding.stop.ignore_eos = true;
    assert_eq!(steps_to_first_token_beside(whole, &decoding, &long), 1);
    assert_eq!(steps_to_first_token_beside(chunked, &decoding, &long), 7);
    // Alone, the chunk does not hold it back.
    for o in [whole, chunked] {
        assert_eq!(
            steps_to_first_token(o, std::slice::from_ref(&long), long.key),
            1
        );
    }
    reqs.push(long);
    let (want, _) = serve_with(whole, &reqs);
    let (got, _) = serve_with(chunked, &reqs);
    assert_same_outputs(&reqs, &got, &want, "prefill chunk 5");
}

/// Prefix sharing across requests and clients: a 24-token prefix (6 full pages) prefilled for
/// one client's request stays cached after it ends; two other clients' requests with that
/// prefix take those pages instead of prefilling them, hold them once (6 shared pages, 9
/// pages held in all instead of 15), and produce exactly what each produces on a fresh engine.
#[test]
fn shared_prefixes_are_stored_once_and_give_identical_outputs() {
    let prefix: Vec<u32> = (0..24).map(|t| (t * 5 + 3) % 256).collect();
    let with = |suffix: &[u32]| {
        let mut p = prefix.clone();
        p.extend_from_slice(suffix);
        p
    };
    let mut reqs = vec![
        request(key(1, 1), Prompt::Tokens(with(&[9, 8])), 6),
        request(key(2, 1), Prompt::Tokens(with(&[7])), 6),
        request(
            key(3, 1),
            Prompt::Tokens(with(&[100, 101, 102, 103, 104])),
            6,
        ),
    ];
    reqs[2].sampling = SamplingParams {
        temperature: 0.8,
        repetition_penalty: 1.3,
        seed: 5,
        ..SamplingParams::default()
    };
    for r in &mut reqs {
        r.stop.ignore_eos = true;
    }
    let alone: Vec<_> = reqs
        .iter()
        .map(|r| {
            let (rec, _) = serve(96, std::slice::from_ref(r));
            outputs(&rec, r.key, 0)
        })
        .collect();

    let mut e = Engine::with_cpu_backend(model(3), options(96)).unwrap();
    let mut rec = Recorder::default();
    e.submit(reqs[0].clone()).unwrap();
    run(&mut e, &mut rec);
    assert_eq!(e.free_pages(), 96);
    assert!(e.cached_pages() >= 6, "the prefix stays cached");
    e.submit(reqs[1].clone()).unwrap();
    e.submit(reqs[2].clone()).unwrap();
    e.step(&mut rec);
    assert_eq!(e.prefix_hits(), 12, "6 pages found for each");
    assert_eq!(e.shared_pages(), 6);
    assert_eq!(
        96 - e.free_pages(),
        6 + 1 + 2,
        "prefix once, then 1 and 2 own pages"
    );
    run(&mut e, &mut rec);
    for (r, want) in reqs.iter().zip(&alone) {
        assert_eq!(&outputs(&rec, r.key, 0), want, "{:?}", r.key);
    }
    assert_eq!(e.free_pages(), 96);
}

/// A forked request whose shared prompt is all in the prefix cache forks without prefilling
/// anything, and its samples equal those of the first run that computed the prompt.
#[test]
fn a_fork_whose_prompt_is_cached_forks_at_once_with_identical_samples() {
    // 13 tokens: the primary prefills 12 = 3 full pages, all cached after the first run.
    let prompt: Vec<u32> = (0..13).map(|t| (t * 17 + 5) % 256).collect();
    let fork = |tag| {
        let mut r = request(key(4, tag), Prompt::Tokens(prompt.clone()), 10);
        r.stop.ignore_eos = true;
        r.n_samples = 3;
        r.sampling = SamplingParams {
            temperature: 0.7,
            seed: 21,
            ..SamplingParams::default()
        };
        r
    };
    let mut e = Engine::with_cpu_backend(model(3), options(96)).unwrap();
    let mut rec = Recorder::default();
    e.submit(fork(1)).unwrap();
    run(&mut e, &mut rec);
    assert_eq!(e.prefix_hits(), 0);
    e.submit(fork(2)).unwrap();
    run(&mut e, &mut rec);
    assert_eq!(e.prefix_hits(), 3, "the primary found its 3 prompt pages");
    for s in 0..3 {
        let first = outputs(&rec, key(4, 1), s);
        assert_eq!(first.0.len(), 10);
        assert_eq!(outputs(&rec, key(4, 2), s), first, "sample {s}");
    }
    assert_eq!(e.free_pages(), 96);
}

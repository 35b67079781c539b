//! The engine over a backend that overlaps (a device): the next decode step is launched before
//! the previous one's tokens are seen. Outputs must be exactly those of the step-by-step
//! engine; a sequence that stops on a token costs at most one discarded step; nothing is
//! launched past max_tokens.

mod engine_support;

use engine_support::*;
use nervad::engine::{Engine, EngineOptions, FinishReason, InferenceEngine, Prompt};

fn engine(script: &[u32], overlap: bool) -> (Engine, StepLog) {
    let mut backend = ScriptedBackend::new(scripted_limits(), script.to_vec());
    backend.overlap = overlap;
    let log = backend.log.clone();
    let e = Engine::new(
        scripted_model(),
        Box::new(backend),
        EngineOptions::default(),
    );
    (e, log)
}

fn run(engine: &mut Engine, rec: &mut Recorder) {
    let mut guard = 0;
    while engine.step(rec) {
        guard += 1;
        assert!(guard < 1000, "engine did not finish");
    }
}

/// Steps that ran, and the entries of each.
fn steps(log: &StepLog) -> Vec<Vec<(u32, usize, u32)>> {
    log.lock().unwrap().clone()
}

#[test]
fn pipelined_outputs_equal_step_by_step_outputs() {
    let script = [
        u32::from(b'a'),
        u32::from(b'b'),
        u32::from(b'c'),
        EOS,
        u32::from(b'd'),
    ];
    for max_tokens in [1, 2, 3, 10] {
        let mut outs = Vec::new();
        let mut step_counts = Vec::new();
        for overlap in [false, true] {
            let (mut e, log) = engine(&script, overlap);
            let mut rec = Recorder::default();
            let (k1, k2) = (key(1, 1), key(2, 1));
            e.submit(request(k1, Prompt::Tokens(vec![5, 6, 7]), max_tokens))
                .unwrap();
            e.submit(request(k2, Prompt::Tokens(vec![8]), max_tokens + 1))
                .unwrap();
            run(&mut e, &mut rec);
            outs.push((
                rec.tokens(k1, 0),
                rec.done(k1, 0),
                rec.tokens(k2, 0),
                rec.done(k2, 0),
                rec.text(k1, 0),
            ));
            step_counts.push(steps(&log).len());
            assert_eq!(e.in_flight(), 0);
            assert_eq!(
                e.free_pages(),
                scripted_limits().num_pages,
                "pages returned"
            );
        }
        assert_eq!(outs[0], outs[1], "max_tokens {max_tokens}: same events");
        // Speculation never runs past max_tokens; an eos costs at most one step more.
        assert!(
            step_counts[1] <= step_counts[0] + 1,
            "max_tokens {max_tokens}: {step_counts:?}"
        );
    }
}

#[test]
fn speculative_steps_feed_the_device_token_one_position_on() {
    let (mut e, log) = engine(&[u32::from(b'x'); 8], true);
    let mut rec = Recorder::default();
    let k = key(1, 1);
    e.submit(request(k, Prompt::Tokens(vec![5, 6]), 4)).unwrap();
    run(&mut e, &mut rec);
    assert_eq!(rec.tokens(k, 0).len(), 4);
    assert_eq!(rec.done(k, 0), vec![FinishReason::Length]);
    // Prefill at 0 (2 tokens), then decode at positions 2, 3, 4: each position once, in order,
    // although the steps after the first decode were launched before their input was known.
    let positions: Vec<u32> = steps(&log).iter().map(|s| s[0].2).collect();
    assert_eq!(positions, vec![0, 2, 3, 4]);
}

#[test]
fn a_slot_reused_after_a_stop_never_gets_the_old_sequences_token() {
    // The first request stops on eos while its next step is already in flight; a queued second
    // request takes the freed slot. The stale step's token must not reach the new request.
    let script = [u32::from(b'a'), EOS, u32::from(b'z'), u32::from(b'z')];
    let mut limits = scripted_limits();
    limits.max_seqs = 1;
    let mut backend = ScriptedBackend::new(limits, script.to_vec());
    backend.overlap = true;
    let log = backend.log.clone();
    let mut e = Engine::new(
        scripted_model(),
        Box::new(backend),
        EngineOptions::default(),
    );
    let mut rec = Recorder::default();
    let (k1, k2) = (key(1, 1), key(2, 1));
    e.submit(request(k1, Prompt::Tokens(vec![5]), 10)).unwrap();
    // Prefill (collected at once), the first decode step (left in flight), then the speculative
    // step launched before that decode step's eos is seen.
    for _ in 0..3 {
        e.step(&mut rec);
    }
    assert_eq!(rec.done(k1, 0), vec![FinishReason::Stop]);
    e.submit(request(k2, Prompt::Tokens(vec![6]), 2)).unwrap();
    run(&mut e, &mut rec);
    let positions: Vec<u32> = steps(&log).iter().map(|s| s[0].2).collect();
    assert_eq!(
        positions,
        vec![0, 1, 2, 0, 1],
        "k1: prefill, decode, one discarded speculative step; then k2"
    );
    assert_eq!(rec.tokens(k1, 0), vec![u32::from(b'a')]);
    assert_eq!(rec.done(k1, 0), vec![FinishReason::Stop]);
    // The scripted backend restarts its script per slot at start_sequence: k2 sees 'a', then
    // stops on eos (not the stale 'z' of k1's discarded speculative step).
    assert_eq!(rec.tokens(k2, 0), vec![u32::from(b'a')]);
    assert_eq!(rec.done(k2, 0), vec![FinishReason::Stop]);
}

/// Launch-ahead decode and preemption together, over a backend that models the paged KV pool
/// (every output is a hash of the tokens read back through the block table): a pool of 18
/// pages for six requests that need 63 gives every request exactly the tokens of a roomy
/// step-by-step run, forks included, whether preemption recomputes (no swap area), swaps
/// (a roomy swap area; a slot swapped back in is poisoned, so a stale read shows), or swaps
/// until a 3-page area is full and then recomputes.
#[test]
fn preemption_with_launch_ahead_keeps_every_sequence_exact() {
    let run_with = |pages: usize, overlap: bool, swap_pages: usize| {
        let limits = nervad::backend::BackendLimits {
            num_pages: pages,
            swap_pages,
            ..scripted_limits()
        };
        let mut backend = ScriptedBackend::new(limits, Vec::new());
        backend.overlap = overlap;
        backend.kv_model = true;
        let mut e = Engine::new(
            scripted_model(),
            Box::new(backend),
            EngineOptions::default(),
        );
        let mut rec = Recorder::default();
        let mut keys = Vec::new();
        for i in 0..6u32 {
            let k = key(i % 3, u64::from(i));
            let prompt: Vec<u32> = (0..5 + i).map(|t| 60 + (t * 3 + i) % 30).collect();
            let mut r = request(k, Prompt::Tokens(prompt), 30);
            r.stop.ignore_eos = true;
            if i == 5 {
                r.n_samples = 2;
            }
            e.submit(r).unwrap();
            keys.push((k, if i == 5 { 2 } else { 1 }));
        }
        run(&mut e, &mut rec);
        assert_eq!(e.free_pages(), pages);
        assert_eq!(
            e.host_swap_pages(),
            (0, swap_pages),
            "every host slot returned"
        );
        assert_eq!(e.swap_ins(), e.swap_outs());
        let outs: Vec<_> = keys
            .iter()
            .flat_map(|&(k, n)| (0..n).map(move |s| (k, s)))
            .map(|(k, s)| (rec.tokens(k, s), rec.done(k, s)))
            .collect();
        (outs, e.preemptions(), e.swap_outs(), e.recomputed_tokens())
    };
    let (want, none, _, _) = run_with(64, false, 0);
    assert_eq!(none, 0);
    assert!(
        want.iter()
            .all(|(t, d)| t.len() == 30 && d == &[FinishReason::Length])
    );
    for overlap in [false, true] {
        let (got, preempted, swaps, again) = run_with(18, overlap, 0);
        assert!(preempted > 0, "overlap {overlap}: the pool ran dry");
        assert_eq!((swaps, again > 0), (0, true), "no swap area: recompute");
        assert_eq!(got, want, "overlap {overlap}");

        let (got, preempted, swaps, again) = run_with(18, overlap, 64);
        assert!(preempted > 0, "overlap {overlap}: the pool ran dry");
        assert_eq!((swaps, again), (preempted, 0), "every preemption swapped");
        assert_eq!(got, want, "overlap {overlap}, swap");

        let (got, preempted, swaps, again) = run_with(18, overlap, 3);
        assert!(
            swaps > 0 && swaps < preempted,
            "{swaps} of {preempted} swapped"
        );
        assert!(again > 0, "a full swap area recomputes");
        assert_eq!(got, want, "overlap {overlap}, swap area full");
    }
}

/// Mixed steps are launched ahead too: while a step with prefill chunks runs, the next one
/// (decodes one position on, the next chunks of long prompts) is already launched, and every
/// output equals the step-by-step engine's (paged-KV model backend, prompts of 40 tokens split
/// into chunks by the 16-token budget while other sequences decode).
#[test]
fn mixed_prefill_and_decode_steps_are_launched_ahead_exactly() {
    let run_with = |overlap: bool| {
        let mut backend = ScriptedBackend::new(scripted_limits(), Vec::new());
        backend.overlap = overlap;
        backend.kv_model = true;
        let ahead = backend.prefill_launched_ahead.clone();
        let mut e = Engine::new(
            scripted_model(),
            Box::new(backend),
            EngineOptions::default(),
        );
        let mut rec = Recorder::default();
        let keys: Vec<_> = (0..3).map(|i| key(i, 1)).collect();
        for (i, &k) in keys.iter().enumerate() {
            let len = if i == 0 { 3 } else { 40 };
            let prompt: Vec<u32> = (0..len).map(|t| 70 + (t * 5 + i as u32) % 40).collect();
            let mut r = request(k, Prompt::Tokens(prompt), 12);
            r.stop.ignore_eos = true;
            e.submit(r).unwrap();
        }
        run(&mut e, &mut rec);
        let outs: Vec<_> = keys.iter().map(|&k| rec.tokens(k, 0)).collect();
        (outs, ahead.load(std::sync::atomic::Ordering::Relaxed))
    };
    let (want, _) = run_with(false);
    assert!(want.iter().all(|t| t.len() == 12));
    let (got, ahead) = run_with(true);
    assert_eq!(got, want);
    assert!(ahead > 0, "no prefill chunk was launched ahead");
}

/// A client that stops reading must not hold the pool: its parked sample's pages go to
/// another client's request that needs them, and when it drains it recomputes and goes on
/// with exactly the tokens of an uninterrupted run (paged-KV model backend).
#[test]
fn a_paused_clients_pages_serve_others_and_it_resumes_exactly() {
    let limits = nervad::backend::BackendLimits {
        num_pages: 12,
        ..scripted_limits()
    };
    let new_engine = || {
        let mut backend = ScriptedBackend::new(limits, Vec::new());
        backend.kv_model = true;
        Engine::new(
            scripted_model(),
            Box::new(backend),
            EngineOptions::default(),
        )
    };
    let (a, b) = (key(1, 1), key(2, 1));
    let req_a = || {
        let mut r = request(a, Prompt::Tokens((0..6).map(|t| 80 + t).collect()), 30);
        r.stop.ignore_eos = true;
        r
    };
    let mut alone = new_engine();
    let mut want = Recorder::default();
    alone.submit(req_a()).unwrap();
    run(&mut alone, &mut want);

    let mut e = new_engine();
    let mut rec = Recorder::default();
    e.submit(req_a()).unwrap();
    while rec.tokens(a, 0).len() < 20 {
        e.step(&mut rec);
    }
    e.set_paused(a.client, true);
    e.step(&mut rec);
    let held_by_a = limits.num_pages - e.free_pages();
    assert!(held_by_a >= 6, "a holds {held_by_a} pages");
    // b needs 5 prompt pages and a decode page: more than are free while a holds its own.
    let mut r = request(b, Prompt::Tokens((0..20).map(|t| 120 + t).collect()), 20);
    r.stop.ignore_eos = true;
    e.submit(r).unwrap();
    let mut guard = 0;
    while rec.done(b, 0).is_empty() {
        e.step(&mut rec);
        guard += 1;
        assert!(guard < 500, "b never ran while a was paused");
    }
    assert_eq!(rec.tokens(b, 0).len(), 20);
    assert!(e.preemptions() > 0, "a's pages were taken");
    e.set_paused(a.client, false);
    run(&mut e, &mut rec);
    assert_eq!(rec.tokens(a, 0), want.tokens(a, 0));
    assert_eq!(rec.done(a, 0), vec![FinishReason::Length]);
    assert_eq!(e.free_pages(), limits.num_pages);
}

/// The same for a prompt caught in mid-prefill by the pause (it keeps its slot, not being a
/// decoding sample): its pages go to the other client's request, and it prefills again when
/// the client drains, with the tokens of an uninterrupted run.
#[test]
fn a_paused_clients_half_prefilled_prompt_gives_its_pages_back() {
    let limits = nervad::backend::BackendLimits {
        num_pages: 12,
        ..scripted_limits()
    };
    let new_engine = || {
        let mut backend = ScriptedBackend::new(limits, Vec::new());
        backend.kv_model = true;
        Engine::new(
            scripted_model(),
            Box::new(backend),
            EngineOptions::default(),
        )
    };
    let (a, b) = (key(1, 1), key(2, 1));
    let req = |k, base: u32, len: u32, max| {
        let mut r = request(k, Prompt::Tokens((0..len).map(|t| base + t).collect()), max);
        r.stop.ignore_eos = true;
        r
    };
    let mut alone = new_engine();
    let mut want = Recorder::default();
    alone.submit(req(a, 60, 40, 4)).unwrap();
    run(&mut alone, &mut want);

    let mut e = new_engine();
    let mut rec = Recorder::default();
    e.submit(req(a, 60, 40, 4)).unwrap();
    e.step(&mut rec);
    assert_eq!(
        limits.num_pages - e.free_pages(),
        4,
        "one 16-token chunk in"
    );
    e.set_paused(a.client, true);
    // b's 36-token prompt needs 9 pages and a decode page; 8 are free.
    e.submit(req(b, 150, 36, 6)).unwrap();
    let mut guard = 0;
    while rec.done(b, 0).is_empty() {
        e.step(&mut rec);
        guard += 1;
        assert!(guard < 500, "b never ran while a was paused");
    }
    assert!(rec.tokens(a, 0).is_empty());
    assert!(e.preemptions() > 0);
    e.set_paused(a.client, false);
    run(&mut e, &mut rec);
    assert_eq!(rec.tokens(a, 0), want.tokens(a, 0));
    assert_eq!(e.free_pages(), limits.num_pages);
}

/// A paused client's half-prefilled prompt does not stop other clients' steps from being
/// launched ahead (it waits for its client, not for the device).
#[test]
fn a_paused_prefill_does_not_stop_launch_ahead_for_others() {
    let (mut e, _, ahead) = scripted_engine(vec![u32::from(b'z'); 40], true, 0);
    let mut rec = Recorder::default();
    let (a, b) = (key(1, 1), key(2, 1));
    e.submit(request(b, Prompt::Tokens(vec![3, 4]), 30))
        .unwrap();
    // 60 tokens: four steps of prefill at a 16-token budget; one is in after the first step.
    e.submit(request(a, Prompt::Tokens(vec![5; 60]), 4))
        .unwrap();
    e.step(&mut rec);
    e.set_paused(a.client, true);
    // Let the step in flight (which may carry a's chunk) retire, then count.
    e.step(&mut rec);
    e.step(&mut rec);
    let before = ahead.load(std::sync::atomic::Ordering::Relaxed);
    while rec.tokens(b, 0).len() < 20 {
        e.step(&mut rec);
    }
    let launched = ahead.load(std::sync::atomic::Ordering::Relaxed) - before;
    assert!(launched >= 10, "only {launched} steps launched ahead");
    assert!(rec.tokens(a, 0).is_empty());
    e.set_paused(a.client, false);
    run(&mut e, &mut rec);
    assert_eq!(rec.tokens(a, 0).len(), 4);
    assert_eq!(rec.tokens(b, 0).len(), 30);
}

/// Under overload (every slot busy, requests queued behind them) steps are still launched
/// ahead: the queue waits for a slot, not for the host; outputs stay those of the step-by-step
/// engine.
#[test]
fn a_full_batch_with_a_queue_behind_it_keeps_launching_ahead() {
    let script: Vec<u32> = (0..12).map(|i| u32::from(b'a') + i).collect();
    let run_with = |overlap: bool| {
        let (mut e, _, ahead) = scripted_engine(script.clone(), overlap, 0);
        let mut rec = Recorder::default();
        let keys: Vec<_> = (0..8).map(|i| key(i % 2, u64::from(i))).collect();
        for (i, &k) in keys.iter().enumerate() {
            e.submit(request(k, Prompt::Tokens(vec![i as u32 + 1; 3]), 12))
                .unwrap();
        }
        run(&mut e, &mut rec);
        let outs: Vec<_> = keys.iter().map(|&k| rec.tokens(k, 0)).collect();
        (outs, ahead.load(std::sync::atomic::Ordering::Relaxed))
    };
    let (want, _) = run_with(false);
    assert!(want.iter().all(|t| t == &script));
    let (got, ahead) = run_with(true);
    assert_eq!(got, want);
    // Two waves of 12 tokens: most of each wave's decode steps go ahead of their collect.
    println!("{ahead} steps launched ahead");
    assert!(ahead >= 16, "only {ahead} steps launched ahead");
}

//! Engine behaviour: state machine, stop conditions, detokenization, cancel/pause/drop,
//! fairness, KV admission, and (with the real CPU backend) forked samples and seeds.

mod engine_support;

use engine_support::*;
use nervad::engine::{
    AheadMiss, Engine, EngineOptions, FinishReason, InferenceEngine, Prompt, RequestError,
    SamplingParams,
};

fn scripted(script: &[u32]) -> Engine {
    let backend = ScriptedBackend::new(scripted_limits(), script.to_vec());
    Engine::new(
        scripted_model(),
        Box::new(backend),
        EngineOptions::default(),
    )
}

/// Step until done, sleeping through the engine's holds as the engine thread does.
fn run(engine: &mut Engine, rec: &mut Recorder) {
    let mut guard = 0;
    while engine.step(rec) {
        if let Some(until) = engine.hold_until() {
            std::thread::sleep(until.saturating_duration_since(std::time::Instant::now()));
        }
        guard += 1;
        assert!(guard < 1000, "engine did not finish");
    }
}

fn bytes(s: &str) -> Vec<u32> {
    s.bytes().map(u32::from).collect()
}

#[test]
fn generates_streams_text_and_stops_at_max_tokens() {
    let mut e = scripted(&[HELLO, u32::from(b' '), SNOWMAN, u32::from(b'!')]);
    let mut rec = Recorder::default();
    let k = key(1, 7);
    e.submit(request(k, Prompt::Text("hi there".into()), 3))
        .unwrap();
    assert_eq!(e.in_flight(), 1);
    run(&mut e, &mut rec);
    assert_eq!(rec.tokens(k, 0), vec![HELLO, u32::from(b' '), SNOWMAN]);
    assert_eq!(rec.text(k, 0), "hello ☃");
    assert_eq!(rec.done(k, 0), vec![FinishReason::Length]);
    assert_eq!(e.in_flight(), 0);
    assert_eq!(
        e.free_pages(),
        scripted_limits().num_pages,
        "pages returned"
    );
}

#[test]
fn eos_stops_unless_ignored_and_is_not_emitted() {
    let script = [u32::from(b'a'), EOS, u32::from(b'b')];
    let mut e = scripted(&script);
    let mut rec = Recorder::default();
    let k = key(1, 1);
    e.submit(request(k, Prompt::Tokens(vec![5, 6]), 10))
        .unwrap();
    run(&mut e, &mut rec);
    assert_eq!(rec.tokens(k, 0), vec![u32::from(b'a')]);
    assert_eq!(rec.done(k, 0), vec![FinishReason::Stop]);

    let mut e = scripted(&script);
    let mut rec = Recorder::default();
    let mut r = request(k, Prompt::Tokens(vec![5, 6]), 3);
    r.stop.ignore_eos = true;
    e.submit(r).unwrap();
    run(&mut e, &mut rec);
    assert_eq!(rec.tokens(k, 0), script.to_vec());
    assert_eq!(rec.text(k, 0), "ab", "special tokens carry no text");
    assert_eq!(rec.done(k, 0), vec![FinishReason::Length]);

    let mut e = scripted(&script);
    let mut rec = Recorder::default();
    let mut r = request(k, Prompt::Tokens(vec![5, 6]), 10);
    r.stop.stop_token_ids = vec![u32::from(b'a')];
    e.submit(r).unwrap();
    run(&mut e, &mut rec);
    assert!(rec.tokens(k, 0).is_empty());
    assert_eq!(rec.done(k, 0), vec![FinishReason::Stop]);
}

#[test]
fn stop_string_across_token_boundaries() {
    let mut script = bytes("ab S");
    script.extend(bytes("TOP tail"));
    let mut e = scripted(&script);
    let mut rec = Recorder::default();
    let k = key(2, 1);
    let mut r = request(k, Prompt::Text("x".into()), 50);
    r.stop.stop_strings = vec!["STOP".into(), "never".into()];
    e.submit(r).unwrap();
    run(&mut e, &mut rec);
    assert_eq!(rec.text(k, 0), "ab ");
    assert_eq!(rec.done(k, 0), vec![FinishReason::Stop]);
}

#[test]
fn utf8_is_never_split_across_text_events() {
    // "é☃" as single bytes, one token each.
    let script: Vec<u32> = "é☃x".bytes().map(u32::from).collect();
    let mut e = scripted(&script);
    let mut rec = Recorder::default();
    let k = key(3, 1);
    e.submit(request(k, Prompt::Text("q".into()), script.len() as u32))
        .unwrap();
    run(&mut e, &mut rec);
    let pieces: Vec<String> = rec
        .events
        .iter()
        .filter_map(|ev| match ev {
            Ev::Text(_, _, t) => Some(t.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(pieces, vec!["é", "☃", "x"]);
}

#[test]
fn context_length_ends_generation() {
    let backend = ScriptedBackend::new(
        nervad::backend::BackendLimits {
            max_context: 10,
            ..scripted_limits()
        },
        vec![u32::from(b'z'); 20],
    );
    let mut e = Engine::new(
        scripted_model(),
        Box::new(backend),
        EngineOptions::default(),
    );
    let mut rec = Recorder::default();
    let k = key(1, 1);
    e.submit(request(k, Prompt::Tokens(vec![1; 6]), 100))
        .unwrap();
    run(&mut e, &mut rec);
    assert_eq!(rec.tokens(k, 0).len(), 4);
    assert_eq!(rec.done(k, 0), vec![FinishReason::ContextLength]);
    assert!(matches!(
        e.submit(request(key(1, 2), Prompt::Tokens(vec![1; 10]), 1)),
        Err(RequestError::TooLong { .. })
    ));
}

#[test]
fn bad_requests_are_refused_cleanly() {
    let mut e = scripted(&[]);
    let k = key(1, 1);
    assert!(matches!(
        e.submit(request(k, Prompt::Tokens(vec![]), 5)),
        Err(RequestError::InvalidPrompt(_))
    ));
    assert_eq!(
        e.submit(request(k, Prompt::Tokens(vec![VOCAB as u32]), 5)),
        Err(RequestError::BadToken(VOCAB as u32))
    );
    assert!(matches!(
        e.submit(request(k, Prompt::Tokens(vec![1]), 0)),
        Err(RequestError::InvalidParameter(_))
    ));
    let mut r = request(k, Prompt::Tokens(vec![1]), 5);
    r.n_samples = 0;
    assert!(e.submit(r).is_err());
    let mut r = request(k, Prompt::Tokens(vec![1]), 5);
    r.sampling.top_p = 2.0;
    assert!(e.submit(r).is_err());
    let r = request(k, Prompt::Chat("not json".into()), 5);
    assert!(matches!(e.submit(r), Err(RequestError::InvalidPrompt(_))));
    e.submit(request(k, Prompt::Tokens(vec![1]), 5)).unwrap();
    assert_eq!(
        e.submit(request(k, Prompt::Tokens(vec![1]), 5)),
        Err(RequestError::DuplicateTag)
    );
    assert_eq!(e.in_flight(), 1);
}

#[test]
fn chat_prompt_goes_through_the_template() {
    let mut e = scripted(&[u32::from(b'k')]);
    let mut rec = Recorder::default();
    let k = key(1, 1);
    e.submit(request(
        k,
        Prompt::Chat(r#"[{"role":"user","content":"hey"}]"#.into()),
        1,
    ))
    .unwrap();
    run(&mut e, &mut rec);
    assert_eq!(rec.text(k, 0), "k");
}

#[test]
fn cancel_pause_drop_and_finish_all() {
    let mut e = scripted(&[u32::from(b'a'); 40]);
    let mut rec = Recorder::default();
    let (a, b, c) = (key(1, 1), key(2, 1), key(3, 1));
    for k in [a, b, c] {
        e.submit(request(k, Prompt::Tokens(vec![1, 2, 3]), 30))
            .unwrap();
    }
    e.step(&mut rec);
    e.step(&mut rec);
    e.cancel(a);
    e.set_paused(b.client, true);
    e.drop_client(c.client);
    let before_b = rec.tokens(b, 0).len();
    for _ in 0..5 {
        e.step(&mut rec);
    }
    assert_eq!(rec.done(a, 0), vec![FinishReason::Cancelled]);
    assert_eq!(
        rec.tokens(b, 0).len(),
        before_b,
        "paused client makes no progress"
    );
    assert!(rec.done(c, 0).is_empty(), "dropped client gets no events");
    assert_eq!(e.in_flight(), 1);
    e.set_paused(b.client, false);
    e.step(&mut rec);
    assert_eq!(rec.tokens(b, 0).len(), before_b + 1);
    e.finish_all(FinishReason::Shutdown, &mut rec);
    assert_eq!(rec.done(b, 0), vec![FinishReason::Shutdown]);
    assert_eq!(e.in_flight(), 0);
    assert_eq!(e.free_pages(), scripted_limits().num_pages);
}

#[test]
fn a_paused_client_parks_its_samples_so_others_run_and_resumes_losslessly() {
    let slots = scripted_limits().max_seqs;
    let mut e = scripted(&[u32::from(b'a'); 64]);
    let mut rec = Recorder::default();
    // Client 1 fills every slot with decoding samples, and queues as many again.
    let stalled: Vec<_> = (0..2 * slots as u64).map(|t| key(1, t + 1)).collect();
    for &k in &stalled {
        e.submit(request(k, Prompt::Tokens(vec![1, 2, 3]), 12))
            .unwrap();
    }
    for _ in 0..3 {
        e.step(&mut rec);
    }
    let before: Vec<usize> = stalled.iter().map(|&k| rec.tokens(k, 0).len()).collect();
    assert!(before[0] > 0, "client 1 is decoding");
    e.set_paused(stalled[0].client, true);
    // Another client's request runs to completion while client 1 stays paused.
    let other = key(2, 1);
    e.submit(request(other, Prompt::Tokens(vec![4, 5]), 6))
        .unwrap();
    for _ in 0..20 {
        e.step(&mut rec);
    }
    assert_eq!(rec.done(other, 0), vec![FinishReason::Length]);
    assert_eq!(rec.tokens(other, 0).len(), 6);
    let paused: Vec<usize> = stalled.iter().map(|&k| rec.tokens(k, 0).len()).collect();
    assert_eq!(paused, before, "a paused client makes no progress");
    // Drained: every sample resumes where it stopped and gets every token, exactly once.
    e.set_paused(stalled[0].client, false);
    run(&mut e, &mut rec);
    for &k in &stalled {
        assert_eq!(rec.tokens(k, 0).len(), 12, "{k:?}");
        assert_eq!(rec.done(k, 0), vec![FinishReason::Length], "{k:?}");
    }
    assert_eq!(e.in_flight(), 0);
    assert_eq!(e.free_pages(), scripted_limits().num_pages);

    // Cancel and shutdown reach parked samples too, and release their pages.
    let (x, y) = (key(3, 1), key(3, 2));
    for k in [x, y] {
        e.submit(request(k, Prompt::Tokens(vec![1, 2]), 30))
            .unwrap();
    }
    for _ in 0..3 {
        e.step(&mut rec);
    }
    e.set_paused(x.client, true);
    e.step(&mut rec);
    e.cancel(x);
    e.step(&mut rec);
    assert_eq!(rec.done(x, 0), vec![FinishReason::Cancelled]);
    e.finish_all(FinishReason::Shutdown, &mut rec);
    assert_eq!(rec.done(y, 0), vec![FinishReason::Shutdown]);
    assert_eq!(e.in_flight(), 0);
    assert_eq!(e.free_pages(), scripted_limits().num_pages);
}

/// Pages are taken as sequences grow: four requests that need 64 pages in all run at once on
/// 32, the pool runs dry, the youngest are preempted and recomputed, and every request still
/// gets exactly its scripted tokens (none lost, none repeated). Cancelling a queued request
/// frees nothing it never held; one larger than the whole pool is refused up front.
#[test]
fn pages_grow_and_preemption_loses_no_token() {
    let script: Vec<u32> = (0..60).map(|i| u32::from(b'a') + i % 26).collect();
    let mut e = scripted(&script);
    let mut rec = Recorder::default();
    let ks: Vec<_> = (0..5).map(|i| key(i, 1)).collect();
    for &k in &ks {
        e.submit(request(k, Prompt::Tokens(vec![1; 4]), 60))
            .unwrap();
    }
    e.step(&mut rec);
    // Four slots: four admitted with a page each (prompt) + their first decode page soon.
    assert!(e.free_pages() >= 32 - 8, "nothing reserved past the prompt");
    e.cancel(ks[4]);
    e.step(&mut rec);
    assert_eq!(rec.done(ks[4], 0), vec![FinishReason::Cancelled]);
    run(&mut e, &mut rec);
    assert!(e.preemptions() > 0, "the pool ran dry");
    for &k in &ks[..4] {
        assert_eq!(rec.done(k, 0), vec![FinishReason::Length]);
        assert_eq!(rec.tokens(k, 0), script, "{k:?}");
    }
    assert_eq!(e.free_pages(), scripted_limits().num_pages);
    // A request larger than the whole pool is refused up front.
    let mut big = request(key(9, 1), Prompt::Tokens(vec![1; 4]), 60);
    big.n_samples = 3;
    assert!(matches!(e.submit(big), Err(RequestError::TooLong { .. })));
}

#[test]
fn prefill_is_chunked_and_shared_round_robin() {
    let backend = ScriptedBackend::new(scripted_limits(), vec![u32::from(b'a'); 4]);
    let log = backend.log.clone();
    let mut e = Engine::new(
        scripted_model(),
        Box::new(backend),
        EngineOptions::default(),
    );
    let mut rec = Recorder::default();
    // Budget 16 tokens per step; two clients with 30-token prompts.
    let (a, b) = (key(1, 1), key(2, 1));
    e.submit(request(a, Prompt::Tokens(vec![1; 30]), 2))
        .unwrap();
    e.submit(request(b, Prompt::Tokens(vec![1; 30]), 2))
        .unwrap();
    run(&mut e, &mut rec);
    assert_eq!(rec.tokens(a, 0).len(), 2);
    assert_eq!(rec.tokens(b, 0).len(), 2);
    let log = log.lock().unwrap();
    // Step 1: a's first chunk fills the budget; step 2: b goes first.
    assert_eq!(log[0], vec![(log[0][0].0, 16, 0)]);
    assert_ne!(log[1][0].0, log[0][0].0, "round robin between clients");
    assert!(
        log.iter()
            .all(|s| s.iter().map(|e| e.1).sum::<usize>() <= 16)
    );
}

#[test]
fn higher_priority_is_admitted_first_and_queue_is_bounded() {
    let backend = ScriptedBackend::new(
        nervad::backend::BackendLimits {
            max_seqs: 1,
            ..scripted_limits()
        },
        vec![u32::from(b'a'); 4],
    );
    let options = EngineOptions {
        max_queued: 2,
        ..EngineOptions::default()
    };
    let mut e = Engine::new(scripted_model(), Box::new(backend), options);
    let mut rec = Recorder::default();
    let (low, high) = (key(1, 1), key(2, 1));
    e.submit(request(low, Prompt::Tokens(vec![1, 2]), 2))
        .unwrap();
    let mut r = request(high, Prompt::Tokens(vec![1, 2]), 2);
    r.priority = 9;
    e.submit(r).unwrap();
    assert_eq!(
        e.submit(request(key(3, 1), Prompt::Tokens(vec![1]), 1)),
        Err(RequestError::Busy)
    );
    run(&mut e, &mut rec);
    let first_done = rec
        .events
        .iter()
        .find_map(|ev| match ev {
            Ev::Done(k, ..) => Some(*k),
            _ => None,
        })
        .unwrap();
    assert_eq!(first_done, high);
    assert_eq!(rec.done(low, 0), vec![FinishReason::Length]);
}

/// With the real CPU backend: n samples forked from one prompt give exactly what separate
/// single-sample requests with seeds `seed + i` give, whatever else runs in the batch.
#[test]
fn forked_samples_match_single_requests_and_seeds_are_batch_independent() {
    let options = EngineOptions {
        max_batch: 6,
        kv_budget_bytes: 2 * 2 * 16 * 4 * 64 * 8,
        threads: 2,
        max_step_tokens: 16,
        page_tokens: 4,
        ..EngineOptions::default()
    };
    let sampling = SamplingParams {
        temperature: 0.9,
        top_p: 0.95,
        top_k: 50,
        repetition_penalty: 1.1,
        seed: 1234,
        ..SamplingParams::default()
    };
    let prompt: Vec<u32> = (10..23).collect();
    let mut forked = Engine::with_cpu_backend(model(5), options).unwrap();
    let mut rec = Recorder::default();
    let k = key(1, 1);
    let mut r = request(k, Prompt::Tokens(prompt.clone()), 12);
    r.sampling = sampling;
    r.n_samples = 3;
    r.stop.ignore_eos = true;
    forked.submit(r).unwrap();
    // Noise in the same batches: another client with a different prompt.
    let noise = key(2, 1);
    let mut r = request(noise, Prompt::Tokens(vec![3, 1, 4, 1, 5]), 20);
    r.sampling = SamplingParams {
        temperature: 1.0,
        seed: 9,
        ..SamplingParams::default()
    };
    forked.submit(r).unwrap();
    run(&mut forked, &mut rec);

    for i in 0..3u16 {
        let mut single = Engine::with_cpu_backend(model(5), options).unwrap();
        let mut rec1 = Recorder::default();
        let mut r = request(k, Prompt::Tokens(prompt.clone()), 12);
        r.sampling = SamplingParams {
            seed: sampling.seed + u64::from(i),
            ..sampling
        };
        r.stop.ignore_eos = true;
        single.submit(r).unwrap();
        run(&mut single, &mut rec1);
        let got = rec.tokens(k, i);
        assert_eq!(got.len(), 12);
        assert_eq!(got, rec1.tokens(k, 0), "sample {i}");
    }
    assert_ne!(rec.tokens(k, 0), rec.tokens(k, 1), "different seeds differ");
}

/// Greedy through the engine equals greedy through the backend directly.
#[test]
fn greedy_engine_matches_teacher_forced_argmax() {
    let options = EngineOptions {
        max_batch: 2,
        kv_budget_bytes: 1 << 20,
        threads: 2,
        max_step_tokens: 8,
        page_tokens: 4,
        ..EngineOptions::default()
    };
    let mut e = Engine::with_cpu_backend(model(6), options).unwrap();
    let mut rec = Recorder::default();
    let k = key(1, 1);
    let prompt: Vec<u32> = vec![7, 8, 9, 10, 11];
    let mut r = request(k, Prompt::Tokens(prompt.clone()), 6);
    r.stop.ignore_eos = true;
    r.sampling.top_logprobs = 2;
    e.submit(r).unwrap();
    run(&mut e, &mut rec);
    let generated = rec.tokens(k, 0);
    let mut all = prompt.clone();
    all.extend(&generated);
    let logits = e.prompt_logits(&all).unwrap();
    for (i, &tok) in generated.iter().enumerate() {
        let row = &logits[(prompt.len() - 1 + i) * VOCAB..(prompt.len() + i) * VOCAB];
        let arg = row
            .iter()
            .enumerate()
            .fold(
                (0, f32::NEG_INFINITY),
                |a, (j, &v)| if v > a.1 { (j, v) } else { a },
            )
            .0;
        assert_eq!(tok as usize, arg, "step {i}");
    }
    let tops = rec
        .events
        .iter()
        .filter(|e| matches!(e, Ev::Top(..)))
        .count();
    assert_eq!(tops, generated.len());
}

/// Deficit round robin by tokens served: a client that floods the queue with 20 requests
/// before another client sends 2 does not make that client wait behind its flood; the
/// latecomer's requests start as soon as slots free up, ahead of the flood's backlog.
#[test]
fn a_flooding_client_cannot_starve_another() {
    let mut e = scripted(&[u32::from(b'a'); 8]);
    let mut rec = Recorder::default();
    let flood: Vec<_> = (0..20).map(|t| key(1, t)).collect();
    for &k in &flood {
        e.submit(request(k, Prompt::Tokens(vec![1, 2, 3]), 8))
            .unwrap();
    }
    for _ in 0..3 {
        e.step(&mut rec);
    }
    let late: Vec<_> = (0..2).map(|t| key(2, t)).collect();
    for &k in &late {
        e.submit(request(k, Prompt::Tokens(vec![4, 5]), 8)).unwrap();
    }
    run(&mut e, &mut rec);
    let first_token = |k| {
        rec.events
            .iter()
            .position(|ev| matches!(ev, Ev::Tokens(kk, ..) if *kk == k))
            .unwrap()
    };
    for &k in &late {
        assert_eq!(rec.tokens(k, 0).len(), 8);
        // Four slots: the flood's first four run when the latecomer arrives; its requests
        // must start before the flood's seventh.
        assert!(
            first_token(k) < first_token(flood[6]),
            "{k:?} waited behind the flood"
        );
    }
    for &k in &flood {
        assert_eq!(rec.done(k, 0), vec![FinishReason::Length]);
    }
}

/// A cancelled request's pages are free after the next step, a dead client's at once, on a
/// backend that keeps a step in flight too (the freed pages are then reused only after it).
#[test]
fn cancellation_and_client_death_free_pages_at_the_next_step() {
    for overlap in [false, true] {
        let mut backend = ScriptedBackend::new(scripted_limits(), vec![u32::from(b'a'); 40]);
        backend.overlap = overlap;
        let mut e = Engine::new(
            scripted_model(),
            Box::new(backend),
            EngineOptions::default(),
        );
        let mut rec = Recorder::default();
        let (a, b, c) = (key(1, 1), key(2, 1), key(3, 1));
        // 9 prompt tokens: three pages each, a fourth once decoding passes position 12;
        // different prompts, so no page is shared through the prefix cache.
        for k in [a, b, c] {
            e.submit(request(k, Prompt::Tokens(vec![k.client.slot; 9]), 30))
                .unwrap();
        }
        for _ in 0..8 {
            e.step(&mut rec);
        }
        let total = scripted_limits().num_pages;
        let held = total - e.free_pages();
        assert!(
            held >= 9,
            "overlap {overlap}: three sequences hold {held} pages"
        );
        e.drop_client(c.client);
        let after_drop = total - e.free_pages();
        assert!(
            after_drop <= held - 3,
            "overlap {overlap}: death freed pages at once"
        );
        e.cancel(a);
        // On a backend that keeps a step in flight, one call collects it and the next plans
        // (the cancel is taken there).
        e.step(&mut rec);
        if overlap {
            e.step(&mut rec);
        }
        assert_eq!(rec.done(a, 0), vec![FinishReason::Cancelled]);
        // Only b holds pages now (at most 5: 9 + 8 positions plus one launched ahead).
        assert!(
            total - e.free_pages() <= 5,
            "overlap {overlap}: {} pages held after the cancel",
            total - e.free_pages()
        );
        run(&mut e, &mut rec);
        assert_eq!(rec.done(b, 0), vec![FinishReason::Length]);
        assert!(rec.done(c, 0).is_empty());
        assert_eq!(e.free_pages(), total);
    }
}

/// After a step in which a request finished, with another step in flight, the engine holds
/// its next launch ahead (up to 2 ms, at most half a step's device time) for the client's next
/// request: submitted then, it joins the step right after the one in flight, where a launch
/// ahead would have made it wait a step more; with nothing submitted, the launch ahead goes
/// out once the hold ends. A call that collects a step plans nothing: what the caller passes
/// in after it (here c) is in the next step.
#[test]
fn a_follow_up_request_joins_the_next_step() {
    for submit in [true, false] {
        let (mut e, log, ahead) = scripted_engine(vec![u32::from(b'a'); 40], true, 20_000_000);
        let mut rec = Recorder::default();
        let (a, b, c) = (key(1, 1), key(2, 1), key(1, 2));
        e.submit(request(a, Prompt::Tokens(vec![1; 5]), 3)).unwrap();
        e.submit(request(b, Prompt::Tokens(vec![2; 5]), 30))
            .unwrap();
        let mut guard = 0;
        while rec.done(a, 0).is_empty() {
            assert!(e.step(&mut rec));
            guard += 1;
            assert!(guard < 100, "a did not finish");
        }
        let until = e
            .hold_until()
            .expect("a finished with a step in flight: a hold");
        let launched = log.lock().unwrap().len();
        let ahead_before = ahead.load(std::sync::atomic::Ordering::Relaxed);
        assert!(e.step(&mut rec));
        assert_eq!(
            log.lock().unwrap().len(),
            launched,
            "held: nothing launched"
        );
        if submit {
            e.submit(request(c, Prompt::Tokens(vec![3; 5]), 2)).unwrap();
            assert_eq!(e.follow_ups(), (1, 0));
            // The submission ends the hold: one call collects the step in flight and launches
            // nothing, the next plans a step with c's prompt in it.
            e.step(&mut rec);
            assert_eq!(
                log.lock().unwrap().len(),
                launched,
                "nothing launched past c"
            );
            assert_eq!(e.follow_ups(), (1, 1));
            e.step(&mut rec);
            let log = log.lock().unwrap();
            assert_eq!(log.len(), launched + 1);
            assert!(
                log[launched].iter().any(|&(_, n, _)| n == 5),
                "c's prompt in the next step: {:?}",
                log[launched]
            );
        } else {
            std::thread::sleep(until.saturating_duration_since(std::time::Instant::now()));
            e.step(&mut rec);
            assert_eq!(log.lock().unwrap().len(), launched + 1, "launched ahead");
            assert_eq!(e.follow_ups(), (1, 0));
            assert_eq!(
                ahead.load(std::sync::atomic::Ordering::Relaxed),
                ahead_before + 1
            );
        }
        run(&mut e, &mut rec);
        assert_eq!(rec.done(b, 0), vec![FinishReason::Length]);
        if submit {
            assert_eq!(rec.done(c, 0), vec![FinishReason::Length]);
        }
    }
}

/// Overload: more requests than slots and pages queue up to `max_queued` (then `Busy`, and
/// nothing accepted is lost), the pool runs dry and preempts, and the published gauges say so:
/// queue depth, running and preempted sequences, pages used/free/shared/cached, each client's
/// share of the tokens served.
#[test]
fn overload_queues_boundedly_and_the_gauges_show_it() {
    let limits = nervad::backend::BackendLimits {
        num_pages: 16,
        ..scripted_limits()
    };
    let script: Vec<u32> = (0..24).map(|i| u32::from(b'a') + i % 26).collect();
    let backend = ScriptedBackend::new(limits, script.clone());
    let options = EngineOptions {
        max_queued: 6,
        ..EngineOptions::default()
    };
    let mut e = Engine::new(scripted_model(), Box::new(backend), options);
    let mut rec = Recorder::default();
    let mut accepted = Vec::new();
    let mut busy = 0;
    for t in 0..8u64 {
        let k = key(1 + (t % 2) as u32, t);
        match e.submit(request(k, Prompt::Tokens(vec![t as u32 + 1; 6]), 24)) {
            Ok(()) => accepted.push(k),
            Err(RequestError::Busy) => busy += 1,
            Err(other) => panic!("{other:?}"),
        }
    }
    assert_eq!((accepted.len(), busy), (6, 2));
    let g = nervad::engine::api::EngineGauges::default();
    e.publish(&g);
    let j = g.to_json();
    assert_eq!(j["queued"], 6);
    let mut most_preempted = 0;
    let mut saw_shares = false;
    let mut guard = 0;
    while e.step(&mut rec) {
        guard += 1;
        assert!(guard < 2000);
        e.publish(&g);
        let j = g.to_json();
        let n = |f: &str| j[f].as_u64().unwrap();
        assert_eq!(n("kv_pages_used") + n("kv_pages_free"), 16);
        assert!(n("kv_pages_cached") <= n("kv_pages_free"));
        assert!(n("running") <= 4 && n("queued") <= 6);
        most_preempted = most_preempted.max(n("preempted"));
        let rows = j["client_tokens"].as_array().unwrap();
        if rows.len() == 2 {
            let share: f64 = rows.iter().map(|r| r["share"].as_f64().unwrap()).sum();
            assert!((share - 1.0).abs() < 1e-9);
            saw_shares = true;
        }
    }
    assert!(most_preempted > 0, "the pool ran dry");
    assert!(saw_shares);
    e.publish(&g);
    assert!(g.to_json()["preemptions"].as_u64().unwrap() > 0);
    for &k in &accepted {
        assert_eq!(rec.tokens(k, 0), script, "{k:?}");
    }
}

/// The engine counts the decode steps it launches ahead of the step in flight and the chances
/// it passes up, by reason: two requests decoding alone go out ahead every step; a request
/// submitted while a step is in flight, with a slot free for it, makes the next step wait for
/// planning (admission); at the end, with every sequence able to finish in the step in
/// flight, there is nothing to launch ahead (finishing).
#[test]
fn launches_ahead_and_their_misses_are_counted() {
    let (mut e, _, ahead) = scripted_engine(vec![u32::from(b'a'); 40], true, 0);
    let mut rec = Recorder::default();
    let (a, b, c) = (key(1, 1), key(2, 1), key(1, 2));
    e.submit(request(a, Prompt::Tokens(vec![1; 5]), 12))
        .unwrap();
    e.submit(request(b, Prompt::Tokens(vec![2; 5]), 12))
        .unwrap();
    while rec.tokens(a, 0).len() < 4 {
        assert!(e.step(&mut rec));
    }
    let counted = e.launch_ahead();
    assert_eq!(
        counted.launched,
        ahead.load(std::sync::atomic::Ordering::Relaxed) as u64,
        "every launch ahead the backend saw is counted"
    );
    assert!(counted.launched >= 2);
    assert_eq!(counted.missed, [0; 6], "nothing kept a decode step back");
    // c arrives with a slot free: the next chance is passed up for its admission, and then
    // for its prompt, which is not in the step in flight.
    e.submit(request(c, Prompt::Tokens(vec![3; 5]), 4)).unwrap();
    while rec.done(c, 0).is_empty() {
        assert!(e.step(&mut rec));
    }
    let after = e.launch_ahead();
    assert_eq!(after.missed(AheadMiss::Admission), 1);
    assert!(after.launched > counted.launched);
    while e.step(&mut rec) {}
    let end = e.launch_ahead();
    assert_eq!(
        end.launched,
        ahead.load(std::sync::atomic::Ordering::Relaxed) as u64
    );
    assert_eq!(end.missed, [1, 0, 0, 0, 0, 1]);
}

/// The roofline's weight bytes: a tied embedding is the LM head, which every step reads whole;
/// an untied input table is read only at its tokens' rows, so the step leaves it out.
#[test]
fn a_step_reads_every_weight_but_an_untied_input_table() {
    use nervad::engine::InferenceEngine as _;
    let tied = scripted(&[]).info();
    assert!(tied.weight_bytes > 0);
    assert_eq!(tied.step_weight_bytes, tied.weight_bytes);

    let mut model = scripted_model();
    let table = model.weights.embed_tokens.bytes().len() as u64;
    // An LM head of its own: a copy of the table's values in separate memory.
    let head = engine_support::weights(&model.config, 2).embed_tokens;
    assert!(!std::ptr::eq(
        head.bytes().as_ptr(),
        model.weights.embed_tokens.bytes().as_ptr()
    ));
    model.weights.lm_head = head;
    let backend = ScriptedBackend::new(scripted_limits(), vec![]);
    let untied = Engine::new(model, Box::new(backend), EngineOptions::default()).info();
    assert_eq!(untied.weight_bytes, tied.weight_bytes + table);
    assert_eq!(untied.step_weight_bytes, untied.weight_bytes - table);
}

//! The token ledger on the CPU backend: one record per token with monotone timings, sums that
//! equal the records and the completion's timing fields, and step shares that add up to the
//! backend's own step count.

mod engine_support;

use engine_support::{key, model, request};
use nervad::backend::{
    BackendChoice, SamplingParams, SeqStep, StepOutput, StepReport,
    cuda::{CudaOptions, GpuMemory},
};
use nervad::engine::ledger::{LedgerSums, StepShare, TokenRecord};
use nervad::engine::{
    Engine, EngineEvent, EngineOptions, EventSink, InferenceEngine, Prompt, RequestKey,
    RequestTimings, StopConditions,
};

/// What one finished sample reported.
#[derive(Debug, Clone)]
struct Finished {
    key: RequestKey,
    timings: RequestTimings,
    sums: LedgerSums,
    records: Vec<TokenRecord>,
    tokens_seen: usize,
}

#[derive(Default)]
struct Sink {
    tokens: Vec<(RequestKey, u16, usize)>,
    finished: Vec<Finished>,
}

impl EventSink for Sink {
    fn emit(&mut self, event: EngineEvent<'_>) {
        match event {
            EngineEvent::Tokens {
                key, sample, ids, ..
            } => self.tokens.push((key, sample, ids.len())),
            EngineEvent::Done {
                key,
                sample,
                timings,
                ledger,
                ..
            } => {
                let tokens_seen = self
                    .tokens
                    .iter()
                    .filter(|(k, s, _)| *k == key && *s == sample)
                    .map(|(_, _, n)| n)
                    .sum();
                self.finished.push(Finished {
                    key,
                    timings,
                    sums: ledger.sums(),
                    records: ledger.records().copied().collect(),
                    tokens_seen,
                });
            }
            _ => {}
        }
    }
}

fn engine(max_batch: usize) -> Engine {
    let options = EngineOptions {
        max_batch,
        kv_budget_bytes: 8 << 20,
        threads: 1,
        ..EngineOptions::default()
    };
    Engine::with_cpu_backend(model(7), options).expect("engine")
}

fn no_eos() -> StopConditions {
    StopConditions {
        ignore_eos: true,
        ..StopConditions::default()
    }
}

/// Every check a finished sample's ledger must pass.
fn check_sample(f: &Finished) {
    let n = f.records.len();
    assert_eq!(n as u32, f.sums.tokens, "{:?}: one record per token", f.key);
    assert_eq!(n, f.tokens_seen, "tokens emitted (no stop token here)");
    assert_eq!(n as u32, f.timings.generated_tokens);
    let mut sum = StepShare::default();
    let (mut wall, mut lag) = (0u64, 0u64);
    let mut previous_at = 0u64;
    for (i, r) in f.records.iter().enumerate() {
        assert_eq!(r.index as usize, i, "records in token order");
        assert!(r.at_ns > previous_at, "token times strictly increase");
        assert_eq!(
            r.wall_ns,
            r.at_ns - previous_at,
            "wall latency = gap to the last token"
        );
        assert!(
            r.lag_ns <= r.wall_ns,
            "the step finished after the previous token"
        );
        assert!(r.cost.steps >= 1, "every token comes from a step");
        assert!(r.cost.host_ns > 0, "the CPU backend measures its steps");
        assert_eq!(r.cost.gpu_ns, 0, "no device");
        assert_eq!(r.cost.launches + r.cost.graph_replays, 0, "no device");
        assert!(r.batch >= 1);
        previous_at = r.at_ns;
        sum.add(&r.cost);
        wall += r.wall_ns;
        lag += r.lag_ns;
    }
    assert_eq!(sum, f.sums.cost, "sums are the records' sums");
    assert_eq!((wall, lag), (f.sums.wall_ns, f.sums.lag_ns));
    // The completion's own timing fields tell the same story (µs truncation: ±2 µs).
    let completion_us = f.timings.first_token_us + f.timings.decode_us;
    let ledger_us = f.sums.wall_ns / 1000;
    assert!(
        completion_us.abs_diff(ledger_us) <= 2,
        "completion {completion_us} µs vs ledger {ledger_us} µs"
    );
    assert!(
        f.records[0].at_ns / 1000 >= f.timings.first_token_us.saturating_sub(1)
            && f.records[0].at_ns / 1000 <= f.timings.first_token_us + 1,
        "first record at the completion's time to first token"
    );
}

#[test]
fn one_record_per_token_and_sums_that_match() {
    let mut e = engine(4);
    let mut sink = Sink::default();
    let mut r = request(key(1, 1), Prompt::Text("hello ledger".into()), 12);
    r.stop = no_eos();
    e.submit(r).expect("submit");
    while e.step(&mut sink) {}
    assert_eq!(sink.finished.len(), 1);
    let f = &sink.finished[0];
    check_sample(f);
    assert_eq!(f.records.len(), 12);
    // One request alone: every step the backend ran is attributed to it, and a prompt that
    // fits one step makes the first token's record a single step.
    let backend = e.backend_stats();
    assert_eq!(f.sums.cost.steps, backend.steps);
    assert_eq!(f.sums.cost.host_ns, backend.host_ns);
    assert_eq!(f.records[0].cost.steps, 1);
    assert!(f.records.iter().all(|r| r.batch == 1));
}

#[test]
fn a_batch_splits_each_step_and_loses_none() {
    let mut e = engine(4);
    let mut sink = Sink::default();
    for tag in 1..=3u64 {
        let mut r = request(
            key(tag as u32, tag),
            Prompt::Text("abc".repeat(tag as usize)),
            9,
        );
        r.stop = no_eos();
        r.sampling = SamplingParams {
            temperature: 0.8,
            seed: tag,
            ..SamplingParams::default()
        };
        e.submit(r).expect("submit");
    }
    // Forked samples share a prefill; each still gets one record per token.
    let mut forked = request(key(9, 9), Prompt::Text("fork".into()), 7);
    forked.stop = no_eos();
    forked.n_samples = 2;
    forked.sampling.temperature = 0.7;
    e.submit(forked).expect("submit");
    while e.step(&mut sink) {}
    assert_eq!(sink.finished.len(), 5);
    let mut host_ns = 0;
    for f in &sink.finished {
        check_sample(f);
        host_ns += f.sums.cost.host_ns;
    }
    assert!(
        sink.finished
            .iter()
            .any(|f| f.records.iter().any(|r| r.batch > 1)),
        "some steps served several sequences"
    );
    // Shares of a step add up to the step: the samples' host time is the backend's.
    assert_eq!(host_ns, e.backend_stats().host_ns);
}

#[test]
fn a_stop_token_has_its_record() {
    let mut e = engine(2);
    let mut sink = Sink::default();
    // Greedy: find the first token this prompt produces, then make it a stop token.
    let mut probe = request(key(1, 1), Prompt::Text("stop here".into()), 3);
    probe.stop = no_eos();
    e.submit(probe).expect("submit");
    let mut ids = Sink::default();
    while e.step(&mut ids) {}
    let first = ids.finished[0].records[0].token;
    let mut r = request(key(1, 2), Prompt::Text("stop here".into()), 8);
    r.stop = StopConditions {
        ignore_eos: true,
        stop_token_ids: vec![first],
        ..StopConditions::default()
    };
    e.submit(r).expect("submit");
    while e.step(&mut sink) {}
    let f = &sink.finished[0];
    assert_eq!(
        f.timings.generated_tokens, 0,
        "the stop token is not output"
    );
    assert_eq!(f.records.len(), 1, "but it cost a step and has its record");
    assert_eq!(f.records[0].token, first);
    assert_eq!(f.sums.tokens, 1);
}

#[test]
fn cpu_step_reports_add_up_to_the_backend_totals() {
    let m = model(3);
    let options = EngineOptions {
        max_batch: 2,
        kv_budget_bytes: 4 << 20,
        threads: 1,
        ..EngineOptions::default()
    };
    let cuda = CudaOptions {
        device: 0,
        memory: GpuMemory::Fraction(0.5),
        ..CudaOptions::default()
    };
    let mut b = nervad::backend::build(
        BackendChoice::Cpu,
        &m.config,
        &m.weights,
        options.backend_options(&m.config),
        cuda,
    )
    .expect("cpu backend");
    let before = b.stats();
    b.start_sequence(0, &SamplingParams::default(), 0, &[1, 2, 3])
        .expect("start");
    let table = [0u32, 1, 2, 3];
    let mut out = StepOutput::with_capacity(2);
    let mut reports: Vec<StepReport> = Vec::new();
    let prompt = [1u32, 2, 3];
    let mut token = [0u32];
    for pos in 0..6u32 {
        let step = if pos == 0 {
            SeqStep {
                slot: 0,
                tokens: &prompt,
                start_pos: 0,
                block_table: &table,
                sample: true,
                want_logits: false,
                from_last_sample: false,
            }
        } else {
            SeqStep {
                slot: 0,
                tokens: &token,
                start_pos: 2 + pos,
                block_table: &table,
                sample: true,
                want_logits: false,
                from_last_sample: true,
            }
        };
        let launched = std::time::Instant::now();
        b.launch(&[step], &mut out).expect("launch");
        b.collect(&mut out).expect("collect");
        let seen = std::time::Instant::now();
        let r = out.report;
        let finished = r.finished_at.expect("the CPU knows when its step ended");
        assert!(launched <= finished && finished <= seen);
        assert!(r.host_ns > 0);
        token = [out.samples[0].expect("sampled").token];
        reports.push(r);
    }
    let after = b.stats();
    assert_eq!(after.steps - before.steps, reports.len() as u64);
    let host: u64 = reports.iter().map(|r| r.host_ns).sum();
    assert_eq!(after.host_ns - before.host_ns, host);
    let syncs: u64 = reports
        .iter()
        .map(|r| r.hard_syncs + r.policy_syncs + r.debug_syncs)
        .sum();
    assert_eq!(syncs, 0, "the CPU backend never waits on a device");
}

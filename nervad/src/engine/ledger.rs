//! The token ledger: what each generated token cost, summed per sample.
//!
//! The backend reports each step's own figures when the step is collected
//! ([`crate::backend::StepReport`]). A step serves several sequences, so the engine splits it
//! evenly over the step's batch entries ([`StepShare::split`]): every cost (launches, graph
//! nodes, syncs, bytes, allocations, GPU and host nanoseconds) is divided by the number of
//! entries and the remainder goes one unit each to the first entries in batch order. `steps`
//! is not a cost but a count of the steps a sequence took part in, so it is never split. An even
//! split rather than one weighted by tokens, because a decode step's cost is dominated by
//! reading the weights once for the whole batch; and integer shares with remainders, so the
//! shares of a step add up to the step exactly and the ledger sums to the backend's totals.
//!
//! A sequence accumulates the shares of every step it took part in; the next token it produces
//! takes what accumulated since its previous token (so a first token carries its prefill
//! chunks). Shares of results nobody takes (a speculative step of a sequence that finished
//! meanwhile) are not attributed to any request.
//!
//! Latency and lag are per token, not shares: `wall_ns` is the host time from the previous
//! token of the sample (from the request's arrival for the first) to this one, so a sample's
//! `wall_ns` add up to the completion's `first_token_us + decode_us`; `lag_ns` is the time
//! between the step's results being complete (on the device) and the engine seeing them.
//!
//! Memory is bounded: a sample keeps its last [`RECORDS_PER_SAMPLE`] token records (its sums
//! cover every token), preallocated when the sequence record is made, so recording never
//! allocates.

use std::collections::VecDeque;
use std::time::Instant;

use serde_json::Value;

use crate::backend::StepReport;

/// Token records one sample keeps (the most recent ones).
pub const RECORDS_PER_SAMPLE: usize = 512;

/// Figures of one or more steps attributed to one sequence.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct StepShare {
    /// Steps the sequence took part in (not split: each counts 1).
    pub steps: u64,
    /// Device time, ns.
    pub gpu_ns: u64,
    /// Host time inside the backend's launch and collect, ns.
    pub host_ns: u64,
    /// Graph replays.
    pub graph_replays: u64,
    /// Plain kernel launches.
    pub launches: u64,
    /// Kernel nodes replayed through graphs.
    pub graph_nodes: u64,
    /// Hard syncs (waits the results required).
    pub syncs_hard: u64,
    /// Policy syncs.
    pub syncs_policy: u64,
    /// Debug syncs.
    pub syncs_debug: u64,
    /// Bytes host → device.
    pub h2d_bytes: u64,
    /// Bytes device → host.
    pub d2h_bytes: u64,
    /// Device allocations.
    pub device_allocs: u64,
    /// Pinned host allocations.
    pub pinned_allocs: u64,
}

impl StepShare {
    /// Nothing.
    pub const ZERO: StepShare = StepShare {
        steps: 0,
        gpu_ns: 0,
        host_ns: 0,
        graph_replays: 0,
        launches: 0,
        graph_nodes: 0,
        syncs_hard: 0,
        syncs_policy: 0,
        syncs_debug: 0,
        h2d_bytes: 0,
        d2h_bytes: 0,
        device_allocs: 0,
        pinned_allocs: 0,
    };

    /// Entry `i`'s share of a step with `n` entries (module docs: even split, remainders to
    /// the first entries).
    pub fn split(report: &StepReport, i: usize, n: usize) -> StepShare {
        let n = n.max(1) as u64;
        let i = i as u64;
        let part = |v: u64| v / n + u64::from(i < v % n);
        StepShare {
            steps: 1,
            gpu_ns: part(report.gpu_ns),
            host_ns: part(report.host_ns),
            graph_replays: part(report.graph_replays),
            launches: part(report.launches),
            graph_nodes: part(report.graph_nodes),
            syncs_hard: part(report.hard_syncs),
            syncs_policy: part(report.policy_syncs),
            syncs_debug: part(report.debug_syncs),
            h2d_bytes: part(report.h2d_bytes),
            d2h_bytes: part(report.d2h_bytes),
            device_allocs: part(report.device_allocs),
            pinned_allocs: part(report.pinned_allocs),
        }
    }

    /// Add `other` in.
    pub fn add(&mut self, other: &StepShare) {
        self.steps += other.steps;
        self.gpu_ns += other.gpu_ns;
        self.host_ns += other.host_ns;
        self.graph_replays += other.graph_replays;
        self.launches += other.launches;
        self.graph_nodes += other.graph_nodes;
        self.syncs_hard += other.syncs_hard;
        self.syncs_policy += other.syncs_policy;
        self.syncs_debug += other.syncs_debug;
        self.h2d_bytes += other.h2d_bytes;
        self.d2h_bytes += other.d2h_bytes;
        self.device_allocs += other.device_allocs;
        self.pinned_allocs += other.pinned_allocs;
    }

    /// The figures as `(json name, value)` pairs, in display order.
    pub fn fields(&self) -> [(&'static str, u64); 13] {
        [
            ("steps", self.steps),
            ("gpu_ns", self.gpu_ns),
            ("host_ns", self.host_ns),
            ("graph_replays", self.graph_replays),
            ("launches", self.launches),
            ("graph_nodes", self.graph_nodes),
            ("syncs_hard", self.syncs_hard),
            ("syncs_policy", self.syncs_policy),
            ("syncs_debug", self.syncs_debug),
            ("h2d_bytes", self.h2d_bytes),
            ("d2h_bytes", self.d2h_bytes),
            ("device_allocs", self.device_allocs),
            ("pinned_allocs", self.pinned_allocs),
        ]
    }

    fn write_json(&self, into: &mut serde_json::Map<String, Value>) {
        for (name, v) in self.fields() {
            into.insert(name.into(), v.into());
        }
    }
}

/// What one token cost.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct TokenRecord {
    /// Index of the token in its sample, from 0 (a stop token included).
    pub index: u32,
    /// Token id.
    pub token: u32,
    /// Request arrival → the engine saw this token, ns.
    pub at_ns: u64,
    /// The sample's previous token (or the request's arrival) → this token, ns.
    pub wall_ns: u64,
    /// The step's results complete → the engine saw them, ns (module docs).
    pub lag_ns: u64,
    /// Sequences in the step that produced the token.
    pub batch: u32,
    /// Shares of every step of the sample since its previous token.
    pub cost: StepShare,
}

impl TokenRecord {
    /// As a JSON object (`nervactl ledger`; the names are the table's).
    pub fn to_json(&self) -> Value {
        let mut m = serde_json::Map::new();
        m.insert("index".into(), self.index.into());
        m.insert("token".into(), self.token.into());
        m.insert("at_ns".into(), self.at_ns.into());
        m.insert("wall_ns".into(), self.wall_ns.into());
        m.insert("lag_ns".into(), self.lag_ns.into());
        m.insert("batch".into(), self.batch.into());
        self.cost.write_json(&mut m);
        Value::Object(m)
    }
}

/// A sample's totals.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct LedgerSums {
    /// Tokens the engine saw for the sample (a stop token included).
    pub tokens: u32,
    /// Sum of the tokens' `wall_ns` (request arrival → last token).
    pub wall_ns: u64,
    /// Sum of the tokens' `lag_ns`.
    pub lag_ns: u64,
    /// Every step share attributed to the sample (steps after its last token included).
    pub cost: StepShare,
}

impl LedgerSums {
    /// As a JSON object.
    pub fn to_json(&self) -> Value {
        let mut m = serde_json::Map::new();
        m.insert("tokens".into(), self.tokens.into());
        m.insert("wall_ns".into(), self.wall_ns.into());
        m.insert("lag_ns".into(), self.lag_ns.into());
        self.cost.write_json(&mut m);
        Value::Object(m)
    }
}

/// One sample's ledger: its sums and its most recent token records.
#[derive(Debug, Clone, PartialEq)]
pub struct SampleLedger {
    sums: LedgerSums,
    /// Shares since the previous token.
    pending: StepShare,
    /// Invariant: `records.len() <= RECORDS_PER_SAMPLE`, capacity reserved at construction.
    records: VecDeque<TokenRecord>,
}

/// The ledger of a sample that never ran (cancelled or shut down while queued).
pub static EMPTY_LEDGER: SampleLedger = SampleLedger {
    sums: LedgerSums {
        tokens: 0,
        wall_ns: 0,
        lag_ns: 0,
        cost: StepShare::ZERO,
    },
    pending: StepShare::ZERO,
    records: VecDeque::new(),
};

/// When and how a token was seen.
#[derive(Debug, Clone, Copy)]
pub struct TokenSeen {
    /// Token id.
    pub token: u32,
    /// The request's arrival.
    pub received: Instant,
    /// The sample's previous token, if any.
    pub previous: Option<Instant>,
    /// When the engine saw it.
    pub now: Instant,
    /// When the step's results were complete, if the backend knows.
    pub finished_at: Option<Instant>,
    /// Sequences in the step.
    pub batch: usize,
}

impl Default for SampleLedger {
    fn default() -> Self {
        Self::new()
    }
}

impl SampleLedger {
    /// An empty ledger with room for [`RECORDS_PER_SAMPLE`] records.
    pub fn new() -> Self {
        SampleLedger {
            sums: LedgerSums::default(),
            pending: StepShare::default(),
            records: VecDeque::with_capacity(RECORDS_PER_SAMPLE),
        }
    }

    /// Forget everything (a new sample takes the sequence record); keeps the allocation.
    pub fn reset(&mut self) {
        self.sums = LedgerSums::default();
        self.pending = StepShare::default();
        self.records.clear();
    }

    /// Attribute a step share to the sample.
    pub fn charge(&mut self, share: &StepShare) {
        self.sums.cost.add(share);
        self.pending.add(share);
    }

    /// Record a token; it takes the shares charged since the previous one.
    pub fn token(&mut self, seen: &TokenSeen) {
        let ns = |a: Instant, b: Instant| b.saturating_duration_since(a).as_nanos() as u64;
        let record = TokenRecord {
            index: self.sums.tokens,
            token: seen.token,
            at_ns: ns(seen.received, seen.now),
            wall_ns: ns(seen.previous.unwrap_or(seen.received), seen.now),
            lag_ns: seen.finished_at.map_or(0, |f| ns(f, seen.now)),
            batch: seen.batch as u32,
            cost: std::mem::take(&mut self.pending),
        };
        self.sums.tokens += 1;
        self.sums.wall_ns += record.wall_ns;
        self.sums.lag_ns += record.lag_ns;
        if self.records.len() == RECORDS_PER_SAMPLE {
            self.records.pop_front();
        }
        debug_assert!(self.records.len() < RECORDS_PER_SAMPLE);
        self.records.push_back(record);
    }

    /// The sample's totals.
    pub fn sums(&self) -> LedgerSums {
        self.sums
    }

    /// The kept records, oldest first.
    pub fn records(&self) -> impl ExactSizeIterator<Item = &TokenRecord> {
        self.records.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn shares_of_a_step_add_up_to_the_step() {
        let report = StepReport {
            launches: 7,
            graph_nodes: 100,
            gpu_ns: 1_000_003,
            h2d_bytes: 5,
            hard_syncs: 1,
            ..StepReport::default()
        };
        for n in 1..=9 {
            let mut total = StepShare::default();
            for i in 0..n {
                total.add(&StepShare::split(&report, i, n));
            }
            assert_eq!(total.launches, 7);
            assert_eq!(total.graph_nodes, 100);
            assert_eq!(total.gpu_ns, 1_000_003);
            assert_eq!(total.h2d_bytes, 5);
            assert_eq!(total.syncs_hard, 1);
            assert_eq!(total.steps, n as u64, "each entry took part in the step");
        }
        let third = StepShare::split(&report, 2, 3);
        assert_eq!((third.launches, third.graph_nodes), (2, 33));
    }

    #[test]
    fn tokens_take_what_accumulated_and_records_stay_bounded() {
        let mut l = SampleLedger::new();
        let t0 = Instant::now();
        let share = StepShare {
            steps: 1,
            launches: 3,
            ..StepShare::default()
        };
        l.charge(&share);
        l.charge(&share);
        let seen = |k: u64, prev: Option<Instant>| TokenSeen {
            token: k as u32,
            received: t0,
            previous: prev,
            now: t0 + Duration::from_micros(10 * (k + 1)),
            finished_at: Some(t0 + Duration::from_micros(10 * (k + 1) - 2)),
            batch: 1,
        };
        l.token(&seen(0, None));
        let first = *l.records().next().expect("one record");
        assert_eq!(first.cost.launches, 6, "prefill and first step");
        assert_eq!(first.wall_ns, 10_000);
        assert_eq!(first.lag_ns, 2_000);
        let mut prev = t0 + Duration::from_micros(10);
        for k in 1..(RECORDS_PER_SAMPLE as u64 + 10) {
            l.charge(&share);
            l.token(&seen(k, Some(prev)));
            prev = t0 + Duration::from_micros(10 * (k + 1));
        }
        assert_eq!(l.records().len(), RECORDS_PER_SAMPLE);
        let sums = l.sums();
        assert_eq!(sums.tokens as usize, RECORDS_PER_SAMPLE + 10);
        assert_eq!(sums.cost.launches, 3 * (RECORDS_PER_SAMPLE as u64 + 11));
        assert_eq!(
            sums.wall_ns,
            10_000 * (RECORDS_PER_SAMPLE as u64 + 10),
            "wall times add up to arrival → last token"
        );
        assert_eq!(
            l.records().next().map(|r| r.index),
            Some(10),
            "oldest dropped"
        );
        l.reset();
        assert_eq!(l.sums(), LedgerSums::default());
        assert_eq!(l.records().len(), 0);
    }
}

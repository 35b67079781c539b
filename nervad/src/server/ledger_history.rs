//! The daemon's memory of the token ledger: the sums of recent samples, the token records of
//! recent samples for `nervactl ledger`, and a daemon-wide per-token summary for
//! `nervactl stats`.
//!
//! Written by the engine thread once per finished sample (under the statistics lock it already
//! takes there), read by admin replies. Every buffer is sized at construction: recording never
//! allocates, and a daemon that runs for months holds the same few hundred kilobytes.

use std::collections::VecDeque;

use hdrhistogram::Histogram;
use serde_json::{Value, json};

use crate::engine::api::{FinishReason, RequestKey, RequestTimings};
use crate::engine::ledger::{LedgerSums, SampleLedger, TokenRecord};

/// Finished samples whose sums `stats` lists.
pub const RECENT_SAMPLES: usize = 32;
/// Token records kept over all recent samples (the `ledger` dump).
pub const RECENT_TOKENS: usize = 4096;

/// One finished sample.
#[derive(Debug, Clone, Copy)]
struct SampleEntry {
    /// Order of finishing, from 0: ties records to their sample.
    serial: u64,
    key: RequestKey,
    sample: u16,
    reason: FinishReason,
    timings: RequestTimings,
    sums: LedgerSums,
    /// Daemon uptime when it finished, s.
    finished_s: f64,
}

/// Recent samples and tokens, and the per-token summary since start.
pub struct LedgerHistory {
    next_serial: u64,
    /// Invariant: at most `RECENT_SAMPLES` entries, oldest first.
    samples: VecDeque<SampleEntry>,
    /// Invariant: at most `RECENT_TOKENS` entries, oldest first, serials non-decreasing.
    tokens: VecDeque<(u64, TokenRecord)>,
    /// Per-token wall latency and observation lag, ns, over the records samples kept.
    wall_ns: Histogram<u64>,
    lag_ns: Histogram<u64>,
    /// Sums over every finished sample since start.
    total: LedgerSums,
}

fn histogram() -> Histogram<u64> {
    // 1 ns .. 1 hour at 3 significant digits; fixed size, recording never allocates.
    Histogram::new_with_bounds(1, 3_600_000_000_000, 3).unwrap_or_else(|_| {
        Histogram::new(3).unwrap_or_else(|_| unreachable!("3 sig figs is valid"))
    })
}

fn finish_name(reason: FinishReason) -> &'static str {
    match reason {
        FinishReason::Stop => "stop",
        FinishReason::Length => "length",
        FinishReason::ContextLength => "context_length",
        FinishReason::Cancelled => "cancelled",
        FinishReason::Error => "error",
        FinishReason::Shutdown => "shutdown",
    }
}

impl Default for LedgerHistory {
    fn default() -> Self {
        Self::new()
    }
}

impl LedgerHistory {
    /// Empty, with every buffer allocated.
    pub fn new() -> Self {
        LedgerHistory {
            next_serial: 0,
            samples: VecDeque::with_capacity(RECENT_SAMPLES),
            tokens: VecDeque::with_capacity(RECENT_TOKENS),
            wall_ns: histogram(),
            lag_ns: histogram(),
            total: LedgerSums::default(),
        }
    }

    /// Remember a finished sample and its kept token records.
    pub fn record(
        &mut self,
        key: RequestKey,
        sample: u16,
        reason: FinishReason,
        timings: &RequestTimings,
        ledger: &SampleLedger,
        uptime_s: f64,
    ) {
        let serial = self.next_serial;
        self.next_serial += 1;
        let sums = ledger.sums();
        if self.samples.len() == RECENT_SAMPLES {
            self.samples.pop_front();
        }
        self.samples.push_back(SampleEntry {
            serial,
            key,
            sample,
            reason,
            timings: *timings,
            sums,
            finished_s: uptime_s,
        });
        for record in ledger.records() {
            if self.tokens.len() == RECENT_TOKENS {
                self.tokens.pop_front();
            }
            self.tokens.push_back((serial, *record));
            let _ = self.wall_ns.record(record.wall_ns);
            let _ = self.lag_ns.record(record.lag_ns);
        }
        self.total.tokens += sums.tokens;
        self.total.wall_ns += sums.wall_ns;
        self.total.lag_ns += sums.lag_ns;
        self.total.cost.add(&sums.cost);
    }

    /// The daemon-wide per-token summary (`stats` → `engine.token_ledger`).
    pub fn summary_json(&self) -> Value {
        let tokens = u64::from(self.total.tokens);
        let quantiles = |h: &Histogram<u64>| {
            json!({
                "count": h.len(),
                "p50_ns": h.value_at_quantile(0.5),
                "p99_ns": h.value_at_quantile(0.99),
                "max_ns": h.max(),
            })
        };
        let mut per_token = serde_json::Map::new();
        for (name, v) in self.total.cost.fields() {
            let mean = if tokens > 0 {
                v as f64 / tokens as f64
            } else {
                0.0
            };
            per_token.insert(name.into(), mean.into());
        }
        json!({
            "tokens": tokens,
            "wall": quantiles(&self.wall_ns),
            "lag": quantiles(&self.lag_ns),
            "per_token_mean": per_token,
        })
    }

    /// The recent samples' sums, oldest first (`stats` → `engine.recent_samples`).
    pub fn recent_json(&self) -> Value {
        Value::Array(self.samples.iter().map(sample_json).collect())
    }

    /// The recent samples with their kept token records, newest samples kept when the whole
    /// would exceed `max_bytes` (`ledger` → the reply must fit the client's output region).
    pub fn dump_json(&self, max_bytes: usize) -> Vec<u8> {
        let mut parts: Vec<String> = Vec::with_capacity(self.samples.len());
        for entry in &self.samples {
            let mut v = sample_json(entry);
            let records: Vec<Value> = self
                .tokens
                .iter()
                .filter(|(serial, _)| *serial == entry.serial)
                .map(|(_, r)| r.to_json())
                .collect();
            v["records"] = Value::Array(records);
            parts.push(v.to_string());
        }
        // Drop the oldest samples until the document fits; say how many were left out.
        let frame = |kept: &[String], omitted: usize| {
            format!(
                "{{\"records_per_sample\":{},\"omitted_samples\":{omitted},\"samples\":[{}]}}",
                crate::engine::ledger::RECORDS_PER_SAMPLE,
                kept.join(",")
            )
        };
        let mut first = 0;
        loop {
            let doc = frame(&parts[first..], first);
            if doc.len() <= max_bytes || first == parts.len() {
                return doc.into_bytes();
            }
            first += 1;
        }
    }
}

/// One sample's identity (the client's slot and its generation, as `nervactl clients` shows
/// them, the request's tag and the sample index), outcome, completion timings and ledger sums
/// as a flat object.
fn sample_json(e: &SampleEntry) -> Value {
    let mut m = serde_json::Map::new();
    m.insert("client_slot".into(), e.key.client.slot.into());
    m.insert("client_generation".into(), e.key.client.generation.into());
    m.insert("tag".into(), e.key.tag.into());
    m.insert("sample".into(), e.sample.into());
    m.insert("finish".into(), finish_name(e.reason).into());
    m.insert("finished_s".into(), e.finished_s.into());
    m.insert("prompt_tokens".into(), e.timings.prompt_tokens.into());
    m.insert("generated_tokens".into(), e.timings.generated_tokens.into());
    m.insert("queue_us".into(), e.timings.queue_us.into());
    m.insert("first_token_us".into(), e.timings.first_token_us.into());
    m.insert("decode_us".into(), e.timings.decode_us.into());
    if let Value::Object(sums) = e.sums.to_json() {
        m.extend(sums);
    }
    Value::Object(m)
}

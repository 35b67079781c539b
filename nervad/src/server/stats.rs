//! Counters and latency histograms for `nervactl stats`.
//!
//! Two owners, no sharing on the hot path: the poll thread owns the [`TokenLedger`] (plain
//! integers, it is the only writer and the only reader, since admin replies are built on that
//! thread), and the engine thread records per-request latencies and the sample's token ledger
//! ([`super::ledger_history`]) into [`LatencyStats`] once per finished sample (one uncontended
//! mutex acquisition per finished sample; none per token or per descriptor).

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use hdrhistogram::Histogram;
use serde_json::{Value, json};

use super::ledger_history::LedgerHistory;
use crate::engine::api::{FinishReason, RequestKey, RequestTimings};
use crate::engine::ledger::SampleLedger;

/// Hot-path accounting of the poll thread. Every syscall and allocation the loop makes is
/// counted here, so tests can assert the per-descriptor cost is zero.
#[derive(Debug, Default, Clone, Copy)]
pub struct TokenLedger {
    /// Descriptors consumed from all submission rings.
    pub descriptors: u64,
    /// Of which NOPs.
    pub nops: u64,
    /// Of which GENERATEs accepted into the engine queue.
    pub generates: u64,
    /// Of which CANCELs.
    pub cancels: u64,
    /// Of which ADMIN queries.
    pub admin: u64,
    /// Descriptors refused with an error completion.
    pub rejected: u64,
    /// Completions written into completion rings.
    pub completions: u64,
    /// Completions that waited in a backlog because the client's ring was full.
    pub backlogged: u64,
    /// Times a client's streams were paused for a full completion ring.
    pub pauses: u64,
    /// Completion doorbells rung (eventfd writes to clients blocked in `wait`).
    pub cq_doorbells: u64,
    /// Times the poll thread went to sleep in epoll.
    pub sleeps: u64,
    /// Zero-timeout epoll checks while busy (hang-ups, signals, new clients).
    pub busy_checks: u64,
    /// Syscalls made by the poll loop (sleeps, busy checks, doorbells, eventfd drains).
    pub syscalls: u64,
    /// Allocations by the poll thread outside admin replies and generate intake.
    pub hot_allocations: u64,
    /// Clients disconnected for corrupt ring indices.
    pub corrupt_disconnects: u64,
    /// Clients accepted / gone.
    pub clients_connected: u64,
    /// Clients that went away.
    pub clients_disconnected: u64,
}

impl TokenLedger {
    /// As JSON for the stats reply.
    pub fn to_json(&self) -> Value {
        json!({
            "descriptors": self.descriptors,
            "nops": self.nops,
            "generates": self.generates,
            "cancels": self.cancels,
            "admin": self.admin,
            "rejected": self.rejected,
            "completions": self.completions,
            "backlogged": self.backlogged,
            "pauses": self.pauses,
            "cq_doorbells": self.cq_doorbells,
            "sleeps": self.sleeps,
            "busy_checks": self.busy_checks,
            "syscalls": self.syscalls,
            "hot_allocations": self.hot_allocations,
            "corrupt_disconnects": self.corrupt_disconnects,
            "clients_connected": self.clients_connected,
            "clients_disconnected": self.clients_disconnected,
        })
    }
}

const WINDOW_SECONDS: usize = 16;

/// Latencies (microseconds) and throughput of finished requests, written by the engine thread.
pub struct LatencyStats {
    started: Instant,
    inner: Mutex<Histograms>,
    tokens_total: AtomicU64,
    /// Tokens per wall-clock second, indexed by second % WINDOW; each slot stamped with its
    /// second so stale slots are ignored.
    window_tokens: [AtomicU64; WINDOW_SECONDS],
    window_stamp: [AtomicU64; WINDOW_SECONDS],
    /// The engine's live figures (KV pages, scheduler, device ledger), published by the engine
    /// thread after each step.
    pub engine: crate::engine::api::EngineGauges,
}

struct Histograms {
    queue: Histogram<u64>,
    first_token: Histogram<u64>,
    inter_token: Histogram<u64>,
    end_to_end: Histogram<u64>,
    finished: [u64; 6],
    ledger: LedgerHistory,
}

fn histogram() -> Histogram<u64> {
    // 1 µs .. 1 hour at 3 significant digits; fixed size, recording never allocates.
    Histogram::new_with_bounds(1, 3_600_000_000, 3).unwrap_or_else(|_| {
        Histogram::new(3).unwrap_or_else(|_| unreachable!("3 sig figs is valid"))
    })
}

fn reason_index(reason: FinishReason) -> usize {
    match reason {
        FinishReason::Stop => 0,
        FinishReason::Length => 1,
        FinishReason::ContextLength => 2,
        FinishReason::Cancelled => 3,
        FinishReason::Error => 4,
        FinishReason::Shutdown => 5,
    }
}

impl Default for LatencyStats {
    fn default() -> Self {
        Self::new()
    }
}

impl LatencyStats {
    /// Empty statistics starting now.
    pub fn new() -> Self {
        LatencyStats {
            started: Instant::now(),
            inner: Mutex::new(Histograms {
                queue: histogram(),
                first_token: histogram(),
                inter_token: histogram(),
                end_to_end: histogram(),
                finished: [0; 6],
                ledger: LedgerHistory::new(),
            }),
            tokens_total: AtomicU64::new(0),
            window_tokens: std::array::from_fn(|_| AtomicU64::new(0)),
            window_stamp: std::array::from_fn(|_| AtomicU64::new(u64::MAX)),
            engine: Default::default(),
        }
    }

    /// Count `n` generated tokens (engine thread; relaxed atomics, no lock).
    pub fn record_tokens(&self, n: u64) {
        self.tokens_total.fetch_add(n, Ordering::Relaxed);
        let second = self.started.elapsed().as_secs();
        let slot = (second as usize) % WINDOW_SECONDS;
        if self.window_stamp[slot].load(Ordering::Relaxed) != second {
            // Only the engine thread writes; readers tolerate a torn (stamp, count) pair
            // because the figure is a rate estimate, not an invariant.
            self.window_stamp[slot].store(second, Ordering::Relaxed);
            self.window_tokens[slot].store(0, Ordering::Relaxed);
        }
        self.window_tokens[slot].fetch_add(n, Ordering::Relaxed);
    }

    /// Record `samples` samples that ended without a `Done` (their client hung up mid-stream:
    /// the engine drops them silently), as cancelled.
    pub fn record_abandoned(&self, samples: u64) {
        if let Ok(mut h) = self.inner.lock() {
            h.finished[reason_index(FinishReason::Cancelled)] += samples;
        }
    }

    /// Record a finished sample: its completion timings and its token ledger.
    pub fn record_done(
        &self,
        key: RequestKey,
        sample: u16,
        reason: FinishReason,
        t: &RequestTimings,
        ledger: &SampleLedger,
    ) {
        let uptime = self.uptime_secs();
        let Ok(mut h) = self.inner.lock() else {
            return;
        };
        h.ledger.record(key, sample, reason, t, ledger, uptime);
        h.finished[reason_index(reason)] += 1;
        if t.generated_tokens == 0 {
            return;
        }
        let _ = h.queue.record(t.queue_us.max(1));
        let _ = h.first_token.record(t.first_token_us.max(1));
        if t.generated_tokens > 1 {
            let per_token = t.decode_us / u64::from(t.generated_tokens - 1);
            let _ = h.inter_token.record(per_token.max(1));
        }
        let _ = h.end_to_end.record((t.first_token_us + t.decode_us).max(1));
    }

    /// The recent samples with their token records as a JSON document of at most `max_bytes`
    /// (`nervactl ledger`).
    pub fn ledger_dump(&self, max_bytes: usize) -> Vec<u8> {
        match self.inner.lock() {
            Ok(h) => h.ledger.dump_json(max_bytes),
            Err(_) => b"{\"error\":\"statistics unavailable\"}".to_vec(),
        }
    }

    /// Seconds since start.
    pub fn uptime_secs(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    /// As JSON for the stats reply.
    pub fn to_json(&self) -> Value {
        let uptime = self.uptime_secs();
        let tokens = self.tokens_total.load(Ordering::Relaxed);
        let now = self.started.elapsed().as_secs();
        // The last 10 complete seconds.
        let recent: u64 = (1..=10u64)
            .filter_map(|back| now.checked_sub(back))
            .map(|s| {
                let slot = (s as usize) % WINDOW_SECONDS;
                if self.window_stamp[slot].load(Ordering::Relaxed) == s {
                    self.window_tokens[slot].load(Ordering::Relaxed)
                } else {
                    0
                }
            })
            .sum();
        let window = now.clamp(1, 10) as f64;
        let stage = |h: &Histogram<u64>| {
            json!({
                "count": h.len(),
                "p50_us": h.value_at_quantile(0.5),
                "p90_us": h.value_at_quantile(0.9),
                "p99_us": h.value_at_quantile(0.99),
                "max_us": h.max(),
            })
        };
        let Ok(h) = self.inner.lock() else {
            return json!({"error": "statistics unavailable"});
        };
        json!({
            "uptime_s": uptime,
            "tokens_generated": tokens,
            "tokens_per_s_overall": if uptime > 0.0 { tokens as f64 / uptime } else { 0.0 },
            "tokens_per_s_last_10s": recent as f64 / window,
            "samples_finished": {
                "stop": h.finished[0], "length": h.finished[1], "context_length": h.finished[2],
                "cancelled": h.finished[3], "error": h.finished[4], "shutdown": h.finished[5],
            },
            "live": self.engine.to_json(),
            "token_ledger": h.ledger.summary_json(),
            "recent_samples": h.ledger.recent_json(),
            "latency": {
                "queue": stage(&h.queue),
                "time_to_first_token": stage(&h.first_token),
                "inter_token": stage(&h.inter_token),
                "end_to_end": stage(&h.end_to_end),
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_quantiles_and_reasons() {
        let s = LatencyStats::new();
        for i in 1..=100u64 {
            s.record_done(
                RequestKey {
                    client: crate::engine::api::ClientId {
                        slot: 0,
                        generation: 0,
                    },
                    tag: i,
                },
                0,
                FinishReason::Length,
                &RequestTimings {
                    queue_us: i,
                    first_token_us: 10 * i,
                    decode_us: 100 * i,
                    prompt_tokens: 3,
                    generated_tokens: 11,
                },
                &crate::engine::ledger::EMPTY_LEDGER,
            );
        }
        s.record_tokens(1100);
        let j = s.to_json();
        assert_eq!(j["samples_finished"]["length"], 100);
        assert_eq!(j["tokens_generated"], 1100);
        let p50 = j["latency"]["queue"]["p50_us"].as_u64().expect("number");
        assert!((49..=51).contains(&p50), "{p50}");
        let itl = j["latency"]["inter_token"]["p99_us"]
            .as_u64()
            .expect("number");
        // decode 100·i µs over 10 gaps: 10·i µs per token, p99 = 990.
        assert!((980..=1000).contains(&itl), "{itl}");
    }
}

//! Prometheus text exposition: the gateway's own counters and histograms, plus the daemon's
//! figures read through its admin queries at scrape time.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde_json::Value;

/// Upper bounds in seconds (Prometheus `le`), from 100 µs to 60 s.
const BOUNDS: [f64; 16] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    10.0, 60.0,
];

/// A fixed-bucket histogram of durations; recording is lock-free.
pub struct Histogram {
    buckets: [AtomicU64; BOUNDS.len()],
    count: AtomicU64,
    sum_ns: AtomicU64,
}

impl Histogram {
    const fn new() -> Histogram {
        Histogram {
            buckets: [const { AtomicU64::new(0) }; BOUNDS.len()],
            count: AtomicU64::new(0),
            sum_ns: AtomicU64::new(0),
        }
    }

    /// Record `times` observations of `value` (a mean over a run of tokens counts once per
    /// token).
    pub fn observe_n(&self, value: Duration, times: u64) {
        if times == 0 {
            return;
        }
        let secs = value.as_secs_f64();
        if let Some(i) = BOUNDS.iter().position(|&b| secs <= b) {
            self.buckets[i].fetch_add(times, Ordering::Relaxed);
        }
        self.count.fetch_add(times, Ordering::Relaxed);
        self.sum_ns
            .fetch_add(value.as_nanos() as u64 * times, Ordering::Relaxed);
    }

    /// Record one observation.
    pub fn observe(&self, value: Duration) {
        self.observe_n(value, 1);
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut cumulative = 0;
        for (b, bound) in self.buckets.iter().zip(BOUNDS) {
            cumulative += b.load(Ordering::Relaxed);
            let _ = writeln!(out, "{name}_bucket{{le=\"{bound}\"}} {cumulative}");
        }
        let count = self.count.load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {count}");
        let sum = self.sum_ns.load(Ordering::Relaxed) as f64 / 1e9;
        let _ = writeln!(out, "{name}_sum {sum}\n{name}_count {count}");
    }
}

/// Endpoints counted separately.
pub const ENDPOINTS: [&str; 2] = ["chat_completions", "completions"];
/// HTTP status classes counted separately.
const STATUSES: [u16; 8] = [200, 400, 401, 404, 413, 429, 500, 503];

/// The gateway's own metrics.
pub struct Metrics {
    /// `[endpoint][status]`.
    requests: [[AtomicU64; STATUSES.len()]; ENDPOINTS.len()],
    prompt_tokens: AtomicU64,
    completion_tokens: AtomicU64,
    /// HTTP request received → first output piece.
    pub time_to_first_token: Histogram,
    /// Between consecutive tokens of a sample (the daemon's per-sample mean, once per token).
    pub inter_token: Histogram,
    /// HTTP request received → response finished.
    pub request_duration: Histogram,
    cancelled: AtomicU64,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Zeroed.
    pub const fn new() -> Metrics {
        Metrics {
            requests: [const { [const { AtomicU64::new(0) }; STATUSES.len()] }; ENDPOINTS.len()],
            prompt_tokens: AtomicU64::new(0),
            completion_tokens: AtomicU64::new(0),
            time_to_first_token: Histogram::new(),
            inter_token: Histogram::new(),
            request_duration: Histogram::new(),
            cancelled: AtomicU64::new(0),
        }
    }

    /// Count one finished HTTP request (`endpoint` indexes [`ENDPOINTS`]); statuses outside
    /// the tracked set count as 500.
    pub fn request(&self, endpoint: usize, status: u16) {
        let s = STATUSES.iter().position(|&x| x == status).unwrap_or(6);
        self.requests[endpoint][s].fetch_add(1, Ordering::Relaxed);
    }

    /// Count tokens of a finished request.
    pub fn tokens(&self, prompt: u64, completion: u64) {
        self.prompt_tokens.fetch_add(prompt, Ordering::Relaxed);
        self.completion_tokens
            .fetch_add(completion, Ordering::Relaxed);
    }

    /// A streamed request whose HTTP client went away before the end.
    pub fn cancelled(&self) {
        self.cancelled.fetch_add(1, Ordering::Relaxed);
    }

    /// The exposition: ours, then the daemon's (`None` fields: that query failed).
    pub fn render(
        &self,
        in_flight: usize,
        connected: bool,
        status: Option<&Value>,
        stats: Option<&Value>,
        clients: Option<&Value>,
    ) -> String {
        let mut out = String::with_capacity(8 << 10);
        out.push_str(
            "# HELP nerva_gateway_requests_total HTTP generation requests by endpoint and status.\n\
             # TYPE nerva_gateway_requests_total counter\n",
        );
        for (e, name) in ENDPOINTS.iter().enumerate() {
            for (s, code) in STATUSES.iter().enumerate() {
                let n = self.requests[e][s].load(Ordering::Relaxed);
                let _ = writeln!(
                    out,
                    "nerva_gateway_requests_total{{endpoint=\"{name}\",status=\"{code}\"}} {n}"
                );
            }
        }
        let counter = |out: &mut String, name: &str, help: &str, v: u64| {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}"
            );
        };
        let gauge = |out: &mut String, name: &str, help: &str, v: f64| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
        };
        counter(
            &mut out,
            "nerva_gateway_prompt_tokens_total",
            "Prompt tokens of finished requests.",
            self.prompt_tokens.load(Ordering::Relaxed),
        );
        counter(
            &mut out,
            "nerva_gateway_completion_tokens_total",
            "Generated tokens of finished requests.",
            self.completion_tokens.load(Ordering::Relaxed),
        );
        counter(
            &mut out,
            "nerva_gateway_client_disconnects_total",
            "Streams whose HTTP client went away mid-stream (cancelled in the daemon).",
            self.cancelled.load(Ordering::Relaxed),
        );
        gauge(
            &mut out,
            "nerva_gateway_requests_in_flight",
            "Daemon requests submitted by the gateway and not finished (its queue depth).",
            in_flight as f64,
        );
        gauge(
            &mut out,
            "nerva_gateway_daemon_connected",
            "1 when at least one daemon connection is up.",
            if connected { 1.0 } else { 0.0 },
        );
        self.time_to_first_token.render(
            &mut out,
            "nerva_gateway_time_to_first_token_seconds",
            "HTTP request received to first generated text.",
        );
        self.inter_token.render(
            &mut out,
            "nerva_gateway_inter_token_seconds",
            "Time between consecutive tokens (daemon-measured per sample).",
        );
        self.request_duration.render(
            &mut out,
            "nerva_gateway_request_duration_seconds",
            "HTTP request received to response complete.",
        );
        render_daemon(&mut out, status, stats, clients);
        out
    }
}

fn render_daemon(
    out: &mut String,
    status: Option<&Value>,
    stats: Option<&Value>,
    clients: Option<&Value>,
) {
    let up = status.is_some();
    let _ = writeln!(
        out,
        "# HELP nerva_daemon_up 1 when the daemon answered the status query.\n\
         # TYPE nerva_daemon_up gauge\nnerva_daemon_up {}",
        u8::from(up)
    );
    let num = |v: Option<&Value>| v.and_then(Value::as_f64);
    let gauge = |out: &mut String, name: &str, help: &str, v: Option<f64>| {
        if let Some(v) = v {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
        }
    };
    if let Some(s) = status {
        gauge(
            out,
            "nerva_daemon_clients",
            "Clients connected to the daemon.",
            num(s.pointer("/daemon/clients")),
        );
        gauge(
            out,
            "nerva_daemon_uptime_seconds",
            "Daemon uptime.",
            num(s.pointer("/daemon/uptime_s")),
        );
        gauge(
            out,
            "nerva_daemon_kv_pages_total",
            "Pages in the daemon's KV pool.",
            num(s.pointer("/kv/pages_total")),
        );
        gauge(
            out,
            "nerva_daemon_kv_pages_used",
            "KV pages held by running, parked or forked sequences.",
            num(s.pointer("/kv/pages_used")),
        );
        gauge(
            out,
            "nerva_daemon_queued_requests",
            "Requests waiting for admission in the daemon's engine.",
            num(s.pointer("/scheduler/queued")),
        );
        gauge(
            out,
            "nerva_daemon_running_sequences",
            "Sequences holding a batch slot.",
            num(s.pointer("/scheduler/running")),
        );
        gauge(
            out,
            "nerva_daemon_kv_page_tokens",
            "Tokens per KV page.",
            num(s.pointer("/kv/page_tokens")),
        );
    }
    if let Some(Value::Array(rows)) = clients {
        let sum = |key: &str| rows.iter().filter_map(|r| r[key].as_f64()).sum::<f64>();
        gauge(
            out,
            "nerva_daemon_requests_in_flight",
            "Requests in flight in the daemon over all clients (its queue depth).",
            Some(sum("in_flight")),
        );
        gauge(
            out,
            "nerva_daemon_completion_backlog",
            "Completions waiting in the daemon for ring space, over all clients.",
            Some(sum("backlog")),
        );
    }
    let Some(stats) = stats else {
        return;
    };
    if let Some(t) = num(stats.pointer("/engine/tokens_generated")) {
        let _ = writeln!(
            out,
            "# HELP nerva_daemon_tokens_generated_total Tokens generated by the daemon.\n\
             # TYPE nerva_daemon_tokens_generated_total counter\n\
             nerva_daemon_tokens_generated_total {t}"
        );
    }
    gauge(
        out,
        "nerva_daemon_tokens_per_second",
        "Daemon throughput over the last 10 s.",
        num(stats.pointer("/engine/tokens_per_s_last_10s")),
    );
    if let Some(Value::Object(reasons)) = stats.pointer("/engine/samples_finished") {
        out.push_str(
            "# HELP nerva_daemon_samples_finished_total Samples finished, by reason.\n\
             # TYPE nerva_daemon_samples_finished_total counter\n",
        );
        for (reason, n) in reasons {
            if let Some(n) = n.as_f64() {
                let _ = writeln!(
                    out,
                    "nerva_daemon_samples_finished_total{{reason=\"{reason}\"}} {n}"
                );
            }
        }
    }
    if let Some(Value::Object(stages)) = stats.pointer("/engine/latency") {
        out.push_str(
            "# HELP nerva_daemon_latency_seconds Daemon-side latency quantiles by stage.\n\
             # TYPE nerva_daemon_latency_seconds summary\n",
        );
        for (stage, q) in stages {
            for (label, key) in [("0.5", "p50_us"), ("0.9", "p90_us"), ("0.99", "p99_us")] {
                if let Some(us) = q[key].as_f64() {
                    let _ = writeln!(
                        out,
                        "nerva_daemon_latency_seconds{{stage=\"{stage}\",quantile=\"{label}\"}} {}",
                        us / 1e6
                    );
                }
            }
            if let Some(c) = q["count"].as_f64() {
                let _ = writeln!(
                    out,
                    "nerva_daemon_latency_seconds_count{{stage=\"{stage}\"}} {c}"
                );
            }
        }
    }
    if let Some(Value::Object(ledger)) = stats.get("ledger") {
        out.push_str(
            "# HELP nerva_daemon_ledger_total The daemon's poll-loop ledger counters.\n\
             # TYPE nerva_daemon_ledger_total counter\n",
        );
        for (name, n) in ledger {
            if let Some(n) = n.as_f64() {
                let _ = writeln!(out, "nerva_daemon_ledger_total{{counter=\"{name}\"}} {n}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative() {
        let h = Histogram::new();
        h.observe(Duration::from_micros(50));
        h.observe_n(Duration::from_millis(3), 2);
        h.observe(Duration::from_secs(100));
        let mut s = String::new();
        h.render(&mut s, "x", "help");
        assert!(s.contains("x_bucket{le=\"0.0001\"} 1\n"), "{s}");
        assert!(s.contains("x_bucket{le=\"0.005\"} 3\n"), "{s}");
        assert!(s.contains("x_bucket{le=\"60\"} 3\n"), "{s}");
        assert!(s.contains("x_bucket{le=\"+Inf\"} 4\n"), "{s}");
        assert!(s.contains("x_count 4\n"), "{s}");
    }

    #[test]
    fn daemon_figures_render_from_admin_json() {
        let m = Metrics::new();
        m.request(0, 200);
        m.request(1, 429);
        let status = serde_json::json!({"daemon": {"clients": 3, "uptime_s": 1.5},
            "kv": {"pages_total": 64, "pages_used": 10, "page_tokens": 16},
            "scheduler": {"running": 2, "queued": 5, "parked": 0}});
        let stats = serde_json::json!({"ledger": {"generates": 7},
            "engine": {"tokens_generated": 99, "tokens_per_s_last_10s": 2.0,
            "samples_finished": {"stop": 1}, "latency": {"queue": {"count": 5, "p50_us": 10,
            "p90_us": 20, "p99_us": 30}}}});
        let clients =
            serde_json::json!([{"in_flight": 2, "backlog": 0}, {"in_flight": 1, "backlog": 4}]);
        let text = m.render(5, true, Some(&status), Some(&stats), Some(&clients));
        for line in [
            "nerva_gateway_requests_total{endpoint=\"chat_completions\",status=\"200\"} 1",
            "nerva_gateway_requests_total{endpoint=\"completions\",status=\"429\"} 1",
            "nerva_gateway_requests_in_flight 5",
            "nerva_daemon_up 1",
            "nerva_daemon_clients 3",
            "nerva_daemon_kv_pages_total 64",
            "nerva_daemon_kv_pages_used 10",
            "nerva_daemon_queued_requests 5",
            "nerva_daemon_requests_in_flight 3",
            "nerva_daemon_completion_backlog 4",
            "nerva_daemon_tokens_generated_total 99",
            "nerva_daemon_latency_seconds{stage=\"queue\",quantile=\"0.99\"} 0.00003",
            "nerva_daemon_ledger_total{counter=\"generates\"} 7",
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line}:\n{text}");
        }
        let down = m.render(0, false, None, None, None);
        assert!(down.lines().any(|l| l == "nerva_daemon_up 0"));
    }
}

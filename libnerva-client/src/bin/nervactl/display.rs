//! Human-readable renderings of the daemon's admin JSON.

use serde_json::Value;

use super::table::{Column, Show, Table, col};

fn parse(json: &str) -> Value {
    serde_json::from_str(json).unwrap_or(Value::String(json.to_string()))
}

/// The rows of `status` (JSON paths; the table shows human-scaled values).
pub const STATUS_FIELDS: [(&str, Show); 46] = [
    ("model.name", Show::Text),
    ("model.architecture", Show::Text),
    ("model.dtype", Show::Text),
    ("model.vocab_size", Show::Text),
    ("model.max_context", Show::Text),
    ("model.max_batch", Show::Text),
    ("model.weight_bytes", Show::Bytes),
    ("model.step_weight_bytes", Show::Bytes),
    ("backend", Show::Text),
    ("device", Show::Text),
    ("read_bandwidth_bytes_per_s", Show::ByteRate),
    ("daemon.pid", Show::Text),
    ("daemon.version", Show::Text),
    ("daemon.abi_version", Show::Text),
    ("daemon.uptime_s", Show::Duration),
    ("daemon.socket", Show::Text),
    ("daemon.policy", Show::Text),
    ("daemon.clients", Show::Text),
    ("daemon.draining", Show::Text),
    ("daemon.spin_us", Show::Duration),
    ("arenas.segment_backing", Show::Text),
    ("arenas.segment_page_bytes", Show::Bytes),
    ("arenas.segments_mlocked", Show::Text),
    ("arenas.segment_pool", Show::Text),
    ("arenas.staging_bytes", Show::Bytes),
    ("arenas.staging_mlocked", Show::Text),
    ("arenas.host_pages", Show::Text),
    ("kv.pages_total", Show::Text),
    ("kv.pages_used", Show::Text),
    ("kv.pages_free", Show::Text),
    ("kv.pages_peak", Show::Text),
    ("kv.pages_shared", Show::Text),
    ("kv.pages_cached", Show::Text),
    ("kv.page_tokens", Show::Text),
    ("kv.bytes_per_token", Show::Bytes),
    ("scheduler.running", Show::Text),
    ("scheduler.queued", Show::Text),
    ("scheduler.parked", Show::Text),
    ("scheduler.preempted", Show::Text),
    ("scheduler.preemptions", Show::Text),
    ("scheduler.swapped", Show::Text),
    ("scheduler.swap_outs", Show::Text),
    ("scheduler.swap_ins", Show::Text),
    ("swap.pages_total", Show::Text),
    ("swap.pages_used", Show::Text),
    ("swap.pages_free", Show::Text),
];

/// `status`: one `FIELD VALUE` table, fields named by their JSON path.
pub fn print_status(json: &str, as_json: bool) {
    if as_json {
        println!("{json}");
        return;
    }
    let v = parse(json);
    let mut t = Table::fields();
    t.fields_of(&v, &STATUS_FIELDS);
    t.print();
}

/// The columns of `clients`.
pub const CLIENT_COLUMNS: [Column; 13] = [
    col("slot", Show::Number),
    col("pid", Show::Number),
    col("uid", Show::Number),
    col("sq_used", Show::Number),
    col("sq_entries", Show::Number),
    col("cq_used", Show::Number),
    col("cq_entries", Show::Number),
    col("backlog", Show::Number),
    col("paused", Show::Text),
    col("in_flight", Show::Number),
    col("requests", Show::Number),
    col("tokens_served", Show::Number),
    col("connected_s", Show::Duration),
];

/// `clients`; `hide_pid`: leave out the connections of this process (nervactl's own).
pub fn print_clients(json: &str, as_json: bool, hide_pid: Option<u32>) {
    let mut v = parse(json);
    if let (Some(pid), Some(rows)) = (hide_pid, v.as_array_mut()) {
        rows.retain(|r| r["pid"].as_u64() != Some(u64::from(pid)));
    }
    if as_json {
        println!("{v}");
        return;
    }
    let mut t = Table::new(&CLIENT_COLUMNS);
    for r in v.as_array().map(Vec::as_slice).unwrap_or_default() {
        t.object_row(&CLIENT_COLUMNS, r);
    }
    t.print();
    if t.is_empty() {
        println!("(no clients besides this one)");
    }
}

/// Overall figures of `stats` (paths under `engine`).
pub const STATS_FIELDS: [(&str, Show); 11] = [
    ("engine.uptime_s", Show::Duration),
    ("engine.tokens_generated", Show::Text),
    ("engine.tokens_per_s_overall", Show::Number),
    ("engine.tokens_per_s_last_10s", Show::Number),
    ("engine.samples_finished.stop", Show::Text),
    ("engine.samples_finished.length", Show::Text),
    ("engine.samples_finished.context_length", Show::Text),
    ("engine.samples_finished.cancelled", Show::Text),
    ("engine.samples_finished.error", Show::Text),
    ("engine.samples_finished.shutdown", Show::Text),
    ("engine.token_ledger.tokens", Show::Text),
];

/// Per-stage latency columns of `stats` (raw µs, unit in the header). The first column lists
/// the keys of the JSON object it is named after.
pub const LATENCY_COLUMNS: [Column; 6] = [
    col("latency", Show::Text),
    col("count", Show::Number),
    col("p50_us", Show::Number),
    col("p90_us", Show::Number),
    col("p99_us", Show::Number),
    col("max_us", Show::Number),
];

/// Per-token latency and lag columns of `stats` (human-scaled; the first column lists keys of
/// `token_ledger`).
pub const TOKEN_COLUMNS: [Column; 5] = [
    col("token_ledger", Show::Text),
    col("count", Show::Number),
    col("p50_ns", Show::Duration),
    col("p99_ns", Show::Duration),
    col("max_ns", Show::Duration),
];

/// Mean cost per token (paths under `engine.token_ledger.per_token_mean`).
pub const PER_TOKEN_FIELDS: [(&str, Show); 13] = [
    ("engine.token_ledger.per_token_mean.steps", Show::Number),
    ("engine.token_ledger.per_token_mean.gpu_ns", Show::Duration),
    ("engine.token_ledger.per_token_mean.host_ns", Show::Duration),
    (
        "engine.token_ledger.per_token_mean.graph_replays",
        Show::Number,
    ),
    ("engine.token_ledger.per_token_mean.launches", Show::Number),
    (
        "engine.token_ledger.per_token_mean.graph_nodes",
        Show::Number,
    ),
    (
        "engine.token_ledger.per_token_mean.syncs_hard",
        Show::Number,
    ),
    (
        "engine.token_ledger.per_token_mean.syncs_policy",
        Show::Number,
    ),
    (
        "engine.token_ledger.per_token_mean.syncs_debug",
        Show::Number,
    ),
    ("engine.token_ledger.per_token_mean.h2d_bytes", Show::Bytes),
    ("engine.token_ledger.per_token_mean.d2h_bytes", Show::Bytes),
    (
        "engine.token_ledger.per_token_mean.device_allocs",
        Show::Number,
    ),
    (
        "engine.token_ledger.per_token_mean.pinned_allocs",
        Show::Number,
    ),
];

/// Columns of the recent samples in `stats` (human-scaled; `--json` has every sum).
pub const SAMPLE_COLUMNS: [Column; 15] = [
    col("client_slot", Show::Number),
    col("tag", Show::Number),
    col("sample", Show::Number),
    col("finish", Show::Text),
    col("tokens", Show::Number),
    col("first_token_us", Show::Duration),
    col("wall_ns", Show::Duration),
    col("lag_ns", Show::Duration),
    col("gpu_ns", Show::Duration),
    col("steps", Show::Number),
    col("launches", Show::Number),
    col("graph_nodes", Show::Number),
    col("syncs_hard", Show::Number),
    col("h2d_bytes", Show::Bytes),
    col("d2h_bytes", Show::Bytes),
];

/// `stats`: overall figures, latency per stage, the token ledger (per-token summary and the
/// recent samples' sums), the engine's live gauges and device ledger, the poll thread's ledger.
pub fn print_stats(json: &str, as_json: bool) {
    if as_json {
        println!("{json}");
        return;
    }
    let v = parse(json);
    let e = &v["engine"];
    let mut t = Table::fields();
    t.fields_of(&v, &STATS_FIELDS);
    t.print();

    println!();
    let mut t = Table::new(&LATENCY_COLUMNS);
    for stage in ["queue", "time_to_first_token", "inter_token", "end_to_end"] {
        let mut row = e["latency"][stage].clone();
        row["latency"] = stage.into();
        t.object_row(&LATENCY_COLUMNS, &row);
    }
    t.print();

    println!();
    let mut t = Table::new(&TOKEN_COLUMNS);
    for measure in ["wall", "lag"] {
        let mut row = e["token_ledger"][measure].clone();
        row["token_ledger"] = measure.into();
        t.object_row(&TOKEN_COLUMNS, &row);
    }
    t.print();
    println!();
    let mut t = Table::fields();
    t.fields_of(&v, &PER_TOKEN_FIELDS);
    t.print();

    println!();
    let mut t = Table::new(&SAMPLE_COLUMNS);
    for s in e["recent_samples"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
    {
        t.object_row(&SAMPLE_COLUMNS, s);
    }
    t.print();
    if t.is_empty() {
        println!("(no finished samples yet)");
    }

    println!();
    let mut t = Table::fields();
    t.fields_of(&v, &LIVE_FIELDS);
    // The poll thread's ledger: plain counts.
    if let Some(ledger) = v["ledger"].as_object() {
        for (k, val) in ledger {
            t.field(&format!("ledger.{k}"), Show::Text, val);
        }
    }
    t.print();

    // Each client's share of the tokens served (clients with work in flight).
    let clients = v
        .pointer("/engine/live/client_tokens")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    if !clients.is_empty() {
        println!();
        let mut t = Table::new(&CLIENT_TOKEN_COLUMNS);
        for c in clients {
            t.object_row(&CLIENT_TOKEN_COLUMNS, c);
        }
        t.print();
    }
}

/// `stats`: tokens served per client with work in flight, and the share of all of them.
pub const CLIENT_TOKEN_COLUMNS: [Column; 4] = [
    col("slot", Show::Number),
    col("generation", Show::Number),
    col("tokens", Show::Number),
    col("share", Show::Number),
];

/// The engine's live gauges and the backend's cumulative device ledger in `stats`.
pub const LIVE_FIELDS: [(&str, Show); 40] = [
    ("engine.live.kv_pages_used", Show::Text),
    ("engine.live.kv_pages_free", Show::Text),
    ("engine.live.kv_pages_peak", Show::Text),
    ("engine.live.kv_pages_shared", Show::Text),
    ("engine.live.kv_pages_cached", Show::Text),
    ("engine.live.prefix_hit_pages", Show::Text),
    ("engine.live.running", Show::Text),
    ("engine.live.queued", Show::Text),
    ("engine.live.parked", Show::Text),
    ("engine.live.preempted", Show::Text),
    ("engine.live.preemptions", Show::Text),
    ("engine.live.follow_up_holds", Show::Text),
    ("engine.live.follow_ups_caught", Show::Text),
    ("engine.live.launched_ahead", Show::Text),
    ("engine.live.ahead_missed.admission", Show::Text),
    ("engine.live.ahead_missed.waiting", Show::Text),
    ("engine.live.ahead_missed.host_state", Show::Text),
    ("engine.live.ahead_missed.budget", Show::Text),
    ("engine.live.ahead_missed.pages", Show::Text),
    ("engine.live.ahead_missed.finishing", Show::Text),
    ("engine.live.swapped", Show::Text),
    ("engine.live.swap_outs", Show::Text),
    ("engine.live.swap_ins", Show::Text),
    ("engine.live.swap_pages_used", Show::Text),
    ("engine.live.swap_pages_free", Show::Text),
    ("engine.live.device.steps", Show::Text),
    ("engine.live.device.graph_steps", Show::Text),
    ("engine.live.device.launches", Show::Text),
    ("engine.live.device.graph_nodes", Show::Text),
    ("engine.live.device.launches_per_step", Show::Number),
    ("engine.live.device.graph_nodes_per_step", Show::Number),
    ("engine.live.device.syncs_hard", Show::Text),
    ("engine.live.device.syncs_policy", Show::Text),
    ("engine.live.device.syncs_debug", Show::Text),
    ("engine.live.device.h2d_bytes", Show::Bytes),
    ("engine.live.device.d2h_bytes", Show::Bytes),
    ("engine.live.device.device_allocs", Show::Text),
    ("engine.live.device.pinned_allocs", Show::Text),
    ("engine.live.device.gpu_ms_total", Show::Number),
    ("engine.live.device.gpu_ms_per_step", Show::Number),
];

/// Percentile of sorted values (nearest rank).
pub fn percentile(sorted: &[u64], q: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

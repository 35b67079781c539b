//! Human-readable renderings of the daemon's admin JSON.

use serde_json::Value;

fn parse(json: &str) -> Value {
    serde_json::from_str(json).unwrap_or(Value::String(json.to_string()))
}

fn s(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".into(),
        other => other.to_string(),
    }
}

/// `status`.
pub fn print_status(json: &str, as_json: bool) {
    if as_json {
        println!("{json}");
        return;
    }
    let v = parse(json);
    // Human-scaled weight size next to the exact byte count.
    let weights = match v["model"]["weight_bytes"].as_u64() {
        Some(b) => Value::String(format!(
            "{:.2} GiB ({b} bytes)",
            b as f64 / (1u64 << 30) as f64
        )),
        None => Value::Null,
    };
    let rows = [
        ("model", &v["model"]["name"]),
        ("architecture", &v["model"]["architecture"]),
        ("dtype", &v["model"]["dtype"]),
        ("vocab size", &v["model"]["vocab_size"]),
        ("max context (tokens)", &v["model"]["max_context"]),
        ("max batch (seqs)", &v["model"]["max_batch"]),
        ("weights", &weights),
        ("backend", &v["backend"]),
        ("device", &v["device"]),
        ("daemon pid", &v["daemon"]["pid"]),
        ("version", &v["daemon"]["version"]),
        ("abi", &v["daemon"]["abi_version"]),
        ("uptime (s)", &v["daemon"]["uptime_s"]),
        ("socket", &v["daemon"]["socket"]),
        ("access policy", &v["daemon"]["policy"]),
        ("clients", &v["daemon"]["clients"]),
        ("draining", &v["daemon"]["draining"]),
        ("spin (µs)", &v["daemon"]["spin_us"]),
        ("segment pages", &v["arenas"]["segment_backing"]),
        ("segment page bytes", &v["arenas"]["segment_page_bytes"]),
        ("segments mlocked", &v["arenas"]["segments_mlocked"]),
        ("segment pool", &v["arenas"]["segment_pool"]),
        ("staging bytes", &v["arenas"]["staging_bytes"]),
        ("staging mlocked", &v["arenas"]["staging_mlocked"]),
        ("host pages", &v["arenas"]["host_pages"]),
        ("kv pages", &v["kv"]["pages_total"]),
        ("kv pages used", &v["kv"]["pages_used"]),
        ("kv pages free", &v["kv"]["pages_free"]),
        ("kv page tokens", &v["kv"]["page_tokens"]),
        ("running (seqs)", &v["scheduler"]["running"]),
        ("queued (requests)", &v["scheduler"]["queued"]),
        ("parked (seqs)", &v["scheduler"]["parked"]),
    ];
    for (k, val) in rows {
        println!("{k:<21} {}", s(val));
    }
}

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
    let empty = Vec::new();
    let rows = v.as_array().unwrap_or(&empty);
    println!(
        "{:>4} {:>8} {:>6} {:>11} {:>11} {:>7} {:>6} {:>9} {:>9} {:>10} {:>9}",
        "slot",
        "pid",
        "uid",
        "sq used",
        "cq used",
        "backlog",
        "paused",
        "in-flight",
        "requests",
        "tokens",
        "age (s)"
    );
    for r in rows {
        println!(
            "{:>4} {:>8} {:>6} {:>11} {:>11} {:>7} {:>6} {:>9} {:>9} {:>10} {:>9.1}",
            s(&r["slot"]),
            s(&r["pid"]),
            s(&r["uid"]),
            format!("{}/{}", s(&r["sq_used"]), s(&r["sq_entries"])),
            format!("{}/{}", s(&r["cq_used"]), s(&r["cq_entries"])),
            s(&r["backlog"]),
            s(&r["paused"]),
            s(&r["in_flight"]),
            s(&r["requests"]),
            s(&r["tokens_served"]),
            r["connected_s"].as_f64().unwrap_or(0.0),
        );
    }
    if rows.is_empty() {
        println!("(no clients besides this one)");
    }
}

/// `stats`.
pub fn print_stats(json: &str, as_json: bool) {
    if as_json {
        println!("{json}");
        return;
    }
    let v = parse(json);
    let e = &v["engine"];
    println!(
        "uptime (s)            {:.1}",
        e["uptime_s"].as_f64().unwrap_or(0.0)
    );
    println!("tokens generated      {}", s(&e["tokens_generated"]));
    println!(
        "tokens/s overall      {:.1}",
        e["tokens_per_s_overall"].as_f64().unwrap_or(0.0)
    );
    println!(
        "tokens/s last 10 s    {:.1}",
        e["tokens_per_s_last_10s"].as_f64().unwrap_or(0.0)
    );
    println!("samples finished      {}", e["samples_finished"]);
    println!();
    println!(
        "{:<22} {:>8} {:>10} {:>10} {:>10} {:>10}",
        "latency (µs)", "count", "p50", "p90", "p99", "max"
    );
    for (name, key) in [
        ("queue", "queue"),
        ("time to first token", "time_to_first_token"),
        ("inter-token", "inter_token"),
        ("end to end", "end_to_end"),
    ] {
        let h = &e["latency"][key];
        println!(
            "{:<22} {:>8} {:>10} {:>10} {:>10} {:>10}",
            name,
            s(&h["count"]),
            s(&h["p50_us"]),
            s(&h["p90_us"]),
            s(&h["p99_us"]),
            s(&h["max_us"])
        );
    }
    println!();
    let live = &e["live"];
    println!(
        "kv pages used / free  {} / {}",
        s(&live["kv_pages_used"]),
        s(&live["kv_pages_free"])
    );
    println!(
        "running / queued / parked  {} / {} / {}",
        s(&live["running"]),
        s(&live["queued"]),
        s(&live["parked"])
    );
    println!();
    println!("device ledger (backend steps)");
    if let Some(obj) = live["device"].as_object() {
        for (k, val) in obj {
            println!("  {k:<22} {}", s(val));
        }
    }
    println!();
    println!("poll-thread ledger");
    if let Some(obj) = v["ledger"].as_object() {
        for (k, val) in obj {
            println!("  {k:<22} {}", s(val));
        }
    }
}

/// Percentile of sorted values (nearest rank).
pub fn percentile(sorted: &[u64], q: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

//! `nervactl bench --streams` (the closed-loop sweep) and `--fork` (one request of N samples
//! against N requests) against a real `nervad` on the CPU backend and the tiny model: every
//! level's figures are there and consistent, each mode's KV peak is its own, bad input is
//! refused with a clear message. Small sizes: the figures are checked for sense, never timed.

mod support;

use serde_json::Value;
use support::{Daemon, check_names, json, text};

fn f64_at(v: &Value, key: &str) -> f64 {
    v[key]
        .as_f64()
        .unwrap_or_else(|| panic!("{key} is not a number in {v}"))
}

#[test]
fn sweep_measures_each_level_after_its_first_wave() {
    let daemon = Daemon::start(&["--kv-bytes", "64MiB", "--max-batch", "8"]);
    let file = daemon.dir.join("sweep.json");
    let sweep = [
        "bench",
        "--streams",
        "1,4",
        "--procs",
        "2",
        "--prompt-tokens",
        "16",
        "--max-tokens",
        "8",
        "--waves",
        "2",
    ];
    let mut args = vec!["--json"];
    args.extend(sweep);
    args.extend(["--read-bandwidth", "1e10", "--out"]);
    args.push(file.to_str().expect("utf-8 path"));
    let out = daemon.ctl(&args);
    assert!(out.status.success(), "{}", text(&out).1);
    let v = json(&out);
    let saved: Value =
        serde_json::from_str(&std::fs::read_to_string(&file).expect("--out file")).expect("JSON");
    assert_eq!(saved, v, "--out holds the printed JSON");
    assert_eq!(v["mode"], "sweep");
    assert_eq!(
        v["complete"], true,
        "the last write marks the sweep complete"
    );
    let stderr = text(&out).1;
    assert!(
        stderr.contains("1 streams: ") && stderr.contains("4 streams: "),
        "each level's figures as it finishes: {stderr}"
    );
    assert_eq!(v["params"]["read_bandwidth_source"], "flag");
    let weight = v["daemon"]["weight_bytes"].as_f64().expect("weight_bytes");
    let kv = v["daemon"]["kv_bytes_per_token"]
        .as_f64()
        .expect("the daemon reports its KV bytes per token");
    assert!(weight > 0.0 && kv > 0.0, "{v}");

    let levels = v["levels"].as_array().expect("levels");
    assert_eq!(levels.len(), 2, "{v}");
    for (level, (streams, procs)) in levels.iter().zip([(1u64, 1u64), (4, 2)]) {
        assert_eq!(level["streams"], streams, "{level}");
        assert_eq!(
            level["procs"], procs,
            "streams spread over min(procs, streams)"
        );
        // Every stream: its warm-up request, more while the others warm up, then two measured
        // ones.
        let requests = level["requests"].as_u64().expect("requests");
        assert!(requests >= 3 * streams, "{level}");
        assert_eq!(level["measured_requests"], 2 * streams, "{level}");
        assert_eq!(level["errors"], 0, "{level}");
        let window_tokens = level["window_tokens"].as_u64().expect("window tokens");
        assert!(
            window_tokens > 0 && window_tokens <= (requests - streams) * 8,
            "tokens after the first wave only: {level}"
        );
        assert!(f64_at(level, "tokens_per_s") > 0.0, "{level}");
        for what in ["itl", "ttft"] {
            let p50 = f64_at(level, &format!("{what}_p50_us"));
            let p99 = f64_at(level, &format!("{what}_p99_us"));
            assert!(0.0 <= p50 && p50 <= p99, "{what}: {level}");
        }
        assert!(f64_at(level, "ttft_p50_us") > 0.0, "{level}");
        // Tokens of a 16-token prompt and 8 new: contexts 16..=23.
        let context = f64_at(level, "mean_context");
        assert!((16.0..24.0).contains(&context), "{level}");
        // The roofline from the daemon's own sizes and the flag's bandwidth.
        let batch = f64_at(level, "batch");
        assert_eq!(batch, streams as f64, "below --max-batch every stream runs");
        let step_s = (weight + batch * context * kv) / 1e10;
        let step_us = f64_at(level, "roofline_step_us");
        assert!((step_us - step_s * 1e6).abs() < 1e-6 * step_us, "{level}");
        let roofline = f64_at(level, "roofline_tokens_per_s");
        assert!(
            (roofline - batch / step_s).abs() < 1e-6 * roofline,
            "{level}"
        );
        let pct = f64_at(level, "roofline_pct");
        let expected = 100.0 * f64_at(level, "tokens_per_s") / roofline;
        assert!(pct > 0.0 && (pct - expected).abs() < 1e-9 * pct, "{level}");
        assert!(f64_at(level, "itl_p99_pct") > 0.0, "{level}");
    }

    // The table: one row per level, named after the JSON; on the CPU without --read-bandwidth
    // there is no roofline, and a note says so.
    let mut args = sweep.to_vec();
    args[2] = "2";
    let out = daemon.ctl(&args);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    let table = stdout.split_once('\n').map_or("", |(_, rest)| rest);
    check_names(table, &v);
    assert!(stdout.contains("(no roofline"), "{stdout}");
    let rows: Vec<&str> = table.lines().filter(|l| !l.starts_with('(')).collect();
    assert_eq!(rows.len(), 2, "header and the level: {stdout}");
}

#[test]
fn fork_stores_the_shared_prompt_once_and_each_mode_has_its_own_peak() {
    let daemon = Daemon::start(&["--kv-bytes", "64MiB", "--max-batch", "8"]);
    // 40 tokens: two full KV pages of 16 that a fork's samples share, and a partial one.
    let out = daemon.ctl(&[
        "--json",
        "bench",
        "--fork",
        "8",
        "--prompt-tokens",
        "40",
        "--max-tokens",
        "16",
    ]);
    assert!(out.status.success(), "{}", text(&out).1);
    let v = json(&out);
    assert_eq!(v["prompt_full_pages"], 2, "{v}");
    let modes = v["modes"].as_array().expect("modes");
    let names: Vec<&str> = modes.iter().filter_map(|m| m["mode"].as_str()).collect();
    assert_eq!(names, ["fork", "at_once", "sequential"]);
    let (fork, at_once, sequential) = (&modes[0], &modes[1], &modes[2]);
    for (m, requests) in [(fork, 1), (at_once, 8), (sequential, 8)] {
        assert_eq!(m["requests"], requests, "{m}");
        assert_eq!(m["errors"], 0, "{m}");
        assert_eq!(m["tokens"], 8 * 16, "every sample ran to --max-tokens: {m}");
        assert!(f64_at(m, "wall_s") > 0.0, "{m}");
    }
    // A cold prefix cache for the fork's own prompt.
    assert_eq!(fork["prefix_hit_pages"], 0, "{fork}");
    let peak = |m: &Value| m["kv_pages_peak"].as_u64().expect("kv_pages_peak");
    // The fork: the two full prompt pages once, plus per sample its copy of the partial third
    // page and the fourth (40 + 16 positions): at most 2 + 8 × 2, at least a page per sample.
    assert!(peak(fork) >= 2 + 8, "{v}");
    assert!(
        peak(fork) <= 2 + 8 * 2,
        "the fork holds its prompt's full pages once: {v}"
    );
    // Requests submitted at once share the prompt only through the prefix cache, when they are
    // admitted after the first one's prefill filled its pages (timing); where none did, each
    // held its own prompt.
    if at_once["prefix_hit_pages"] == 0 {
        assert!(
            peak(fork) < peak(at_once),
            "the fork holds its prompt once, the requests at once each their own: {v}"
        );
    }
    // One request at a time holds one request's pages (55 positions: 4 pages), not the peak of
    // a mode before it.
    assert!(peak(sequential) < peak(fork), "{v}");
    assert!(peak(sequential) >= 4, "{v}");
    for key in ["sequential_over_fork", "at_once_over_fork"] {
        assert!(f64_at(&v, key) > 0.0, "{v}");
    }

    // The table is named after the JSON.
    let out = daemon.ctl(&[
        "bench",
        "--fork",
        "2",
        "--prompt-tokens",
        "20",
        "--max-tokens",
        "4",
    ]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    let tables = stdout.split_once('\n').map_or("", |(_, rest)| rest);
    check_names(tables, &v);
    assert!(stdout.contains("sequential_over_fork"), "{stdout}");
}

#[test]
fn bad_sweep_and_fork_input_is_refused_clearly() {
    let daemon = Daemon::start(&["--kv-bytes", "64MiB", "--max-batch", "4"]);
    let refused = |args: &[&str], needle: &str| {
        let out = daemon.ctl(args);
        let (stdout, stderr) = text(&out);
        assert!(!out.status.success(), "{args:?} ran: {stdout}");
        assert!(
            stdout.contains(needle) || stderr.contains(needle),
            "{args:?}: {stdout}{stderr}"
        );
    };
    refused(&["bench", "--streams", "1,0"], "at least 1 stream");
    refused(
        &[
            "--json",
            "bench",
            "--streams",
            "1",
            "--prompt-tokens",
            "100000",
        ],
        "the daemon serves at most",
    );
    refused(&["bench", "--fork", "8"], "--max-batch 8");
    refused(&["bench", "--fork", "65"], "a fork has 2..=64 samples");
    refused(
        &["bench", "--streams", "2", "--requests", "5"],
        "cannot be used",
    );
    refused(&["bench", "--waves", "2"], "--streams");
    refused(
        &["bench", "--prompt-tokens", "16"],
        "apply to --streams and --fork",
    );
}

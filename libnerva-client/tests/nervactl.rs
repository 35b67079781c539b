//! Every `nervactl` command the README documents, run as an operator runs it, against a real
//! `nervad` on a private socket: tables and `--json` (errors too), prompts from stdin and
//! `@file`, `--timeout`, logprobs and the labelled summary, a closed pipe, `clients` without
//! its own connection, `shutdown --wait`.

mod support;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use support::{Daemon, NERVACTL, check_names, json, nervad, tables, text};

#[test]
fn every_documented_command_against_a_live_daemon() {
    let mut daemon = Daemon::start(&["--kv-bytes", "64MiB", "--max-batch", "4"]);

    // status: table with the model's facts, and the same names in --json.
    let out = daemon.ctl(&["status"]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    for row in [
        "model.dtype",
        "model.max_batch",
        "model.max_context",
        "model.vocab_size",
        "model.weight_bytes",
        "kv.pages_free",
    ] {
        assert!(stdout.contains(row), "status lacks {row:?}:\n{stdout}");
    }
    let status = json(&daemon.ctl(&["--json", "status"]));
    assert_eq!(status["model"]["max_batch"], 4);
    check_names(&stdout, &status);
    // Sizes are human-scaled in the table, exact in the JSON.
    let weights = tables(&stdout)[0]
        .iter()
        .find(|r| r[0] == "model.weight_bytes")
        .map(|r| r[1].clone())
        .expect("weights row");
    assert!(weights.ends_with("iB"), "{weights}");
    assert!(status["model"]["weight_bytes"].as_u64() > Some(0));

    // generate: text to stdout, labelled summary to stderr; prompts from stdin and @file.
    let out = daemon.ctl(&["generate", "Hello", "--max-tokens", "6", "--ignore-eos"]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    assert!(!stdout.is_empty());
    assert!(
        stderr.contains("finish: length | prompt: ") && stderr.contains("generated: 6 tokens"),
        "{stderr}"
    );
    let direct = json(&daemon.ctl(&["--json", "generate", "Once upon", "--max-tokens", "5"]));
    let piped = json(&daemon.ctl_with_stdin(
        &["--json", "generate", "-", "--max-tokens", "5"],
        Some("Once upon"),
    ));
    assert_eq!(direct["samples"], piped["samples"], "stdin prompt differs");
    let file = daemon.dir.join("prompt.txt");
    std::fs::write(&file, "Once upon").expect("prompt file");
    let at = format!("@{}", file.display());
    let from_file = json(&daemon.ctl(&["--json", "generate", &at, "--max-tokens", "5"]));
    assert_eq!(
        direct["samples"], from_file["samples"],
        "@file prompt differs"
    );

    // --logprobs: one per token, in JSON and as a table.
    let lp = json(&daemon.ctl(&[
        "--json",
        "generate",
        "Hi",
        "--max-tokens",
        "4",
        "--ignore-eos",
        "--logprobs",
    ]));
    let sample = &lp["samples"][0];
    assert_eq!(sample["logprobs"].as_array().map(Vec::len), Some(4), "{lp}");
    assert!(
        sample["logprobs"]
            .as_array()
            .expect("array")
            .iter()
            .all(|v| v.as_f64().is_some_and(|x| x <= 0.0)),
        "{lp}"
    );
    let (stdout, _) = text(&daemon.ctl(&["generate", "Hi", "--max-tokens", "3", "--logprobs"]));
    assert!(stdout.contains("log-probabilities"), "{stdout}");
    // Without --logprobs, JSON carries none.
    assert!(direct["samples"][0].get("logprobs").is_none());

    // --ledger: the request's own token ledger after the text, one record per token.
    let led = json(&daemon.ctl(&[
        "--json",
        "generate",
        "Hi",
        "--max-tokens",
        "5",
        "--ignore-eos",
        "--n-samples",
        "2",
        "--temperature",
        "0.7",
        "--ledger",
    ]));
    let samples = led["ledger"].as_array().expect("ledger array");
    assert_eq!(samples.len(), 2, "{led}");
    for s in samples {
        assert_eq!(s["tokens"], 5, "{s}");
        assert_eq!(s["records"].as_array().map(Vec::len), Some(5), "{s}");
    }
    assert!(direct.get("ledger").is_none(), "only when asked");
    let out = daemon.ctl(&[
        "generate",
        "Hi",
        "--max-tokens",
        "3",
        "--ignore-eos",
        "--ledger",
    ]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("[ledger, sample 0: 3 tokens | wall: "),
        "{stderr}"
    );
    let table = stdout
        .split_once("--- sample 0: token ledger ---\n")
        .map(|(_, t)| t)
        .expect("ledger table");
    assert_eq!(tables(table)[0].len(), 4, "header and 3 tokens: {table}");

    // Errors: bad input is refused with the daemon's numbers, as JSON under --json.
    let out = daemon.ctl(&["--json", "generate", "Hi", "--n-samples", "5"]);
    assert!(!out.status.success());
    let err = json(&out);
    assert_eq!(err["error"]["name"], "Rejected", "{err}");
    assert!(
        err["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("n_samples 5 > max batch 4")),
        "{err}"
    );
    let out = daemon.ctl(&["generate", "@/nonexistent/prompt"]);
    assert!(!out.status.success());
    assert!(text(&out).1.contains("prompt file /nonexistent/prompt"));

    // --timeout: a generation that cannot finish in time fails with Timeout.
    let out = daemon.ctl(&[
        "--json",
        "--timeout",
        "0.001",
        "generate",
        "Hi",
        "--max-tokens",
        "4000",
        "--ignore-eos",
    ]);
    assert!(!out.status.success());
    assert_eq!(json(&out)["error"]["name"], "Timeout");

    // A closed pipe: nervactl stops quietly (no panic), the daemon cancels.
    let mut child = Command::new(NERVACTL)
        .arg("--socket")
        .arg(&daemon.socket)
        .args(["generate", "Hi", "--max-tokens", "4000", "--ignore-eos"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut stdout = child.stdout.take().expect("stdout");
    let mut first = [0u8; 1];
    std::io::Read::read_exact(&mut stdout, &mut first).expect("some text");
    drop(stdout);
    let out = child.wait_with_output().expect("exit");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");

    // stats: the reader that went away counts as a cancelled sample.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let stats = json(&daemon.ctl(&["--json", "stats"]));
        if stats["engine"]["samples_finished"]["cancelled"].as_u64() >= Some(1) {
            break;
        }
        assert!(Instant::now() < deadline, "no cancelled sample: {stats}");
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = daemon.ctl(&["stats"]);
    assert!(out.status.success());
    let stats = json(&daemon.ctl(&["--json", "stats"]));
    check_names(&text(&out).0, &stats);

    // The token ledger: per-token summary and recent samples' sums in stats, one record per
    // token in the dump, sums equal to the records.
    let ledger = &stats["engine"]["token_ledger"];
    assert!(ledger["tokens"].as_u64() >= Some(6), "{ledger}");
    for k in ["p50_ns", "p99_ns", "max_ns"] {
        assert!(ledger["wall"][k].as_u64() > Some(0), "{ledger}");
        assert!(ledger["lag"][k].is_u64(), "{ledger}");
    }
    assert!(ledger["per_token_mean"]["host_ns"].as_f64() > Some(0.0));
    let recent = stats["engine"]["recent_samples"]
        .as_array()
        .expect("recent samples");
    let six = recent
        .iter()
        .find(|s| s["generated_tokens"] == 6 && s["finish"] == "length")
        .expect("the 6-token generation among the recent samples");
    assert_eq!(six["tokens"], 6, "{six}");
    let dump_file = daemon.dir.join("ledger.json");
    let out = daemon.ctl(&["ledger", "--out", dump_file.to_str().expect("utf-8 path")]);
    assert!(out.status.success(), "{}", text(&out).1);
    let dump: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&dump_file).expect("dump written"))
            .expect("dump is JSON");
    let samples = dump["samples"].as_array().expect("samples");
    assert_eq!(
        samples.len(),
        recent.len(),
        "the dump holds the recent samples"
    );
    for s in samples {
        let records = s["records"].as_array().expect("records");
        assert_eq!(Some(records.len() as u64), s["tokens"].as_u64(), "{s}");
        let wall: u64 = records.iter().filter_map(|r| r["wall_ns"].as_u64()).sum();
        assert_eq!(Some(wall), s["wall_ns"].as_u64(), "wall time adds up: {s}");
        let last_at = records
            .last()
            .and_then(|r| r["at_ns"].as_u64())
            .unwrap_or(0);
        assert_eq!(wall, last_at, "arrival to last token");
    }
    let out = daemon.ctl(&["ledger", "--samples", "1"]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    check_names(&stdout, &dump);
    let last = samples.last().expect("a sample");
    assert_eq!(
        tables(&stdout)[0].len() as u64 - 1,
        last["tokens"].as_u64().unwrap_or(0),
        "one row per token of the last sample"
    );

    // clients: our own connection is hidden unless --all.
    let rows = json(&daemon.ctl(&["--json", "clients"]));
    assert_eq!(rows.as_array().map(Vec::len), Some(0), "{rows}");
    let rows = json(&daemon.ctl(&["--json", "clients", "--all"]));
    assert_eq!(rows.as_array().map(Vec::len), Some(1), "{rows}");
    assert!(daemon.ctl(&["clients"]).status.success());
    let (stdout, _) = text(&daemon.ctl(&["clients", "--all"]));
    check_names(&stdout, &rows);
    assert_eq!(tables(&stdout)[0].len(), 2, "header and our row: {stdout}");

    // ping and bench run; their tables use their JSON's names.
    let out = daemon.ctl(&["ping", "--count", "200"]);
    assert!(out.status.success(), "{}", text(&out).1);
    let ping = json(&daemon.ctl(&["--json", "ping", "--count", "200"]));
    // The first line describes the run; the table follows.
    let (stdout, _) = text(&out);
    let table = stdout.split_once('\n').map_or("", |(_, rest)| rest);
    check_names(table, &ping);
    let out = daemon.ctl(&["--json", "bench", "--procs", "2", "--requests", "3"]);
    assert!(out.status.success(), "{}", text(&out).1);
    let bench = json(&out);
    let out = daemon.ctl(&["bench", "--procs", "1", "--requests", "2"]);
    assert!(out.status.success(), "{}", text(&out).1);
    let (stdout, _) = text(&out);
    let table = stdout.split_once('\n').map_or("", |(_, rest)| rest);
    check_names(table, &bench);

    // shutdown --wait: returns once the daemon exited.
    let reply = json(&daemon.ctl(&["--json", "--timeout", "30", "shutdown", "--wait"]));
    assert_eq!(reply["exited"], true, "{reply}");
    let status = daemon.child.wait().expect("daemon exit");
    assert!(status.success(), "{status}");

    // No daemon: a clean error, as JSON under --json.
    let gone = json(&daemon.ctl(&["--json", "status"]));
    assert_eq!(gone["error"]["name"], "NoDaemon", "{gone}");
}

#[test]
fn demo_says_the_model_is_random_and_samples_vary_with_the_seed() {
    let cache = std::env::temp_dir().join(format!("nervactl-demo-cache-{}", std::process::id()));
    let daemon = nervad();
    let run = |seed: &str| {
        let out = Command::new(NERVACTL)
            .args(["demo", "--max-tokens", "12", "--seed", seed, "--nervad"])
            .arg(&daemon)
            // A private cache: the demo model is generated there, not in the user's.
            .env("XDG_CACHE_HOME", &cache)
            .stdin(Stdio::null())
            .output()
            .expect("run nervactl demo");
        let (stdout, stderr) = text(&out);
        assert!(out.status.success(), "{stderr}");
        assert!(stdout.starts_with("Once upon a time\n"), "{stdout}");
        assert!(stderr.contains("RANDOM weights"), "{stderr}");
        assert!(stderr.contains("seed"), "{stderr}");
        stdout
    };
    let (one, two) = (run("1"), run("2"));
    let _ = std::fs::remove_dir_all(&cache);
    assert!(one.len() > "Once upon a time\n".len(), "{one}");
    assert_ne!(one, two, "the demo's sampling varies with the seed");
}

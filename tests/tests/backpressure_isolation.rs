//! Isolation under backpressure, with real processes: a client process that stops polling while
//! holding 2 × `--max-batch` requests in flight fills its completion ring and is paused; its
//! samples must give their batch slots to others (another client's request completes
//! promptly), and once it drains it must still receive every token of every request.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nerva_client::{Client, EventRef, GenerateParams, Prompt};
use nerva_tests::daemon_harness::Daemon;

const DAEMON: &str = env!("CARGO_BIN_EXE_nervad-under-test");
const CLIENT: &str = env!("CARGO_BIN_EXE_nerva-test-client");

/// Whether the daemon reports a paused client (from `clients`).
fn some_client_paused(observer: &mut Client) -> bool {
    let json = observer.clients().expect("clients");
    let rows: serde_json::Value = serde_json::from_str(&json).expect("clients JSON");
    rows.as_array()
        .expect("array")
        .iter()
        .any(|r| r["paused"] == serde_json::Value::Bool(true))
}

#[test]
fn a_stalled_client_yields_its_batch_slots_and_later_gets_every_token() {
    let max_batch = 2u32;
    let daemon = Daemon::start(DAEMON, &["--max-batch", &max_batch.to_string()]);
    let (requests, max_tokens, cq_entries) = (2 * max_batch, 48u32, 8u32);
    let mut stalled = Command::new(CLIENT)
        .args(["stall", &daemon.socket().display().to_string()])
        .args([requests, max_tokens, cq_entries].map(|n| n.to_string()))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the stalled client");
    let mut lines = BufReader::new(stalled.stdout.take().expect("stdout")).lines();
    let first = lines.next().expect("a line").expect("read");
    assert_eq!(first, "submitted");

    // Wait until the daemon paused it (its ring of 8 completions is full).
    let mut observer = Client::connect(Some(daemon.socket())).expect("observer");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !some_client_paused(&mut observer) {
        assert!(
            Instant::now() < deadline,
            "the stalled client was never paused\n{}",
            daemon.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }

    // Another client's request completes promptly although the stalled one holds (and has
    // queued) twice the batch.
    let start = Instant::now();
    let tag = observer
        .submit_generate(
            Prompt::Text("an unrelated question"),
            &GenerateParams {
                max_tokens: 8,
                temperature: 0.0,
                ignore_eos: true,
                ..GenerateParams::default()
            },
        )
        .expect("submit");
    let mut tokens = 0;
    let mut done = false;
    while !done {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the other client got {tokens} tokens in 30 s while one client stalled\n{}",
            daemon.log()
        );
        observer
            .wait(Some(Duration::from_millis(200)))
            .expect("wait");
        observer
            .poll_with(|e| match e {
                EventRef::Tokens { tag: t, ids, .. } if t == tag => tokens += ids.len(),
                EventRef::Done { tag: t, .. } if t == tag => done = true,
                EventRef::Error { detail, .. } => panic!("request failed: {detail}"),
                _ => {}
            })
            .expect("poll");
    }
    assert_eq!(tokens, 8);
    eprintln!(
        "other client's request done in {:?} while a client stalled",
        start.elapsed()
    );
    assert!(
        some_client_paused(&mut observer),
        "the stalled client was still paused"
    );

    // The stalled client drains: every request gets every token.
    writeln!(stalled.stdin.take().expect("stdin")).expect("release the stalled client");
    let mut results = Vec::new();
    for line in lines {
        let line = line.expect("read");
        results.push(serde_json::from_str::<serde_json::Value>(&line).expect("JSON line"));
    }
    let status = stalled.wait().expect("stalled client exits");
    let mut stderr = String::new();
    if let Some(mut e) = stalled.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut e, &mut stderr);
    }
    assert!(status.success(), "stalled client failed: {stderr}");
    assert_eq!(results.len(), requests as usize, "{results:?}");
    for r in &results {
        assert_eq!(r["finish"], "length", "{r}");
        assert_eq!(r["tokens"], max_tokens, "every token delivered: {r}");
        assert_eq!(r["generated"], max_tokens, "{r}");
    }
}

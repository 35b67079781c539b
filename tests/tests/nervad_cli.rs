//! `nervad`'s command line refuses impossible settings cleanly (an error message and exit
//! status 1 or 2, never an abort), accepts sizes with units, and creates the socket's
//! directory only for the default location.

use std::process::Command;

use nerva_client::Client;
use nerva_tests::daemon_harness::Daemon;

const DAEMON: &str = env!("CARGO_BIN_EXE_nervad-under-test");

fn run(args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(DAEMON)
        .arg("serve")
        .args(args)
        .env("NERVA_LOG", "info")
        .output()
        .expect("run nervad");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn impossible_settings_are_clean_errors() {
    let dir = std::env::temp_dir().join(format!("nerva-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let socket = dir.join("s.sock").display().to_string();
    let (code, err) = run(&["--socket", &socket, "--max-batch", "0"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--max-batch"), "{err}");
    let (code, err) = run(&["--socket", &socket, "--data-bytes", "100"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("4KiB minimum"), "{err}");
    let (code, err) = run(&["--socket", &socket, "--kv-bytes", "1.5QB"]);
    assert_eq!(code, Some(2), "{err}");
    // A KV pool no machine of ours has: an error naming the sizes, exit 1, no abort.
    let (code, err) = run(&[
        "--socket",
        &socket,
        "--engine",
        "model",
        "--kv-bytes",
        "64TiB",
    ]);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("--kv-bytes 64.0 TiB exceeds the memory available"),
        "{err}"
    );
    // An explicit socket path in a missing directory: refused, the directory not created.
    let missing = dir.join("missing");
    let socket = missing.join("s.sock").display().to_string();
    let (code, err) = run(&["--socket", &socket, "--kv-bytes", "64MiB"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("socket directory"), "{err}");
    assert!(
        !missing.exists(),
        "nervad created a directory it was not asked to"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn sizes_with_units_are_served() {
    let daemon = Daemon::start(
        DAEMON,
        &[
            "--kv-bytes",
            "64MiB",
            "--data-bytes",
            "2MiB",
            "--reply-bytes",
            "64KiB",
        ],
    );
    let mut client = Client::connect(Some(daemon.socket())).expect("connect");
    let info = client.model_info().expect("model info");
    assert_eq!(info.data_bytes, 2 << 20);
    assert_eq!(info.reply_bytes, 64 << 10);
}

/// Greedy text of one short generation.
fn generate(client: &mut Client) -> String {
    use nerva_client::{EventRef, GenerateParams, Prompt};
    let params = GenerateParams {
        max_tokens: 8,
        temperature: 0.0,
        ignore_eos: true,
        ..GenerateParams::default()
    };
    let tag = client
        .submit_generate(Prompt::Text("Once upon a time"), &params)
        .expect("submit");
    let (mut text, mut done) = (String::new(), false);
    while !done {
        assert!(
            client
                .wait(Some(std::time::Duration::from_secs(30)))
                .expect("wait")
        );
        client
            .poll_with(|e| match e {
                EventRef::Text { text: t, .. } => text.push_str(t),
                EventRef::Done { tag: t, .. } if t == tag => done = true,
                EventRef::Error { detail, .. } => panic!("failed: {detail}"),
                _ => {}
            })
            .expect("poll");
    }
    text
}

#[test]
fn a_model_file_truncated_under_the_daemon_does_not_kill_it() {
    let source = nervad::model::generate::ensure_default_model().expect("default model");
    let dir = std::env::temp_dir().join(format!("nerva-truncate-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    let mut weights = Vec::new();
    for entry in std::fs::read_dir(&source).expect("model dir") {
        let path = entry.expect("entry").path();
        if path.is_file() {
            let to = dir.join(path.file_name().expect("name"));
            std::fs::copy(&path, &to).expect("copy");
            if to.extension().is_some_and(|e| e == "safetensors") {
                weights.push(to);
            }
        }
    }
    assert!(!weights.is_empty(), "no weights in {}", source.display());
    let model = dir.display().to_string();
    let mut daemon = Daemon::start(DAEMON, &["--model", &model, "--kv-bytes", "64MiB"]);
    let mut client = Client::connect(Some(daemon.socket())).expect("connect");
    let before = generate(&mut client);
    // Truncate every weight file in place (what a careless re-download does), then ask again:
    // a mapped file would fault the daemon (SIGBUS) on its next weight access.
    for w in &weights {
        std::fs::OpenOptions::new()
            .write(true)
            .open(w)
            .and_then(|f| f.set_len(0))
            .expect("truncate");
    }
    let after = generate(&mut client);
    assert_eq!(before, after, "weights changed under the daemon");
    assert!(daemon.alive(), "the daemon died\n{}", daemon.log());
    drop(client);
    drop(daemon);
    let _ = std::fs::remove_dir_all(&dir);
}

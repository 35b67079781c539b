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

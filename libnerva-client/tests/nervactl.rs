//! Every `nervactl` command the README documents, run as an operator runs it, against a real
//! `nervad` on a private socket: tables and `--json` (errors too), prompts from stdin and
//! `@file`, `--timeout`, logprobs and the labelled summary, a closed pipe, `clients` without
//! its own connection, `shutdown --wait`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const NERVACTL: &str = env!("CARGO_BIN_EXE_nervactl");

/// The daemon binary of this build (target/<profile>/nervad), built if missing: nervactl's
/// tests need a real daemon and it lives in another package of the workspace.
fn nervad() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary");
    let profile = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/<profile>/deps");
    let path = profile.join("nervad");
    let profile_name = profile
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("debug");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut build = Command::new(cargo);
    // The features a workspace test run unifies for nervad, so this reuses its build.
    build.args([
        "build",
        "-p",
        "nervad",
        "--bin",
        "nervad",
        "--features",
        "test-engine",
    ]);
    if profile_name == "release" {
        build.arg("--release");
    }
    // Always ask cargo: a no-op when up to date, a rebuild when the daemon's sources changed.
    let status = build.status().expect("run cargo build -p nervad");
    assert!(status.success(), "building nervad failed");
    assert!(path.exists(), "{} missing after the build", path.display());
    path
}

struct Daemon {
    child: Child,
    dir: PathBuf,
    socket: PathBuf,
}

impl Daemon {
    fn start() -> Daemon {
        let dir = std::env::temp_dir().join(format!("nervactl-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let socket = dir.join("nervad.sock");
        let log = std::fs::File::create(dir.join("nervad.log")).expect("log");
        let child = Command::new(nervad())
            .arg("serve")
            .arg("--socket")
            .arg(&socket)
            .args(["--kv-bytes", "64MiB", "--max-batch", "4"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn nervad");
        let daemon = Daemon { child, dir, socket };
        let deadline = Instant::now() + Duration::from_secs(60);
        while nerva_client::Client::connect(Some(&daemon.socket)).is_err() {
            assert!(Instant::now() < deadline, "nervad did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        daemon
    }

    fn ctl(&self, args: &[&str]) -> Output {
        self.ctl_with_stdin(args, None)
    }

    fn ctl_with_stdin(&self, args: &[&str], stdin: Option<&str>) -> Output {
        let mut child = Command::new(NERVACTL)
            .arg("--socket")
            .arg(&self.socket)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run nervactl");
        if let Some(text) = stdin {
            child
                .stdin
                .take()
                .expect("stdin")
                .write_all(text.as_bytes())
                .expect("write stdin");
        }
        drop(child.stdin.take());
        child.wait_with_output().expect("nervactl output")
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn text(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn json(out: &Output) -> serde_json::Value {
    let (stdout, stderr) = text(out);
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {stdout}\n{stderr}"))
}

#[test]
fn every_documented_command_against_a_live_daemon() {
    let mut daemon = Daemon::start();

    // status: table with the model's facts, and the same names in --json.
    let out = daemon.ctl(&["status"]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    for row in [
        "dtype",
        "max batch (seqs)",
        "max context (tokens)",
        "vocab size",
    ] {
        assert!(stdout.contains(row), "status lacks {row:?}:\n{stdout}");
    }
    let status = json(&daemon.ctl(&["--json", "status"]));
    assert_eq!(status["model"]["max_batch"], 4);

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

    // clients: our own connection is hidden unless --all.
    let rows = json(&daemon.ctl(&["--json", "clients"]));
    assert_eq!(rows.as_array().map(Vec::len), Some(0), "{rows}");
    let rows = json(&daemon.ctl(&["--json", "clients", "--all"]));
    assert_eq!(rows.as_array().map(Vec::len), Some(1), "{rows}");
    assert!(daemon.ctl(&["clients"]).status.success());

    // ping and bench run.
    let out = daemon.ctl(&["ping"]);
    assert!(out.status.success(), "{}", text(&out).1);
    let out = daemon.ctl(&["--json", "bench", "--procs", "2", "--requests", "3"]);
    assert!(out.status.success(), "{}", text(&out).1);

    // shutdown --wait: returns once the daemon exited.
    let reply = json(&daemon.ctl(&["--json", "--timeout", "30", "shutdown", "--wait"]));
    assert_eq!(reply["exited"], true, "{reply}");
    let status = daemon.child.wait().expect("daemon exit");
    assert!(status.success(), "{status}");

    // No daemon: a clean error, as JSON under --json.
    let gone = json(&daemon.ctl(&["--json", "status"]));
    assert_eq!(gone["error"]["name"], "NoDaemon", "{gone}");
}

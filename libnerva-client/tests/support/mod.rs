//! What the `nervactl` tests share: a real `nervad` on a private socket, the command's output
//! as text and JSON, and the check that a table's names are its JSON's.

// Each test binary uses its own subset.
#![allow(dead_code)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

pub const NERVACTL: &str = env!("CARGO_BIN_EXE_nervactl");

/// The daemon binary of this build (target/<profile>/nervad), built if missing: nervactl's
/// tests need a real daemon and it lives in another package of the workspace.
pub fn nervad() -> PathBuf {
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

pub struct Daemon {
    /// The daemon process.
    pub child: Child,
    /// Its private directory (socket, log, scratch files).
    pub dir: PathBuf,
    /// Its socket.
    pub socket: PathBuf,
}

impl Daemon {
    /// Start `nervad serve` on a private socket with `flags` and wait until it accepts.
    pub fn start(flags: &[&str]) -> Daemon {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "nervactl-test-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).expect("dir");
        let socket = dir.join("nervad.sock");
        let log = std::fs::File::create(dir.join("nervad.log")).expect("log");
        let child = Command::new(nervad())
            .arg("serve")
            .arg("--socket")
            .arg(&socket)
            .args(flags)
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

    pub fn ctl(&self, args: &[&str]) -> Output {
        self.ctl_with_stdin(args, None)
    }

    pub fn ctl_with_stdin(&self, args: &[&str], stdin: Option<&str>) -> Output {
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

pub fn text(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

pub fn json(out: &Output) -> serde_json::Value {
    let (stdout, stderr) = text(out);
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {stdout}\n{stderr}"))
}

/// A table's cells as (first char, char after the last) spans, split on runs of 2+ spaces.
pub fn spans(line: &str) -> Vec<(usize, usize, String)> {
    let chars: Vec<char> = line.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        if chars[i] == ' ' {
            i += 1;
            continue;
        }
        let start = i;
        while i < chars.len() && !(chars[i] == ' ' && chars.get(i + 1) == Some(&' ')) {
            i += 1;
        }
        let mut end = i;
        while end > start && chars[end - 1] == ' ' {
            end -= 1;
        }
        out.push((start, end, chars[start..end].iter().collect()));
    }
    out
}

/// The tables of a command's output (blocks separated by blank lines; lines in parentheses
/// are notes), each as rows of cells, after checking that every column is aligned: all its
/// cells start at one column (text) or end at one column (numbers).
pub fn tables(stdout: &str) -> Vec<Vec<Vec<String>>> {
    let mut out = Vec::new();
    for block in stdout.split("\n\n") {
        let lines: Vec<&str> = block
            .lines()
            .filter(|l| !l.trim().is_empty() && !l.starts_with('('))
            .collect();
        if lines.is_empty() {
            continue;
        }
        let rows: Vec<Vec<(usize, usize, String)>> = lines.iter().map(|l| spans(l)).collect();
        let width = rows[0].len();
        for (line, row) in lines.iter().zip(&rows) {
            assert_eq!(row.len(), width, "ragged row {line:?} in\n{block}");
        }
        for c in 0..width {
            let starts = rows.iter().all(|r| r[c].0 == rows[0][c].0);
            let ends = rows.iter().all(|r| r[c].1 == rows[0][c].1);
            assert!(starts || ends, "column {c} not aligned in\n{block}");
        }
        out.push(
            rows.into_iter()
                .map(|r| r.into_iter().map(|(_, _, s)| s).collect())
                .collect(),
        );
    }
    out
}

/// Every key of every object in `v`, recursively.
pub fn keys(v: &serde_json::Value, into: &mut std::collections::HashSet<String>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, child) in m {
                into.insert(k.clone());
                keys(child, into);
            }
        }
        serde_json::Value::Array(a) => a.iter().for_each(|x| keys(x, into)),
        _ => {}
    }
}

/// The tables of `stdout` use `json`'s names: a `FIELD VALUE` table's fields are JSON paths,
/// any other header is a JSON key (upper-cased, `_` as space, the unit suffix dropped or
/// written in parentheses).
pub fn check_names(stdout: &str, json: &serde_json::Value) {
    let mut known = std::collections::HashSet::new();
    keys(json, &mut known);
    for table in tables(stdout) {
        if table[0] == ["FIELD", "VALUE"] {
            for row in &table[1..] {
                let pointer = format!("/{}", row[0].replace('.', "/"));
                assert!(
                    json.pointer(&pointer).is_some(),
                    "field {} not in the JSON",
                    row[0]
                );
            }
            continue;
        }
        for header in &table[0] {
            let stem = header
                .split(" (")
                .next()
                .unwrap_or(header)
                .to_lowercase()
                .replace(' ', "_");
            let found = known.iter().any(|k| {
                k == &stem
                    || k.strip_prefix(&stem).is_some_and(|unit| {
                        ["_bytes", "_ns", "_us", "_ms", "_s", "_per_s"].contains(&unit)
                    })
            });
            assert!(found, "column {header} names no JSON key ({stem})");
        }
    }
}

//! Running a daemon for a test: start it on a private socket, wait until it answers, read its
//! fd count / segment mappings / RSS from /proc, stop it.
//!
//! The engine is a parameter: by default the real model engine serves (CPU backend;
//! `NERVA_TEST_MODEL=<dir>` picks the snapshot, default the daemon's own random-weight `tiny`
//! model); `NERVA_TEST_ENGINE=test` serves the deterministic test engine instead. Tests compare outputs against a baseline
//! they compute through the same daemon, so they hold for either engine.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use nerva_client::{Client, Error, EventRef, GenerateParams, Prompt, Tag};

static NEXT: AtomicU32 = AtomicU32::new(0);

/// The engine flags for this run (see the module docs).
pub fn engine_args() -> Vec<String> {
    if test_engine() {
        return vec!["--engine".into(), "test".into()];
    }
    let mut a = vec!["--engine".to_string(), "model".to_string()];
    if let Ok(dir) = std::env::var("NERVA_TEST_MODEL") {
        a.push("--model".into());
        a.push(dir);
    }
    a
}

/// Whether the deterministic test engine serves (some tests slow it down with
/// `--test-step-us` to keep streams in flight).
pub fn test_engine() -> bool {
    matches!(std::env::var("NERVA_TEST_ENGINE").as_deref(), Ok("test"))
}

/// A running daemon.
pub struct Daemon {
    child: Option<Child>,
    dir: PathBuf,
    socket: PathBuf,
}

impl Daemon {
    /// Start `exe` (the `nervad-under-test` binary) with the engine flags plus `extra`.
    pub fn start(exe: &str, extra: &[&str]) -> Daemon {
        let dir = std::env::temp_dir().join(format!(
            "nerva-test-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let socket = dir.join("nervad.sock");
        let log = std::fs::File::create(dir.join("nervad.log")).expect("log file");
        let child = Command::new(exe)
            .arg("serve")
            .arg("--socket")
            .arg(&socket)
            .args(engine_args())
            .args(extra)
            .env("NERVA_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn daemon");
        let d = Daemon {
            child: Some(child),
            dir,
            socket,
        };
        d.wait_ready();
        d
    }

    fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            match Client::connect(Some(&self.socket)) {
                Ok(mut c) => {
                    if c.nop().is_ok() {
                        return;
                    }
                }
                // Up, and its policy excludes us (some tests configure exactly that).
                Err(Error::PermissionDenied(_)) => return,
                Err(_) => {}
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("daemon did not come up; log:\n{}", self.log());
    }

    /// The socket path.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// The daemon's pid.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// The daemon's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("nervad.log")).unwrap_or_default()
    }

    /// Open descriptors of the daemon.
    pub fn fd_count(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.pid()))
            .map(|d| d.count())
            .unwrap_or(0)
    }

    /// What each open descriptor of the daemon points at (`socket:[…]`, `anon_inode:[eventfd]`,
    /// `/memfd:nerva-segment (deleted)`, …).
    pub fn fd_targets(&self) -> Vec<String> {
        std::fs::read_dir(format!("/proc/{}/fd", self.pid()))
            .map(|d| {
                d.filter_map(|e| e.ok().and_then(|e| std::fs::read_link(e.path()).ok()))
                    .map(|p| p.display().to_string())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Descriptors other than the segment pool's memfds (the pool refills on its own schedule,
    /// so leak checks look at everything else and bound the pool separately).
    pub fn fd_count_without_pool(&self) -> usize {
        self.fd_targets()
            .iter()
            .filter(|t| !t.contains("nerva-segment"))
            .count()
    }

    /// Client segments mapped by the daemon (memfd mappings named `nerva-segment`).
    pub fn segment_count(&self) -> usize {
        std::fs::read_to_string(format!("/proc/{}/maps", self.pid()))
            .map(|m| m.lines().filter(|l| l.contains("nerva-segment")).count())
            .unwrap_or(0)
    }

    /// Resident set size in KiB.
    pub fn rss_kib(&self) -> u64 {
        let status =
            std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next().and_then(|n| n.parse().ok()))
            .unwrap_or(0)
    }

    /// Whether the process still runs.
    pub fn alive(&mut self) -> bool {
        matches!(self.child.as_mut().map(|c| c.try_wait()), Some(Ok(None)))
    }

    /// Send a signal.
    pub fn signal(&self, sig: nix::sys::signal::Signal) {
        let pid = nix::unistd::Pid::from_raw(self.pid() as i32);
        nix::sys::signal::kill(pid, sig).expect("signal daemon");
    }

    /// Wait for exit (up to `timeout`); returns the exit status.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + timeout;
        let child = self.child.as_mut()?;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        None
    }

    /// Poll `f` until it holds or `timeout` passes; returns the time it took.
    pub fn settle(
        &self,
        timeout: Duration,
        mut f: impl FnMut(&Daemon) -> bool,
    ) -> Option<Duration> {
        let start = Instant::now();
        while start.elapsed() < timeout {
            if f(self) {
                return Some(start.elapsed());
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        None
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The result of one generation as a test compares it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// Concatenated text.
    pub text: String,
    /// Token ids.
    pub tokens: Vec<u32>,
    /// Finish reason name.
    pub finish: String,
}

/// Deterministic parameters for comparisons: seeded sampling (same prompt and seed → same
/// tokens; [`run_prompts`] derives the seed from the prompt), fixed length. Sampling rather
/// than greedy so that even a random-weight model gives each prompt its own output.
pub fn test_params(max_tokens: u32) -> GenerateParams {
    GenerateParams {
        max_tokens,
        temperature: 1.0,
        ignore_eos: true,
        ..GenerateParams::default()
    }
}

/// The seed [`run_prompts`] uses for `prompt` (djb2 of its bytes).
pub fn seed_for(prompt: &str) -> u64 {
    prompt.bytes().fold(5381u64, |h, b| {
        h.wrapping_mul(33).wrapping_add(u64::from(b))
    })
}

/// The prompt client `client` uses for request `request`.
pub fn prompt_for(client: u32, request: u32) -> String {
    format!("client {client} asks question {request}: tell me a story")
}

/// Run `prompts` through `client`, keeping up to `window` in flight; outcomes in prompt order.
/// Panics on any protocol anomaly (event for an unknown tag, a second Done, ...).
pub fn run_prompts(
    client: &mut Client,
    prompts: &[String],
    params: &GenerateParams,
    window: usize,
) -> Result<Vec<Outcome>, Error> {
    let mut outcomes: Vec<Option<Outcome>> = vec![None; prompts.len()];
    let mut partial: std::collections::HashMap<Tag, (usize, Outcome)> = Default::default();
    let mut next = 0;
    let mut done = 0;
    while done < prompts.len() {
        while next < prompts.len() && partial.len() < window {
            let seeded = GenerateParams {
                seed: seed_for(&prompts[next]),
                ..params.clone()
            };
            match client.submit_generate(Prompt::Text(&prompts[next]), &seeded) {
                Ok(tag) => {
                    let empty = Outcome {
                        text: String::new(),
                        tokens: Vec::new(),
                        finish: String::new(),
                    };
                    partial.insert(tag, (next, empty));
                    next += 1;
                }
                Err(Error::QueueFull) => break,
                Err(e) => return Err(e),
            }
        }
        client.wait(Some(Duration::from_secs(30)))?;
        let mut failure = None;
        client.poll_with(|e| match e {
            EventRef::Text { tag, text, .. } => {
                let entry = partial.get_mut(&tag).expect("text for a tag in flight");
                entry.1.text.push_str(text);
            }
            EventRef::Tokens { tag, ids, .. } => {
                let entry = partial.get_mut(&tag).expect("tokens for a tag in flight");
                entry.1.tokens.extend_from_slice(ids);
            }
            EventRef::Done { tag, reason, .. } => {
                let (i, mut o) = partial.remove(&tag).expect("exactly one Done per request");
                o.finish = reason.name().to_string();
                assert!(outcomes[i].is_none(), "request {i} completed twice");
                outcomes[i] = Some(o);
                done += 1;
            }
            EventRef::Error {
                tag,
                status,
                detail,
                ..
            } => {
                failure = Some(format!("request {tag:?} failed: status {status} {detail}"));
            }
            EventRef::Shutdown => failure = Some("daemon shut down".into()),
            EventRef::TopLogprobs { .. } => {}
        })?;
        if let Some(f) = failure {
            return Err(Error::Protocol(f));
        }
    }
    Ok(outcomes
        .into_iter()
        .map(|o| o.expect("every request completed"))
        .collect())
}

/// One finished request as a `nerva-test-client stream` process prints it (a JSON line).
#[derive(Debug)]
pub struct StreamedRequest {
    /// Its text.
    pub text: String,
    /// Its token ids.
    pub tokens: Vec<u32>,
    /// Its finish reason.
    pub finish: String,
}

/// Run `procs` `nerva-test-client stream` processes (`client_exe`) against the daemon at
/// `socket` at once, each submitting `requests` prompts (`prompt_for(p, r)`) of `tokens` tokens;
/// return each process's requests in order. Panics if a process fails or prints a wrong number
/// of lines.
pub fn stream_from_processes(
    client_exe: &str,
    socket: &Path,
    procs: u32,
    requests: u32,
    tokens: u32,
) -> Vec<Vec<StreamedRequest>> {
    use std::io::{BufRead, BufReader};
    let children: Vec<_> = (0..procs)
        .map(|p| {
            Command::new(client_exe)
                .arg("stream")
                .arg(socket)
                .args([p.to_string(), requests.to_string(), tokens.to_string()])
                .stdout(Stdio::piped())
                .spawn()
                .expect("spawn client")
        })
        .collect();
    children
        .into_iter()
        .enumerate()
        .map(|(p, mut child)| {
            let out = child.stdout.take().expect("stdout");
            let lines: Vec<String> = BufReader::new(out).lines().map_while(Result::ok).collect();
            assert!(
                child.wait().expect("wait").success(),
                "client process {p} failed"
            );
            assert_eq!(
                lines.len(),
                requests as usize,
                "client {p}: one line per request"
            );
            lines
                .iter()
                .map(|line| {
                    let v: serde_json::Value = serde_json::from_str(line).expect("json line");
                    StreamedRequest {
                        text: v["text"].as_str().unwrap_or_default().to_string(),
                        tokens: v["tokens"]
                            .as_array()
                            .expect("tokens")
                            .iter()
                            .filter_map(|t| t.as_u64().map(|t| t as u32))
                            .collect(),
                        finish: v["finish"].as_str().unwrap_or_default().to_string(),
                    }
                })
                .collect()
        })
        .collect()
}

//! `nervactl demo`: the README's main job in one command — start a private `nervad` on the
//! embedded default model (or `--model`), stream one generation through this real client
//! process, then shut the daemon down cleanly.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use clap::Args;
use nerva_client::{Client, Error};

use super::generate::{self, GenerateArgs};

/// Flags of `demo`.
#[derive(Debug, Args)]
pub struct DemoArgs {
    /// The prompt.
    #[arg(default_value = "Once upon a time")]
    pub prompt: String,
    /// The daemon binary [default: `nervad` next to this executable, else on PATH].
    #[arg(long, env = "NERVAD")]
    pub nervad: Option<PathBuf>,
    /// Model snapshot to serve [default: the daemon's random-weight `tiny` demo model].
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Most tokens to generate.
    #[arg(long, default_value_t = 64)]
    pub max_tokens: u32,
    /// Temperature (the demo model's logits are flat enough that sampling visibly varies with
    /// the seed; greedy, it repeats itself).
    #[arg(long, default_value_t = 0.8)]
    pub temperature: f32,
    /// Seed.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Seconds to wait for the daemon to accept connections (first use generates the model).
    #[arg(long, default_value_t = 60)]
    pub start_timeout: u64,
}

/// Kills the daemon if the demo fails half-way, so no process outlives the command.
struct DaemonGuard(Option<Child>);

impl Drop for DaemonGuard {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn daemon_binary(explicit: Option<&Path>) -> PathBuf {
    if let Some(path) = explicit {
        return path.to_path_buf();
    }
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|dir| dir.join("nervad")))
        .filter(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from("nervad"))
}

/// Run it.
pub fn run(a: &DemoArgs) -> Result<(), Error> {
    let dir = std::env::temp_dir().join(format!("nerva-demo-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let socket = dir.join("nervad.sock");
    let binary = daemon_binary(a.nervad.as_deref());
    let mut cmd = Command::new(&binary);
    cmd.arg("serve").arg("--socket").arg(&socket);
    if let Some(model) = &a.model {
        cmd.arg("--model").arg(model);
    }
    // The daemon's log goes to our stderr: it says which model it serves (and that the
    // default one has random weights).
    cmd.stdin(Stdio::null()).stdout(Stdio::null());
    let child = cmd.spawn().map_err(|e| {
        Error::InvalidArgument(format!(
            "cannot start {}: {e} (build it with `cargo build --release --bins`)",
            binary.display()
        ))
    })?;
    let mut guard = DaemonGuard(Some(child));
    eprintln!(
        "nervactl demo: started {} (pid {}) on {}",
        binary.display(),
        guard.0.as_ref().map_or(0, Child::id),
        socket.display()
    );

    let deadline = Instant::now() + Duration::from_secs(a.start_timeout);
    loop {
        if let Some(child) = guard.0.as_mut()
            && let Some(status) = child.try_wait()?
        {
            guard.0 = None;
            return Err(Error::InvalidArgument(format!(
                "nervad exited before serving: {status}"
            )));
        }
        match Client::connect(Some(&socket)) {
            Ok(_) => break,
            Err(Error::NoDaemon { .. }) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(50))
            }
            Err(e) => return Err(e),
        }
    }

    let generation = GenerateArgs {
        prompt: a.prompt.clone(),
        tokens: false,
        chat: false,
        max_tokens: a.max_tokens,
        temperature: a.temperature,
        top_k: 0,
        top_p: 0.95,
        min_p: 0.0,
        repetition_penalty: 1.1,
        presence_penalty: 0.0,
        frequency_penalty: 0.0,
        seed: a.seed,
        stop: Vec::new(),
        stop_token: Vec::new(),
        ignore_eos: false,
        n_samples: 1,
        top_logprobs: 0,
        priority: 0,
        logprobs: false,
        ledger: false,
    };
    if a.model.is_none() {
        eprintln!(
            "nervactl demo: the default model has RANDOM weights: the text below is noise that \
             shows the pipeline working, not a model's answer (sampled at temperature {}, seed \
             {}: another --seed gives other noise)",
            a.temperature, a.seed
        );
    }
    println!("{}", a.prompt);
    let outcome = generate::run(Some(&socket), &generation, false, None);
    if a.model.is_none() {
        eprintln!("nervactl demo: (random-weight model: the text above is noise by design)");
    }

    // Drain and stop the daemon whatever the generation did; report the generation's error first.
    let stopped = Client::connect(Some(&socket)).and_then(|mut c| c.shutdown_daemon().map(drop));
    if let Some(mut child) = guard.0.take() {
        let until = Instant::now() + Duration::from_secs(15);
        loop {
            if let Some(status) = child.try_wait()? {
                eprintln!("nervactl demo: daemon exited ({status})");
                break;
            }
            if Instant::now() > until {
                eprintln!("nervactl demo: daemon did not exit in 15 s; killing it");
                let _ = child.kill();
                let _ = child.wait();
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    outcome?;
    stopped
}

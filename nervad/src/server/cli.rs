//! The `nervad` command line: flags, logging, engine selection. `main.rs` is a thin shell over
//! [`main`] so test harnesses can build the very same daemon entry point (with the counting
//! allocator installed the same way).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use std::sync::Arc;

use crate::engine::{InferenceEngine, TextCodec};
use crate::server::{self, ServeConfig};
use clap::{Args, Parser, Subcommand, ValueEnum};

/// Nerva inference daemon: loads one model and serves decode requests from client processes
/// on this host over per-client shared-memory rings.
#[derive(Debug, Parser)]
#[command(name = "nervad", version, args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// `serve` flags, accepted without the subcommand name (serve is the default).
    #[command(flatten)]
    serve: ServeArgs,
}

/// Subcommands. `serve` is the default when none is given.
#[derive(Debug, Subcommand)]
enum Command {
    /// Serve clients on the socket until SIGTERM/SIGINT (the default).
    Serve(ServeArgs),
    /// Write a random-weight Hugging Face checkpoint (the demo/test models).
    MakeModel(crate::model::generate::MakeModelArgs),
    /// Teacher-forced logits and greedy tokens of a snapshot through the engine (parity).
    Dump(crate::engine::dump::DumpArgs),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum EngineKind {
    /// The model engine (CPU reference or CUDA backend) on --model.
    Model,
    /// Deterministic test engine, no model (protocol tests only; needs the `test-engine` feature).
    #[cfg(feature = "test-engine")]
    Test,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line (for log collectors).
    Json,
}

#[derive(Debug, Clone, Args)]
struct ServeArgs {
    /// Unix socket to listen on [default: $XDG_RUNTIME_DIR/nerva/nervad.sock, else
    /// /run/nerva/nervad.sock]. A stale socket file is replaced; a live daemon on it is an error.
    #[arg(long, env = "NERVA_SOCKET")]
    socket: Option<PathBuf>,
    /// Hugging Face snapshot directory (config.json, *.safetensors, tokenizer.json)
    /// [default: the random-weight `tiny` demo model, generated on first use].
    #[arg(long)]
    model: Option<PathBuf>,
    /// Which engine serves requests.
    #[arg(long, value_enum, default_value = "model")]
    engine: EngineKind,
    /// Engine worker threads for the CPU backend (0 = all cores).
    #[arg(long, default_value_t = 0)]
    threads: usize,
    /// Most sequences (samples) the engine runs at once.
    #[arg(long, default_value_t = 16)]
    max_batch: usize,
    /// Longest sequence served (0 = the model's max_position_embeddings).
    #[arg(long, default_value_t = 0)]
    max_context: usize,
    /// Bytes of the KV pool (allocated at start).
    #[arg(long, default_value_t = 1 << 30)]
    kv_bytes: usize,
    /// Simulated compute per step of the test engine, in microseconds (test engine only).
    #[cfg(feature = "test-engine")]
    #[arg(long, default_value_t = 0)]
    test_step_us: u64,
    /// Admit peers with this uid (repeatable). With neither --allow-uid nor --allow-gid, the
    /// daemon's own uid and the socket file's group are admitted.
    #[arg(long = "allow-uid", value_name = "UID")]
    allow_uid: Vec<u32>,
    /// Admit peers with this primary gid (repeatable).
    #[arg(long = "allow-gid", value_name = "GID")]
    allow_gid: Vec<u32>,
    /// Permissions of the socket file, octal.
    #[arg(long, default_value = "0660", value_parser = parse_octal)]
    socket_mode: u32,
    /// Microseconds the poll thread keeps spinning on empty rings before it sleeps in epoll.
    /// Longer: lower latency for bursty clients, more CPU burnt while idle.
    #[arg(long, default_value_t = 50)]
    spin_us: u64,
    /// Most clients connected at once; further connects are refused with TooManyClients.
    #[arg(long, default_value_t = 256)]
    max_clients: u32,
    /// Submission ring entries per client unless the client asks (power of two).
    #[arg(long, default_value_t = 256, value_parser = parse_pow2)]
    sq_entries: u32,
    /// Completion ring entries per client unless the client asks (power of two). A full
    /// completion ring pauses that client's streams; nothing is dropped.
    #[arg(long, default_value_t = 1024, value_parser = parse_pow2)]
    cq_entries: u32,
    /// Input region bytes per client (prompts, token ids, extension blocks) unless the client asks.
    #[arg(long, default_value_t = 1 << 20)]
    data_bytes: u64,
    /// Output region bytes per client (admin replies such as status/stats JSON).
    #[arg(long, default_value_t = 256 << 10)]
    reply_bytes: u64,
    /// Segments created ahead of time so a connect costs no memfd creation.
    #[arg(long, default_value_t = 4)]
    segment_pool: u32,
    /// Do not try hugetlb pages for segments (they are used only when reserved pages exist).
    #[arg(long)]
    no_hugetlb: bool,
    /// Do not mlock segments and arenas (by default they are locked where RLIMIT_MEMLOCK allows).
    #[arg(long)]
    no_mlock: bool,
    /// Seconds SIGTERM/SIGINT waits for in-flight requests before cancelling them.
    #[arg(long, default_value_t = 10.0)]
    drain_timeout: f64,
    /// Log line format.
    #[arg(long, value_enum, default_value = "text")]
    log_format: LogFormat,
}

fn parse_octal(s: &str) -> Result<u32, String> {
    let mode = u32::from_str_radix(s.trim_start_matches("0o"), 8)
        .map_err(|e| format!("not an octal mode: {e}"))?;
    if mode > 0o777 {
        return Err("mode must be at most 0777".into());
    }
    Ok(mode)
}

fn parse_pow2(s: &str) -> Result<u32, String> {
    let n: u32 = s.parse().map_err(|e| format!("{e}"))?;
    if !n.is_power_of_two() || n < 2 {
        return Err("must be a power of two ≥ 2".into());
    }
    Ok(n)
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("NERVA_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

/// The engine the daemon serves (the real engine plugs in here), and the tokenizer clients
/// may use through the daemon (none for the test engine).
type BuiltEngine = (Box<dyn InferenceEngine>, Option<Arc<dyn TextCodec>>);

fn build_engine(args: &ServeArgs) -> Result<BuiltEngine, String> {
    match args.engine {
        #[cfg(feature = "test-engine")]
        EngineKind::Test => {
            tracing::warn!("serving the deterministic TEST engine: outputs are not a model's");
            Ok((
                Box::new(crate::test_engine::TestEngine::new(Duration::from_micros(
                    args.test_step_us,
                ))),
                None,
            ))
        }
        EngineKind::Model => {
            let dir = match &args.model {
                Some(dir) => dir.clone(),
                // ensure_default_model() says plainly that this model has random weights.
                None => crate::model::generate::ensure_default_model()
                    .map_err(|e| format!("default model: {e}"))?,
            };
            tracing::info!(model = %dir.display(), "loading model");
            let loaded = crate::model::LoadedModel::load(&dir)
                .map_err(|e| format!("model {}: {e}", dir.display()))?;
            let options = crate::engine::EngineOptions {
                max_batch: args.max_batch.max(1),
                max_context: args.max_context,
                kv_budget_bytes: args.kv_bytes,
                threads: args.threads,
                ..crate::engine::EngineOptions::default()
            };
            let (model, codec) = crate::engine::EngineModel::from_loaded_with_codec(loaded);
            let engine = crate::engine::Engine::with_cpu_backend(model, options)
                .map_err(|e| format!("backend: {e}"))?;
            Ok((Box::new(engine), Some(codec)))
        }
    }
}

fn serve(args: ServeArgs) -> ExitCode {
    init_logging(args.log_format);
    if !(args.drain_timeout.is_finite() && args.drain_timeout >= 0.0) {
        tracing::error!("--drain-timeout must be a non-negative number of seconds");
        return ExitCode::from(2);
    }
    let mut config = ServeConfig::with_socket(
        args.socket
            .clone()
            .unwrap_or_else(server::listener::default_socket_path),
    );
    config.socket_mode = args.socket_mode;
    config.allow_uids = args.allow_uid.clone();
    config.allow_gids = args.allow_gid.clone();
    config.spin = Duration::from_micros(args.spin_us);
    config.max_clients = args.max_clients.max(1);
    config.sq_entries = args.sq_entries;
    config.cq_entries = args.cq_entries;
    config.data_bytes = args.data_bytes.max(4096);
    config.reply_bytes = args.reply_bytes.max(4096);
    config.segment_pool = args.segment_pool;
    config.hugetlb = !args.no_hugetlb;
    config.mlock = !args.no_mlock;
    config.drain_timeout = Duration::from_secs_f64(args.drain_timeout);
    // Signals first, before any thread exists, so every thread inherits the blocked mask.
    let signals = match server::signals::ShutdownSignals::block() {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(error = %e, "cannot set up signal handling");
            return ExitCode::FAILURE;
        }
    };
    let (engine, codec) = match build_engine(&args) {
        Ok(e) => e,
        Err(e) => {
            tracing::error!("{e}");
            return ExitCode::FAILURE;
        }
    };
    match server::serve(config, engine, codec, signals) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "nervad failed");
            ExitCode::FAILURE
        }
    }
}

/// Parse the command line and run the daemon. Install
/// [`server::alloc_count::CountingAllocator`] as the global allocator in the binary so the
/// hot-path allocation ledger is live.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Some(Command::Serve(args)) => serve(args),
        Some(Command::MakeModel(args)) => {
            init_logging(LogFormat::Text);
            match crate::model::generate::run_make_model(args) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    tracing::error!("make-model: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Some(Command::Dump(args)) => {
            init_logging(LogFormat::Text);
            match crate::engine::dump::run_dump(args) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    tracing::error!("dump: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        None => serve(cli.serve),
    }
}

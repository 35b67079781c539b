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
#[command(
    name = "nervad",
    version,
    args_conflicts_with_subcommands = true,
    after_help = "Logs go to stderr, coloured only on a terminal. Level: NERVA_LOG, else RUST_LOG \
                  (e.g. NERVA_LOG=debug, NERVA_LOG=nervad::server=trace), else info.\n\
                  Signals: SIGTERM/SIGINT drain (in-flight requests finish within \
                  --drain-timeout); a second one during the drain exits at once."
)]
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
    /// Compile every GPU kernel for the given architectures into the kernel cache, with no GPU
    /// (NVRTC and the CUDA headers only): a daemon started later on that NVRTC version loads
    /// them instead of compiling at start.
    CompileKernels(crate::backend::cuda::prebuild::CompileKernelsArgs),
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
    /// Compute backend: `auto` runs on CUDA when a usable GPU is present (driver ≥ 12.0,
    /// sm_80 or newer, NVRTC loadable) and on the CPU otherwise, logging why.
    #[arg(long, value_enum, default_value = "auto")]
    backend: crate::backend::BackendChoice,
    /// CUDA device ordinal.
    #[arg(long, default_value_t = 0)]
    device: usize,
    /// Device memory the CUDA backend takes at start: bytes (`20GiB`) or a fraction of the free
    /// memory (`0.9`). Weights, activations and sampler state come first; the KV pool takes
    /// the rest (--kv-bytes applies to the CPU backend only).
    #[arg(long, default_value = "0.9")]
    gpu_memory: crate::backend::cuda::GpuMemory,
    /// Run prompt (prefill) projections through cuBLAS instead of the tensor-core decode
    /// kernels: prompts about twice as fast, but their numbers then depend on how they were
    /// chunked and batched (cuBLAS sums in an order that depends on the number of rows), so a
    /// sequence's tokens are no longer batch-invariant. Implied by --projections gemv|mixed|blas.
    #[arg(long)]
    fast_prefill: bool,
    /// Kernels of the decode projections: `tensor` (tensor cores, batch-invariant: a
    /// sequence's tokens are the same alone or in any batch; weights read once per step up to
    /// 64 sequences), `gemv` (CUDA cores, f32 inputs, also batch-invariant: ~10% faster at one
    /// sequence, reads the weights once per 8 sequences), `mixed` (gemv up to 2 sequences,
    /// tensor above, NOT batch-invariant) or `blas` (tensor below 16 tokens, cuBLAS for every
    /// step of 16 tokens or more, decode batches included: the throughput mode for many
    /// streams, NOT batch-invariant).
    #[arg(long, default_value = "tensor")]
    projections: crate::backend::cuda::Projections,
    /// Engine worker threads for the CPU backend (0 = all cores).
    #[arg(long, default_value_t = 0)]
    threads: usize,
    /// Most sequences (samples) the engine runs at once (at least 1). Default: 64 on a GPU
    /// (the CUDA backend captures a decode graph per power of two up to it), 16 on the CPU.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    max_batch: Option<u32>,
    /// Most requests waiting for admission; past it a submit is answered `Busy` (clients retry;
    /// the HTTP gateway answers 429).
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u32).range(1..))]
    max_queued: u32,
    /// Most tokens one step computes: the decode token of every running sequence first, then
    /// prefill chunks up to this budget (a longer prompt is split across steps, so decoding
    /// streams keep their pace while it prefills). Raised to --max-batch if below it; the
    /// activation arenas are sized for it. Default: 2048 on a GPU, where --prefill-chunk bounds
    /// the prompt tokens beside decodes and this budget what a lone prompt takes in one step
    /// (an H200, qwen3-8b: a 2,048-token prompt in 75.0 ms in one step against 76.0 ms in two
    /// of 1,024; with --prefill-chunk 0 and 64 streams of 512-token prompts, 1024 gave the best
    /// throughput of 512–2048, with a 44 ms p99 inter-token latency against 82 at 2048), 256 on
    /// the CPU.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    max_step_tokens: Option<u32>,
    /// Most prompt tokens one step computes, on top of its decode tokens (within
    /// --max-step-tokens); 0: only --max-step-tokens bounds them. A lone prompt (nothing
    /// decoding, nothing else waiting) is not held to it: it only keeps decoding streams and
    /// waiting prompts moving, and alone there is neither. Smaller chunks make shorter
    /// steps, so waiting prompts start sooner and decoding streams stall less, at some cost in
    /// throughput. Default: 512 on a GPU (measured on an H200, qwen3-8b, 64 closed-loop streams
    /// of 512-token prompts: median time to the first token 62–91 ms against 130 with 0, for
    /// 3.6% fewer tokens per second; 256 and 768 were slower to the first token; at 256 streams
    /// 0 gives 22% more tokens per second), 0 on the CPU.
    #[arg(long)]
    prefill_chunk: Option<u32>,
    /// Longest sequence served (0 = the model's max_position_embeddings).
    #[arg(long, default_value_t = 0)]
    max_context: usize,
    /// Bytes of the KV pool, allocated at start; units accepted (e.g. 512MiB, 2GiB, 1G). Must
    /// fit the memory available now.
    #[arg(long, default_value = "1GiB", value_parser = parse_size)]
    kv_bytes: u64,
    /// What a sequence preempted when the KV pool runs dry does with its pages: `swap` copies
    /// the pages it alone holds to the host swap area (--swap-space) and back before it runs
    /// again, keeping the KV bits exactly; it recomputes when the swap area is full.
    /// `recompute` frees them and prefills its prefix again when it resumes.
    #[arg(long, value_enum, default_value = "swap")]
    preemption: crate::engine::Preemption,
    /// Host memory for swapped KV pages, allocated at start (page-locked with CUDA): a whole
    /// number of KV pages in bytes, units accepted (e.g. 8GiB); 0 for none; `auto` takes 4GiB
    /// or a quarter of the memory available now, whichever is less, rounded down to pages.
    #[arg(long, default_value = "auto", value_parser = parse_swap_space)]
    swap_space: SwapSpaceArg,
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
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..))]
    max_clients: u32,
    /// Submission ring entries per client unless the client asks (power of two).
    #[arg(long, default_value_t = 256, value_parser = parse_pow2)]
    sq_entries: u32,
    /// Completion ring entries per client unless the client asks (power of two). A full
    /// completion ring pauses that client's streams; nothing is dropped.
    #[arg(long, default_value_t = 1024, value_parser = parse_pow2)]
    cq_entries: u32,
    /// Input region bytes per client (prompts, token ids, extension blocks) unless the client
    /// asks; units accepted (e.g. 1MiB); at least 4KiB.
    #[arg(long, default_value = "1MiB", value_parser = parse_region_size)]
    data_bytes: u64,
    /// Output region bytes per client (admin replies, tokenize results); units accepted; at
    /// least 4KiB.
    #[arg(long, default_value = "256KiB", value_parser = parse_region_size)]
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

/// A byte size: a number with an optional unit, binary (KiB, MiB, GiB, TiB) or decimal (K/KB,
/// M/MB, G/GB, T/TB), case-insensitive, e.g. `1GiB`, `512MiB`, `4096`, `1.5G`.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let number: f64 = number
        .parse()
        .map_err(|_| format!("{s:?} is not a size (e.g. 1GiB, 512MiB, 4096)"))?;
    let scale: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" => 1_000,
        "kib" => 1 << 10,
        "m" | "mb" => 1_000_000,
        "mib" => 1 << 20,
        "g" | "gb" => 1_000_000_000,
        "gib" => 1 << 30,
        "t" | "tb" => 1_000_000_000_000,
        "tib" => 1 << 40,
        other => {
            return Err(format!(
                "unknown size unit {other:?} in {s:?} (KiB, MiB, GiB, ...)"
            ));
        }
    };
    let bytes = number * scale as f64;
    if !bytes.is_finite() || bytes < 0.0 || bytes > u64::MAX as f64 || bytes.fract() != 0.0 {
        return Err(format!("{s:?} is not a whole number of bytes"));
    }
    Ok(bytes as u64)
}

/// `--swap-space`: `auto` or a size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SwapSpaceArg {
    Auto,
    Bytes(u64),
}

fn parse_swap_space(s: &str) -> Result<SwapSpaceArg, String> {
    if s.trim().eq_ignore_ascii_case("auto") {
        return Ok(SwapSpaceArg::Auto);
    }
    parse_size(s)
        .map(SwapSpaceArg::Bytes)
        .map_err(|e| format!("{e}, or auto"))
}

/// The `auto` swap space: 4GiB, capped at a quarter of the memory available (the KV pool, the
/// weights and clients' segments need the rest); 4GiB when that cannot be read.
const AUTO_SWAP_BYTES: u64 = 4 << 30;

/// The GPU's default `--prefill-chunk` (its doc says why).
const GPU_PREFILL_CHUNK: usize = 512;

/// `--max-batch`, `--max-step-tokens` and `--prefill-chunk`, or the defaults of the backend
/// that will serve: a GPU is worth a wider batch and longer steps than the CPU reference. Under
/// `auto` a usable device counts as the GPU (should the CUDA backend then refuse the model, the
/// CPU serves with the GPU's limits; all are only bounds).
fn batch_limits(args: &ServeArgs) -> (usize, usize, usize) {
    use crate::backend::BackendChoice;
    let gpu = match args.backend {
        BackendChoice::Cpu => false,
        BackendChoice::Cuda => true,
        BackendChoice::Auto => crate::backend::cuda::probe(args.device).is_ok(),
    };
    let (batch, step, chunk) = if gpu {
        (64, 2048, GPU_PREFILL_CHUNK)
    } else {
        (16, 256, 0)
    };
    (
        args.max_batch.map_or(batch, |b| b as usize),
        args.max_step_tokens.map_or(step, |s| s as usize),
        args.prefill_chunk.map_or(chunk, |c| c as usize),
    )
}

/// The swap area `--preemption`/`--swap-space` ask for, checked against the host's memory.
fn swap_space(args: &ServeArgs) -> Result<crate::backend::SwapSpace, String> {
    use crate::backend::SwapSpace;
    let to_usize = |bytes: u64| {
        usize::try_from(bytes)
            .map_err(|_| format!("--swap-space {bytes} does not fit this machine"))
    };
    if args.preemption == crate::engine::Preemption::Recompute {
        if matches!(args.swap_space, SwapSpaceArg::Bytes(b) if b > 0) {
            tracing::warn!("--swap-space is unused with --preemption recompute; no swap area");
        }
        return Ok(SwapSpace::None);
    }
    let available = memory_available();
    match args.swap_space {
        SwapSpaceArg::Auto => {
            let bytes = available.map_or(AUTO_SWAP_BYTES, |a| AUTO_SWAP_BYTES.min(a / 4));
            Ok(SwapSpace::UpTo(to_usize(bytes)?))
        }
        SwapSpaceArg::Bytes(0) => Ok(SwapSpace::None),
        SwapSpaceArg::Bytes(bytes) => {
            if let Some(available) = available
                && bytes > available
            {
                return Err(format!(
                    "--swap-space {} exceeds the memory available now ({}); choose a smaller \
                     swap area, or 0 for none",
                    human_bytes(bytes),
                    human_bytes(available)
                ));
            }
            Ok(SwapSpace::Bytes(to_usize(bytes)?))
        }
    }
}

fn parse_region_size(s: &str) -> Result<u64, String> {
    let bytes = parse_size(s)?;
    if bytes < 4096 {
        return Err(format!("{bytes} bytes is below the 4KiB minimum"));
    }
    Ok(bytes)
}

/// `MemAvailable` of /proc/meminfo, in bytes (None where unreadable).
fn memory_available() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Bytes as an operator reads them (binary units, one decimal).
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

fn parse_pow2(s: &str) -> Result<u32, String> {
    let n: u32 = s.parse().map_err(|e| format!("{e}"))?;
    if !n.is_power_of_two() || n < 2 {
        return Err("must be a power of two ≥ 2".into());
    }
    Ok(n)
}

fn init_logging(format: LogFormat) {
    use std::io::IsTerminal;
    // NERVA_LOG, else RUST_LOG, else info (documented in --help).
    let filter = tracing_subscriber::EnvFilter::try_from_env("NERVA_LOG")
        .or_else(|_| tracing_subscriber::EnvFilter::try_from_env("RUST_LOG"))
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Colour only on a terminal: escape codes in a log file or journal are noise.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
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
            // The CPU backend allocates the KV pool in host memory at start: an impossible size
            // is an error here, not an allocation abort later.
            if let Some(available) = memory_available()
                && args.kv_bytes > available
            {
                return Err(format!(
                    "--kv-bytes {} exceeds the memory available now ({}); choose a smaller pool",
                    human_bytes(args.kv_bytes),
                    human_bytes(available)
                ));
            }
            let kv_budget_bytes = usize::try_from(args.kv_bytes)
                .map_err(|_| format!("--kv-bytes {} does not fit this machine", args.kv_bytes))?;
            let swap = swap_space(args)?;
            tracing::info!(model = %dir.display(), "loading model");
            let loaded = crate::model::LoadedModel::load(&dir)
                .map_err(|e| format!("model {}: {e}", dir.display()))?;
            let model_context = loaded.config.max_position_embeddings;
            if args.max_context > model_context {
                tracing::warn!(
                    max_context = args.max_context,
                    model_context,
                    "--max-context above the model's max_position_embeddings; serving the model's"
                );
            }
            #[cfg(feature = "test-engine")]
            if args.test_step_us != 0 {
                tracing::warn!("--test-step-us only applies to --engine test; ignored");
            }
            let (max_batch, max_step_tokens, prefill_chunk) = batch_limits(args);
            let options = crate::engine::EngineOptions {
                max_batch,
                max_queued: args.max_queued as usize,
                max_step_tokens,
                prefill_chunk,
                max_context: args.max_context,
                kv_budget_bytes,
                threads: args.threads,
                preemption: args.preemption,
                swap,
                ..crate::engine::EngineOptions::default()
            };
            let (model, codec) = crate::engine::EngineModel::from_loaded_with_codec(loaded);
            let mut engine = crate::engine::Engine::with_backend(
                model,
                options,
                args.backend,
                crate::backend::cuda::CudaOptions {
                    device: args.device,
                    memory: args.gpu_memory,
                    fast_prefill: args.fast_prefill,
                    projections: args.projections,
                    ..crate::backend::cuda::CudaOptions::default()
                },
            )
            .map_err(|e| format!("backend: {e}"))?;
            // Once, before serving: the ceiling `nervactl status` reports for decode rooflines.
            if let Some(bytes_per_s) = engine
                .measure_read_bandwidth()
                .map_err(|e| format!("measuring the device's read bandwidth: {e}"))?
            {
                tracing::info!(
                    gb_per_s = (bytes_per_s / 1e9).round(),
                    "device read bandwidth measured"
                );
            }
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
    config.create_socket_dir = args.socket.is_none();
    config.socket_mode = args.socket_mode;
    config.allow_uids = args.allow_uid.clone();
    config.allow_gids = args.allow_gid.clone();
    config.spin = Duration::from_micros(args.spin_us);
    config.max_clients = args.max_clients;
    config.sq_entries = args.sq_entries;
    config.cq_entries = args.cq_entries;
    config.data_bytes = args.data_bytes;
    config.reply_bytes = args.reply_bytes;
    if config.data_bytes > config.max_data_bytes {
        tracing::warn!(
            data_bytes = config.data_bytes,
            max_data_bytes = config.max_data_bytes,
            "--data-bytes above the per-client maximum; clients get the maximum"
        );
        config.data_bytes = config.max_data_bytes;
    }
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
        Some(Command::CompileKernels(args)) => {
            init_logging(LogFormat::Text);
            match crate::backend::cuda::prebuild::run_compile_kernels(args) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    tracing::error!("compile-kernels: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        None => serve(cli.serve),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_accept_units_and_refuse_nonsense() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert_eq!(parse_size("512mib"), Ok(512 << 20));
        assert_eq!(parse_size("1.5G"), Ok(1_500_000_000));
        assert_eq!(parse_size(" 64 KiB "), Ok(64 << 10));
        assert_eq!(parse_size("2TiB"), Ok(2 << 40));
        for bad in ["", "GiB", "1.5B", "1QB", "-1", "1e3", "99999999999TiB"] {
            assert!(parse_size(bad).is_err(), "{bad:?} accepted");
        }
        assert!(parse_region_size("4095").is_err());
        assert_eq!(parse_region_size("4KiB"), Ok(4096));
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(100), "100 B");
        assert_eq!(human_bytes(3 << 30), "3.0 GiB");
    }

    #[test]
    fn batch_limits_default_per_backend_and_follow_the_flags() {
        use clap::Parser;
        let limits = |argv: &[&str]| {
            let cli = Cli::try_parse_from(std::iter::once("nervad").chain(argv.iter().copied()))
                .expect("parse");
            batch_limits(&cli.serve)
        };
        assert_eq!(limits(&["--backend", "cpu"]), (16, 256, 0));
        // A CUDA backend asked for by name gets the GPU's defaults (whether or not it can run).
        assert_eq!(
            limits(&["--backend", "cuda"]),
            (64, 2048, GPU_PREFILL_CHUNK)
        );
        assert_eq!(
            limits(&[
                "--backend",
                "cuda",
                "--max-batch",
                "8",
                "--max-step-tokens",
                "512",
                "--prefill-chunk",
                "256"
            ]),
            (8, 512, 256)
        );
        assert_eq!(
            limits(&["--backend", "cpu", "--max-batch", "3"]),
            (3, 256, 0)
        );
        assert!(Cli::try_parse_from(["nervad", "--max-step-tokens", "0"]).is_err());
    }
}

//! `nervad dump`: teacher-forced logits and a greedy continuation, for parity checks against
//! transformers.
//!
//! Writes `OUT/result.json` (`prompt_tokens`, `greedy_tokens`, `vocab_size`, `positions`) and
//! `OUT/logits.f32` (little-endian f32 `[positions, vocab]`, the logits after every prompt
//! token). The greedy continuation runs through the engine's normal request path: paged KV,
//! one token per step, eos ignored.

use std::io::Write;
use std::path::PathBuf;

use super::api::{
    ClientId, EngineEvent, EventSink, GenerateRequest, InferenceEngine, Prompt, RequestError,
    RequestKey,
};
use super::core::{Engine, EngineOptions};
use super::model::EngineModel;
use crate::backend::{BackendError, kv_bytes_per_token};
use crate::model::{LoadedModel, ModelError};

/// Arguments of `nervad dump`.
#[derive(Debug, Clone, clap::Args)]
pub struct DumpArgs {
    /// Hugging Face snapshot directory.
    #[arg(long)]
    pub model: PathBuf,
    /// Prompt token ids, comma separated (e.g. "1,5,9").
    #[arg(long)]
    pub tokens: String,
    /// Greedy tokens to generate after the prompt.
    #[arg(long, default_value_t = 64)]
    pub steps: u32,
    /// Output directory (created if missing).
    #[arg(long)]
    pub out: PathBuf,
    /// CPU worker threads (0 = all cores).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// Backend to dump from (the CPU reference unless asked).
    #[arg(long, value_enum, default_value = "cpu")]
    pub backend: crate::backend::BackendChoice,
    /// CUDA device ordinal.
    #[arg(long, default_value_t = 0)]
    pub device: usize,
    /// Device memory for the CUDA backend: bytes or a fraction of free memory.
    #[arg(long, default_value = "0.5")]
    pub gpu_memory: crate::backend::cuda::GpuMemory,
    /// CUDA: prompt projections through cuBLAS (see `nervad --help`).
    #[arg(long)]
    pub fast_prefill: bool,
    /// CUDA: decode-projection kernels, `tensor` or `gemv` (see `nervad --help`).
    #[arg(long, default_value = "tensor")]
    pub projections: crate::backend::cuda::Projections,
}

/// Why a dump failed.
#[derive(Debug, thiserror::Error)]
pub enum DumpError {
    /// `--tokens` is not a comma-separated list of ids.
    #[error("--tokens: {0}")]
    Tokens(String),
    /// Loading the model failed.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// The backend could not be built.
    #[error(transparent)]
    Backend(#[from] BackendError),
    /// The engine refused or failed the request.
    #[error(transparent)]
    Request(#[from] RequestError),
    /// Writing the output failed.
    #[error("{path}: {source}")]
    Io {
        /// File or directory.
        path: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
}

/// Parse "1, 5,9" into ids.
pub fn parse_token_list(s: &str) -> Result<Vec<u32>, DumpError> {
    let ids: Result<Vec<u32>, _> = s
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|p| {
            p.parse::<u32>()
                .map_err(|e| DumpError::Tokens(format!("{p:?}: {e}")))
        })
        .collect();
    let ids = ids?;
    if ids.is_empty() {
        return Err(DumpError::Tokens("no token ids".into()));
    }
    Ok(ids)
}

/// Collects the greedy tokens of the one dump request.
#[derive(Default)]
struct Collect {
    tokens: Vec<u32>,
    error: Option<RequestError>,
}

impl EventSink for Collect {
    fn emit(&mut self, event: EngineEvent<'_>) {
        match event {
            EngineEvent::Tokens { ids, .. } => self.tokens.extend_from_slice(ids),
            EngineEvent::Error { error, .. } => self.error = Some(error.clone()),
            _ => {}
        }
    }
}

/// Result of [`dump_model`].
#[derive(Debug, Clone, PartialEq)]
pub struct DumpResult {
    /// The prompt.
    pub prompt_tokens: Vec<u32>,
    /// The greedy continuation.
    pub greedy_tokens: Vec<u32>,
    /// Vocabulary size (logits row width).
    pub vocab_size: usize,
    /// `[prompt_tokens.len(), vocab_size]` teacher-forced logits.
    pub logits: Vec<f32>,
}

/// Teacher-forced logits of `tokens` and `steps` greedy tokens through the engine on the CPU
/// reference.
pub fn dump_model(
    model: EngineModel,
    tokens: &[u32],
    steps: u32,
    threads: usize,
) -> Result<DumpResult, DumpError> {
    dump_model_on(
        model,
        tokens,
        steps,
        threads,
        crate::backend::BackendChoice::Cpu,
        crate::backend::cuda::CudaOptions::default(),
    )
}

/// [`dump_model`] on the backend `choice` names.
pub fn dump_model_on(
    model: EngineModel,
    tokens: &[u32],
    steps: u32,
    threads: usize,
    choice: crate::backend::BackendChoice,
    cuda: crate::backend::cuda::CudaOptions,
) -> Result<DumpResult, DumpError> {
    let config = model.config.clone();
    let context = (tokens.len() + steps as usize).min(config.max_position_embeddings);
    let page_tokens = 16;
    let pages = context.div_ceil(page_tokens) + 1;
    let options = EngineOptions {
        max_batch: 1,
        max_context: context.max(1),
        kv_budget_bytes: pages * page_tokens * kv_bytes_per_token(&config, 4),
        threads,
        max_step_tokens: 256,
        page_tokens,
        max_queued: 1,
        ..EngineOptions::default()
    };
    let mut engine = Engine::with_backend(model, options, choice, cuda)?;
    let logits = engine.prompt_logits(tokens)?;
    let key = RequestKey {
        client: ClientId {
            slot: 0,
            generation: 0,
        },
        tag: 0,
    };
    let mut sink = Collect::default();
    if steps > 0 {
        engine.submit(GenerateRequest::fixed_length(
            key,
            Prompt::Tokens(tokens.to_vec()),
            steps,
        ))?;
        while engine.step(&mut sink) {}
    }
    if let Some(e) = sink.error {
        return Err(e.into());
    }
    Ok(DumpResult {
        prompt_tokens: tokens.to_vec(),
        greedy_tokens: sink.tokens,
        vocab_size: config.vocab_size,
        logits,
    })
}

/// `nervad dump`.
pub fn run_dump(args: DumpArgs) -> Result<(), DumpError> {
    let tokens = parse_token_list(&args.tokens)?;
    let loaded = LoadedModel::load(&args.model)?;
    let result = dump_model_on(
        EngineModel::from_loaded(loaded),
        &tokens,
        args.steps,
        args.threads,
        args.backend,
        crate::backend::cuda::CudaOptions {
            device: args.device,
            memory: args.gpu_memory,
            fast_prefill: args.fast_prefill,
            projections: args.projections,
            ..crate::backend::cuda::CudaOptions::default()
        },
    )?;
    let io = |path: &PathBuf| {
        let path = path.clone();
        move |source| DumpError::Io { path, source }
    };
    std::fs::create_dir_all(&args.out).map_err(io(&args.out))?;
    let json = serde_json::json!({
        "prompt_tokens": result.prompt_tokens,
        "greedy_tokens": result.greedy_tokens,
        "vocab_size": result.vocab_size,
        "positions": result.prompt_tokens.len(),
    });
    let path = args.out.join("result.json");
    std::fs::write(&path, format!("{json:#}\n")).map_err(io(&path))?;
    let path = args.out.join("logits.f32");
    let mut file = std::io::BufWriter::new(std::fs::File::create(&path).map_err(io(&path))?);
    for v in &result.logits {
        file.write_all(&v.to_le_bytes()).map_err(io(&path))?;
    }
    file.flush().map_err(io(&path))?;
    tracing::info!(
        out = %args.out.display(),
        positions = result.prompt_tokens.len(),
        steps = result.greedy_tokens.len(),
        "dump written"
    );
    Ok(())
}

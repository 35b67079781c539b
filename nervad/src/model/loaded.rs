//! One entry point: a Hugging Face snapshot directory → everything the engine needs.

use std::path::{Path, PathBuf};
use std::time::Instant;

use super::chat_template::{ChatTemplate, SpecialTokens};
use super::config::ModelConfig;
use super::error::ModelError;
use super::generation_config::GenerationConfig;
use super::safetensors_loader::{LoadOptions, WeightsReport, load_weights};
use super::tokenizer::Tokenizer;
use super::tokenizer_config::TokenizerConfig;
use super::weights::ModelWeights;

/// A model ready to serve.
#[derive(Debug)]
pub struct LoadedModel {
    /// Display name (the snapshot directory's name).
    pub name: String,
    /// The snapshot directory.
    pub dir: PathBuf,
    /// Resolved `config.json`.
    pub config: ModelConfig,
    /// Weights, mapped from the safetensors files.
    pub weights: ModelWeights,
    /// `tokenizer.json` with its byte table.
    pub tokenizer: Tokenizer,
    /// The chat template, if the snapshot has one.
    pub chat_template: Option<ChatTemplate>,
    /// Special-token strings from `tokenizer_config.json`.
    pub special_tokens: SpecialTokens,
    /// `generation_config.json` (defaults when absent).
    pub generation: GenerationConfig,
    /// What loading the weights found.
    pub weights_report: WeightsReport,
}

impl LoadedModel {
    /// Load `dir` with default options (pages pre-faulted, progress bar on a terminal).
    pub fn load(dir: &Path) -> Result<LoadedModel, ModelError> {
        Self::load_with(dir, LoadOptions::default())
    }

    /// Load `dir`. The cheap files are read and checked first so a broken snapshot fails
    /// before gigabytes are touched.
    pub fn load_with(dir: &Path, options: LoadOptions) -> Result<LoadedModel, ModelError> {
        let started = Instant::now();
        if !dir.is_dir() {
            return Err(ModelError::MissingFile {
                path: dir.to_path_buf(),
                what: "the model snapshot directory",
            });
        }
        let parsed = ModelConfig::from_file(&dir.join("config.json"))?;
        let mut config = parsed.config;

        let tokenizer = Tokenizer::from_file(&dir.join("tokenizer.json"))?;
        if tokenizer.len() > config.vocab_size {
            return Err(ModelError::Tokenizer(format!(
                "tokenizer has {} tokens but the model's vocab_size is {}: it could produce ids the model cannot embed",
                tokenizer.len(),
                config.vocab_size
            )));
        }
        let tokenizer_config = TokenizerConfig::from_dir(dir)?;
        let special_tokens = tokenizer_config.special.clone();
        for (field, token) in [
            ("bos_token", &special_tokens.bos),
            ("eos_token", &special_tokens.eos),
        ] {
            if let Some(token) = token
                && tokenizer.token_id(token).is_none()
            {
                return Err(ModelError::Tokenizer(format!(
                    "tokenizer_config.json {field} {token:?} is not a token of tokenizer.json"
                )));
            }
        }
        let chat_template = tokenizer_config
            .chat_template
            .map(|source| ChatTemplate::new(source, special_tokens.clone()))
            .transpose()?;
        let generation = GenerationConfig::from_dir(dir, config.vocab_size)?;

        let (weights, weights_report) = load_weights(dir, &config, options)?;
        if !parsed.dtype_given {
            // No torch_dtype/dtype in config.json: the weights say what they are.
            config.dtype = weights.embed_tokens.dtype();
        }
        let name = dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| dir.display().to_string());
        tracing::info!(
            model = %name,
            architecture = ?config.architecture,
            dtype = ?config.dtype,
            layers = config.num_hidden_layers,
            vocab = config.vocab_size,
            mapped_bytes = weights_report.mapped_bytes,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "model loaded"
        );
        Ok(LoadedModel {
            name,
            dir: dir.to_path_buf(),
            config,
            weights,
            tokenizer,
            chat_template,
            special_tokens,
            generation,
            weights_report,
        })
    }

    /// Ids that end a sample unless the request ignores eos: `generation_config.json`'s
    /// `eos_token_id`, then `config.json`'s, then `tokenizer_config.json`'s `eos_token`
    /// (deduplicated, in that order).
    pub fn eos_token_ids(&self) -> Vec<u32> {
        let mut ids = self.generation.eos_token_ids.clone();
        let from_tokenizer = self
            .special_tokens
            .eos
            .as_deref()
            .and_then(|t| self.tokenizer.token_id(t));
        for id in self
            .config
            .eos_token_ids
            .iter()
            .copied()
            .chain(from_tokenizer)
        {
            if !ids.contains(&id) {
                ids.push(id);
            }
        }
        ids
    }

    /// The id prepended to prompts, if any: `generation_config.json`, then `config.json`.
    pub fn bos_token_id(&self) -> Option<u32> {
        self.generation.bos_token_id.or(self.config.bos_token_id)
    }
}

//! Models: configuration, weights from safetensors, tokenizer, chat template, generation
//! defaults, and the random-weight checkpoint generator.
//!
//! Entry points:
//! - [`LoadedModel::load`]: a Hugging Face snapshot directory → config, mapped weights,
//!   tokenizer (with the exact per-token byte table), chat template, generation defaults.
//! - [`generate::make_checkpoint`] / [`generate::run_make_model`]: write a random-weight snapshot
//!   of a [`generate::Preset`] that transformers loads unchanged;
//!   [`generate::ensure_default_model`]: the demo model used when no `--model` is given.
//!
//! Module map: `hf_config` parses `config.json` into the [`ModelConfig`] contract;
//! `tensor_names` lists the tensors a config implies (shared by loader and generator);
//! `safetensors_loader` maps and checks the weights; `tokenizer`, `tokenizer_config`,
//! `chat_template`, `generation_config` read the other snapshot files; `loaded` ties them
//! together; `generate` writes checkpoints.

pub mod chat_template;
pub mod config;
pub mod error;
pub mod generate;
pub mod generation_config;
pub mod hf_config;
pub mod loaded;
pub mod safetensors_loader;
pub mod tensor_names;
pub mod tokenizer;
pub mod tokenizer_config;
pub mod weights;

#[cfg(test)]
mod tests;

pub use chat_template::{ChatTemplate, SpecialTokens};
pub use config::{Architecture, DType, ModelConfig, RopeScaling};
pub use error::ModelError;
pub use generation_config::GenerationConfig;
pub use hf_config::ParsedConfig;
pub use loaded::LoadedModel;
pub use safetensors_loader::{LoadOptions, WeightsReport};
pub use tokenizer::Tokenizer;
pub use weights::{Attention, DecoderLayer, Linear, Mlp, ModelWeights, Tensor};

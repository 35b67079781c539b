//! Models: configuration, weights from safetensors, tokenizer, chat template, generation
//! defaults, and the random-weight checkpoint generator.

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

//! Models: configuration, weights from safetensors, tokenizer, chat template, generation
//! defaults, and the random-weight checkpoint generator.

pub mod config;
pub mod weights;

pub use config::{Architecture, DType, ModelConfig, RopeScaling};
pub use weights::{Attention, DecoderLayer, Linear, Mlp, ModelWeights, Tensor};

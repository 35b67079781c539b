//! The one error type of model loading and generation.
//!
//! Every variant names the file, tensor, field or value at fault so that a user pointing the
//! daemon at a wrong or unsupported snapshot learns what to fix without reading code.

use std::path::PathBuf;

/// Why a model could not be loaded (or generated).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ModelError {
    /// Reading or writing a file failed.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A file the snapshot needs is absent.
    #[error("{}: missing ({what})", path.display())]
    MissingFile {
        /// Where it was expected.
        path: PathBuf,
        /// What it would have provided.
        what: &'static str,
    },
    /// A JSON file does not parse or does not have the expected shape.
    #[error("{}: {message}", path.display())]
    Json {
        /// The file.
        path: PathBuf,
        /// The parser's message (with line and column).
        message: String,
    },
    /// `architectures` names a model this daemon cannot run.
    #[error(
        "unsupported architecture {0:?} (supported: Qwen3ForCausalLM, LlamaForCausalLM, Qwen2ForCausalLM, MistralForCausalLM)"
    )]
    UnsupportedArchitecture(String),
    /// A weight dtype other than bfloat16, float16 or float32.
    #[error("unsupported dtype {0:?} (supported: bfloat16, float16, float32)")]
    UnsupportedDType(String),
    /// A RoPE variant other than default, linear or llama3.
    #[error("unsupported rope type {0:?} (supported: default, linear, llama3)")]
    UnsupportedRope(String),
    /// An MLP activation other than SiLU.
    #[error("unsupported hidden_act {0:?} (supported: silu)")]
    UnsupportedActivation(String),
    /// `config.json` is inconsistent, incomplete or asks for a feature we do not implement.
    #[error("config.json: {0}")]
    InvalidConfig(String),
    /// A safetensors file (or the shard index) is malformed.
    #[error("{}: invalid safetensors: {message}", path.display())]
    Safetensors {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        message: String,
    },
    /// A tensor the architecture needs is not in the checkpoint.
    #[error("tensor {0} is missing from the checkpoint")]
    MissingTensor(String),
    /// A tensor's shape disagrees with the config.
    #[error("tensor {name} has shape {found:?}; config.json implies {expected:?}")]
    TensorShape {
        /// Tensor name.
        name: String,
        /// Shape the config implies.
        expected: Vec<usize>,
        /// Shape in the file.
        found: Vec<usize>,
    },
    /// A tensor is stored in a dtype we cannot compute with.
    #[error("tensor {name} is stored as {found} (supported: BF16, F16, F32)")]
    TensorDType {
        /// Tensor name.
        name: String,
        /// The dtype in the file.
        found: String,
    },
    /// A tensor that contradicts the config (e.g. a layer index past `num_hidden_layers`).
    #[error("tensor {name} does not belong to this model: {why}")]
    UnexpectedTensor {
        /// Tensor name.
        name: String,
        /// Why it cannot be ignored.
        why: String,
    },
    /// `tokenizer.json` failed to load or is inconsistent with the model.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// The chat template failed to compile or to render.
    #[error("chat template: {0}")]
    ChatTemplate(String),
    /// The checkpoint generator was asked for something it cannot do.
    #[error("make-model: {0}")]
    Generator(String),
}

impl ModelError {
    /// An I/O error on `path`.
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        ModelError::Io {
            path: path.into(),
            source,
        }
    }

    /// A JSON error on `path`.
    pub(crate) fn json(path: impl Into<PathBuf>, message: impl std::fmt::Display) -> Self {
        ModelError::Json {
            path: path.into(),
            message: message.to_string(),
        }
    }
}

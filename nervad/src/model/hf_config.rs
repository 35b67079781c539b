//! `config.json` (Hugging Face schema) → [`ModelConfig`].
//!
//! Defaults follow the transformers config classes of each architecture (`LlamaConfig`,
//! `Qwen2Config`, `Qwen3Config`, `MistralConfig`). Both the transformers-4 layout (`rope_theta`
//! plus `rope_scaling`, `torch_dtype`) and the transformers-5 layout (`rope_parameters`, `dtype`)
//! are accepted. Anything we would compute differently from transformers is an error naming it.

use std::path::Path;

use serde::Deserialize;
use serde_json::Value;

use super::config::{Architecture, DType, ModelConfig, RopeScaling};
use super::error::ModelError;

/// A token id or a list of them (`eos_token_id` is either in the wild).
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub(crate) enum TokenIds {
    One(u64),
    Many(Vec<u64>),
}

impl TokenIds {
    pub(crate) fn to_vec(&self) -> Vec<u64> {
        match self {
            TokenIds::One(id) => vec![*id],
            TokenIds::Many(ids) => ids.clone(),
        }
    }
}

/// The fields of `config.json` we read; everything else is ignored like transformers does.
#[derive(Debug, Deserialize)]
struct RawConfig {
    architectures: Option<Vec<String>>,
    model_type: Option<String>,
    vocab_size: Option<usize>,
    hidden_size: Option<usize>,
    intermediate_size: Option<usize>,
    num_hidden_layers: Option<usize>,
    num_attention_heads: Option<usize>,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    hidden_act: Option<String>,
    rms_norm_eps: Option<f64>,
    rope_theta: Option<f64>,
    rope_scaling: Option<Value>,
    rope_parameters: Option<Value>,
    max_position_embeddings: Option<usize>,
    tie_word_embeddings: Option<bool>,
    attention_bias: Option<bool>,
    mlp_bias: Option<bool>,
    use_sliding_window: Option<bool>,
    sliding_window: Option<usize>,
    layer_types: Option<Vec<String>>,
    torch_dtype: Option<String>,
    dtype: Option<String>,
    bos_token_id: Option<TokenIds>,
    eos_token_id: Option<TokenIds>,
    quantization_config: Option<Value>,
    pretraining_tp: Option<usize>,
}

impl Architecture {
    /// The class name transformers writes in `architectures`.
    pub fn hf_class(self) -> &'static str {
        match self {
            Architecture::Qwen3 => "Qwen3ForCausalLM",
            Architecture::Llama => "LlamaForCausalLM",
            Architecture::Qwen2 => "Qwen2ForCausalLM",
            Architecture::Mistral => "MistralForCausalLM",
        }
    }

    /// The `model_type` transformers writes in `config.json`.
    pub fn hf_model_type(self) -> &'static str {
        match self {
            Architecture::Qwen3 => "qwen3",
            Architecture::Llama => "llama",
            Architecture::Qwen2 => "qwen2",
            Architecture::Mistral => "mistral",
        }
    }

    fn from_hf_class(name: &str) -> Option<Self> {
        [
            Architecture::Qwen3,
            Architecture::Llama,
            Architecture::Qwen2,
            Architecture::Mistral,
        ]
        .into_iter()
        .find(|a| a.hf_class() == name)
    }
}

impl DType {
    /// Parse `torch_dtype` / `dtype` as transformers writes it (`"bfloat16"`, `"torch.float16"`).
    pub fn from_hf_name(name: &str) -> Result<Self, ModelError> {
        match name.strip_prefix("torch.").unwrap_or(name) {
            "bfloat16" => Ok(DType::BF16),
            "float16" | "half" => Ok(DType::F16),
            "float32" | "float" => Ok(DType::F32),
            _ => Err(ModelError::UnsupportedDType(name.to_string())),
        }
    }

    /// The name transformers writes in `config.json`.
    pub fn hf_name(self) -> &'static str {
        match self {
            DType::BF16 => "bfloat16",
            DType::F16 => "float16",
            DType::F32 => "float32",
        }
    }
}

/// Architecture defaults where transformers' config classes differ.
struct Defaults {
    rms_norm_eps: f64,
    rope_theta: f64,
    max_position_embeddings: usize,
}

fn defaults(arch: Architecture) -> Defaults {
    match arch {
        Architecture::Llama => Defaults {
            rms_norm_eps: 1e-6,
            rope_theta: 10_000.0,
            max_position_embeddings: 2048,
        },
        Architecture::Qwen2 | Architecture::Qwen3 => Defaults {
            rms_norm_eps: 1e-6,
            rope_theta: 10_000.0,
            max_position_embeddings: 32_768,
        },
        Architecture::Mistral => Defaults {
            rms_norm_eps: 1e-6,
            rope_theta: 10_000.0,
            max_position_embeddings: 4096 * 32,
        },
    }
}

fn invalid(msg: impl Into<String>) -> ModelError {
    ModelError::InvalidConfig(msg.into())
}

fn required(value: Option<usize>, field: &str) -> Result<usize, ModelError> {
    match value {
        Some(0) => Err(invalid(format!("{field} must be positive"))),
        Some(v) => Ok(v),
        None => Err(invalid(format!("{field} is missing"))),
    }
}

fn param_f64(
    obj: &serde_json::Map<String, Value>,
    key: &str,
    rope: &str,
) -> Result<f64, ModelError> {
    obj.get(key)
        .and_then(Value::as_f64)
        .ok_or_else(|| invalid(format!("rope type {rope} needs a numeric {key}")))
}

/// Resolve RoPE from `rope_parameters` (transformers 5) or `rope_theta` + `rope_scaling`
/// (transformers 4). Returns `(theta, scaling)`.
fn parse_rope(raw: &RawConfig, default_theta: f64) -> Result<(f64, RopeScaling), ModelError> {
    // transformers 5 may also write the same object under `rope_scaling`; prefer the new key.
    let params = match (&raw.rope_parameters, &raw.rope_scaling) {
        (Some(p), _) if !p.is_null() => Some(p),
        (_, Some(s)) if !s.is_null() => Some(s),
        _ => None,
    };
    let Some(params) = params else {
        let theta = raw.rope_theta.unwrap_or(default_theta);
        return Ok((theta, RopeScaling::None));
    };
    let Some(obj) = params.as_object() else {
        return Err(invalid("rope_scaling / rope_parameters must be an object"));
    };
    let theta = obj
        .get("rope_theta")
        .and_then(Value::as_f64)
        .or(raw.rope_theta)
        .unwrap_or(default_theta);
    // `type` is the pre-4.45 spelling of `rope_type`.
    let kind = obj
        .get("rope_type")
        .or_else(|| obj.get("type"))
        .and_then(Value::as_str);
    let Some(kind) = kind else {
        // A per-layer-type map ({"full_attention": {...}, ...}) or something else we do not know.
        return Err(invalid(
            "rope_parameters without a rope_type (per-layer-type RoPE is unsupported)",
        ));
    };
    let scaling = match kind {
        "default" => RopeScaling::None,
        "linear" => {
            let factor = param_f64(obj, "factor", kind)?;
            if factor <= 0.0 || !factor.is_finite() {
                return Err(invalid(format!(
                    "linear rope factor {factor} must be positive"
                )));
            }
            RopeScaling::Linear { factor }
        }
        "llama3" => {
            let factor = param_f64(obj, "factor", kind)?;
            let low_freq_factor = param_f64(obj, "low_freq_factor", kind)?;
            let high_freq_factor = param_f64(obj, "high_freq_factor", kind)?;
            let original = obj
                .get("original_max_position_embeddings")
                .and_then(Value::as_u64)
                .ok_or_else(|| {
                    invalid("rope type llama3 needs an integer original_max_position_embeddings")
                })?;
            if factor <= 0.0 || low_freq_factor <= 0.0 || high_freq_factor <= low_freq_factor {
                return Err(invalid(format!(
                    "llama3 rope needs factor > 0 and high_freq_factor > low_freq_factor > 0 \
                     (got factor {factor}, low {low_freq_factor}, high {high_freq_factor})"
                )));
            }
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings: usize::try_from(original)
                    .map_err(|_| invalid("original_max_position_embeddings is too large"))?,
            }
        }
        other => return Err(ModelError::UnsupportedRope(other.to_string())),
    };
    if !(theta > 0.0 && theta.is_finite()) {
        return Err(invalid(format!("rope_theta {theta} must be positive")));
    }
    Ok((theta, scaling))
}

fn token_ids(ids: &Option<TokenIds>, field: &str, vocab: usize) -> Result<Vec<u32>, ModelError> {
    let mut out = Vec::new();
    for id in ids.as_ref().map(TokenIds::to_vec).unwrap_or_default() {
        if id >= vocab as u64 {
            return Err(invalid(format!(
                "{field} {id} is outside the vocabulary (vocab_size {vocab})"
            )));
        }
        // In range of vocab_size, which is checked to fit u32 before this is called.
        let id = id as u32;
        if !out.contains(&id) {
            out.push(id);
        }
    }
    Ok(out)
}

/// A parsed `config.json` plus whether it named the weight dtype (if not, the loader takes the
/// dtype of the embedding tensor, as transformers would load "whatever is stored").
#[derive(Debug, Clone)]
pub struct ParsedConfig {
    /// The resolved configuration.
    pub config: ModelConfig,
    /// `torch_dtype` / `dtype` was present.
    pub dtype_given: bool,
}

impl ModelConfig {
    /// Parse and validate the text of a `config.json`.
    pub fn from_json_str(text: &str) -> Result<ParsedConfig, ModelError> {
        let raw: RawConfig =
            serde_json::from_str(text).map_err(|e| ModelError::json("config.json", e))?;
        resolve(raw)
    }

    /// Read, parse and validate `path` (a `config.json`).
    pub fn from_file(path: &Path) -> Result<ParsedConfig, ModelError> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                ModelError::MissingFile {
                    path: path.to_path_buf(),
                    what: "the model configuration",
                }
            } else {
                ModelError::io(path, e)
            }
        })?;
        let raw: RawConfig = serde_json::from_str(&text).map_err(|e| ModelError::json(path, e))?;
        resolve(raw)
    }
}

fn resolve(raw: RawConfig) -> Result<ParsedConfig, ModelError> {
    let architecture = match raw.architectures.as_deref() {
        Some([one]) => Architecture::from_hf_class(one)
            .ok_or_else(|| ModelError::UnsupportedArchitecture(one.clone()))?,
        // transformers' Auto classes go by model_type when architectures is absent.
        Some([]) | None => match raw.model_type.as_deref() {
            Some(t) => [
                Architecture::Qwen3,
                Architecture::Llama,
                Architecture::Qwen2,
                Architecture::Mistral,
            ]
            .into_iter()
            .find(|a| a.hf_model_type() == t)
            .ok_or_else(|| ModelError::UnsupportedArchitecture(format!("model_type {t}")))?,
            None => {
                return Err(ModelError::InvalidConfig(
                    "neither architectures nor model_type is given".into(),
                ));
            }
        },
        Some(many) => return Err(ModelError::UnsupportedArchitecture(many.join(","))),
    };
    if raw.quantization_config.is_some() {
        return Err(invalid(
            "quantized checkpoints (quantization_config) are unsupported",
        ));
    }
    if raw.pretraining_tp.is_some_and(|tp| tp > 1) {
        return Err(invalid("pretraining_tp > 1 is unsupported"));
    }
    let act = raw.hidden_act.as_deref().unwrap_or("silu");
    // transformers maps "swish" to the same SiLU module.
    if act != "silu" && act != "swish" {
        return Err(ModelError::UnsupportedActivation(act.to_string()));
    }

    let vocab_size = required(raw.vocab_size, "vocab_size")?;
    if vocab_size > u32::MAX as usize {
        return Err(invalid(format!(
            "vocab_size {vocab_size} does not fit 32-bit token ids"
        )));
    }
    let hidden_size = required(raw.hidden_size, "hidden_size")?;
    let intermediate_size = required(raw.intermediate_size, "intermediate_size")?;
    let num_hidden_layers = required(raw.num_hidden_layers, "num_hidden_layers")?;
    let num_attention_heads = required(raw.num_attention_heads, "num_attention_heads")?;
    let num_key_value_heads = required(
        raw.num_key_value_heads.or(Some(num_attention_heads)),
        "num_key_value_heads",
    )?;
    if num_attention_heads % num_key_value_heads != 0 {
        return Err(invalid(format!(
            "num_attention_heads {num_attention_heads} is not a multiple of num_key_value_heads {num_key_value_heads}"
        )));
    }
    let head_dim = match raw.head_dim {
        Some(0) => return Err(invalid("head_dim must be positive")),
        Some(d) => d,
        None => {
            if hidden_size % num_attention_heads != 0 {
                return Err(invalid(format!(
                    "hidden_size {hidden_size} is not a multiple of num_attention_heads {num_attention_heads} and head_dim is not given"
                )));
            }
            hidden_size / num_attention_heads
        }
    };
    if head_dim % 2 != 0 {
        return Err(invalid(format!(
            "head_dim {head_dim} must be even for RoPE"
        )));
    }

    let d = defaults(architecture);
    let rms_norm_eps = raw.rms_norm_eps.unwrap_or(d.rms_norm_eps);
    if !(rms_norm_eps > 0.0 && rms_norm_eps.is_finite()) {
        return Err(invalid(format!(
            "rms_norm_eps {rms_norm_eps} must be positive"
        )));
    }
    let (rope_theta, rope_scaling) = parse_rope(&raw, d.rope_theta)?;
    let max_position_embeddings = required(
        raw.max_position_embeddings
            .or(Some(d.max_position_embeddings)),
        "max_position_embeddings",
    )?;

    // Which projections carry biases is fixed per architecture in transformers.
    let attention_bias_flag = raw.attention_bias.unwrap_or(false);
    let (attention_bias, o_proj_bias, mlp_bias, qk_norm) = match architecture {
        Architecture::Llama => (
            attention_bias_flag,
            attention_bias_flag,
            raw.mlp_bias.unwrap_or(false),
            false,
        ),
        Architecture::Qwen3 => (attention_bias_flag, attention_bias_flag, false, true),
        Architecture::Qwen2 => (true, false, false, false),
        Architecture::Mistral => (false, false, false, false),
    };

    let sliding_window = match architecture {
        Architecture::Mistral => match raw.sliding_window {
            Some(0) => return Err(invalid("sliding_window must be positive or null")),
            w => w,
        },
        Architecture::Qwen2 | Architecture::Qwen3 => {
            // Qwen applies the window only to layers past max_window_layers: per-layer windows
            // are not implemented, so refuse rather than compute something else.
            if raw.use_sliding_window.unwrap_or(false) {
                return Err(invalid(
                    "use_sliding_window = true (per-layer sliding windows) is unsupported",
                ));
            }
            None
        }
        Architecture::Llama => None,
    };
    if let Some(types) = &raw.layer_types {
        let expected = if sliding_window.is_some() {
            "sliding_attention"
        } else {
            "full_attention"
        };
        if let Some(bad) = types.iter().find(|t| t.as_str() != expected) {
            return Err(invalid(format!(
                "layer_types contains {bad:?} but every layer must be {expected:?}"
            )));
        }
        if types.len() != num_hidden_layers {
            return Err(invalid(format!(
                "layer_types has {} entries for {num_hidden_layers} layers",
                types.len()
            )));
        }
    }

    // transformers 5 writes `dtype`; 4.x wrote `torch_dtype`.
    let dtype_name = raw.dtype.as_deref().or(raw.torch_dtype.as_deref());
    let dtype = dtype_name.map(DType::from_hf_name).transpose()?;

    let bos = token_ids(&raw.bos_token_id, "bos_token_id", vocab_size)?;
    if bos.len() > 1 {
        return Err(invalid("bos_token_id must be a single id"));
    }
    let eos_token_ids = token_ids(&raw.eos_token_id, "eos_token_id", vocab_size)?;

    Ok(ParsedConfig {
        config: ModelConfig {
            architecture,
            vocab_size,
            hidden_size,
            intermediate_size,
            num_hidden_layers,
            num_attention_heads,
            num_key_value_heads,
            head_dim,
            rms_norm_eps,
            rope_theta,
            rope_scaling,
            max_position_embeddings,
            tie_word_embeddings: raw.tie_word_embeddings.unwrap_or(false),
            attention_bias,
            o_proj_bias,
            mlp_bias,
            qk_norm,
            sliding_window,
            dtype: dtype.unwrap_or(DType::F32),
            bos_token_id: bos.first().copied(),
            eos_token_ids,
        },
        dtype_given: dtype.is_some(),
    })
}

//! The resolved model configuration every backend works from.
//!
//! `config.json` parsing (per architecture, with defaults and validation) fills this struct;
//! backends never look at raw JSON.

/// Architectures the daemon can run. Anything else fails at load with its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Architecture {
    /// `Qwen3ForCausalLM`: no qkv bias, RMSNorm on q and k per head (QK-norm).
    Qwen3,
    /// `LlamaForCausalLM` (incl. Llama-3 rope scaling).
    Llama,
    /// `Qwen2ForCausalLM` (Qwen2 and Qwen2.5): bias on q, k, v projections.
    Qwen2,
    /// `MistralForCausalLM`.
    Mistral,
}

/// Storage type of a tensor in a checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DType {
    /// bfloat16: the top 16 bits of an f32.
    BF16,
    /// IEEE half precision.
    F16,
    /// IEEE single precision.
    F32,
}

impl DType {
    /// Bytes per element.
    pub const fn size(self) -> usize {
        match self {
            DType::BF16 | DType::F16 => 2,
            DType::F32 => 4,
        }
    }

    /// Lower-case name, as `status` and model info report it.
    pub const fn name(self) -> &'static str {
        match self {
            DType::BF16 => "bf16",
            DType::F16 => "f16",
            DType::F32 => "f32",
        }
    }
}

/// Rotary embedding frequency scaling.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RopeScaling {
    /// Plain RoPE: `inv_freq[i] = theta^(-2i/head_dim)`.
    None,
    /// Llama 3 ("rope_type": "llama3") wavelength-dependent scaling, as in transformers'
    /// `_compute_llama3_parameters`.
    Llama3 {
        /// Overall scale factor.
        factor: f64,
        /// Wavelengths longer than `original_max_position_embeddings / low_freq_factor` are divided by `factor`.
        low_freq_factor: f64,
        /// Wavelengths shorter than `original_max_position_embeddings / high_freq_factor` are kept.
        high_freq_factor: f64,
        /// Context length the model was pre-trained with.
        original_max_position_embeddings: usize,
    },
    /// "rope_type": "linear": positions divided by `factor`.
    Linear {
        /// Position divisor.
        factor: f64,
    },
}

/// Everything a backend needs to know about a decoder-only transformer.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    /// Which architecture (decides biases, QK-norm).
    pub architecture: Architecture,
    /// Rows of the embedding and of the LM head.
    pub vocab_size: usize,
    /// Model width.
    pub hidden_size: usize,
    /// MLP width (gate/up output, down input).
    pub intermediate_size: usize,
    /// Number of decoder layers.
    pub num_hidden_layers: usize,
    /// Query heads.
    pub num_attention_heads: usize,
    /// Key/value heads (grouped-query attention when fewer than query heads).
    pub num_key_value_heads: usize,
    /// Width of one head (Qwen3 sets it explicitly; others default to hidden/heads).
    pub head_dim: usize,
    /// Epsilon of every RMSNorm.
    pub rms_norm_eps: f64,
    /// RoPE base.
    pub rope_theta: f64,
    /// RoPE frequency scaling.
    pub rope_scaling: RopeScaling,
    /// Longest context the model supports (positions are rejected beyond it).
    pub max_position_embeddings: usize,
    /// LM head shares the embedding matrix.
    pub tie_word_embeddings: bool,
    /// q/k/v projections carry a bias (Qwen2; Llama's `attention_bias`).
    pub attention_bias: bool,
    /// o_proj carries a bias (Llama's `attention_bias` applies to it too).
    pub o_proj_bias: bool,
    /// MLP projections carry a bias (Llama's `mlp_bias`).
    pub mlp_bias: bool,
    /// Per-head RMSNorm on q and k before RoPE (Qwen3).
    pub qk_norm: bool,
    /// Sliding-window attention span, if the model uses one on every layer (Mistral).
    pub sliding_window: Option<usize>,
    /// Storage dtype of the weights (`torch_dtype` / `dtype`).
    pub dtype: DType,
    /// Beginning-of-sequence token, if the config names one.
    pub bos_token_id: Option<u32>,
    /// End-of-sequence tokens named by the config (generation_config.json may add more).
    pub eos_token_ids: Vec<u32>,
}

impl ModelConfig {
    /// Query heads per key/value head.
    pub fn gqa_group(&self) -> usize {
        self.num_attention_heads / self.num_key_value_heads
    }

    /// Width of the concatenated query projection.
    pub fn q_dim(&self) -> usize {
        self.num_attention_heads * self.head_dim
    }

    /// Width of the concatenated key (or value) projection.
    pub fn kv_dim(&self) -> usize {
        self.num_key_value_heads * self.head_dim
    }
}

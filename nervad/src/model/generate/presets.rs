//! Checkpoint presets: tiny ones for CI and the real layer shapes of public models.

use crate::model::config::{Architecture, DType, ModelConfig, RopeScaling};

/// A checkpoint shape the generator can write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, clap::ValueEnum)]
pub enum Preset {
    /// Qwen3 (QK-norm, explicit head_dim ≠ hidden/heads), tied, 2 layers: seconds on CI.
    Tiny,
    /// Llama with Llama-3 rope scaling, untied.
    TinyLlama,
    /// Qwen2 with q/k/v biases, tied.
    TinyQwen2,
    /// Mistral with a 32-token sliding window, untied.
    TinyMistral,
    /// Qwen3-0.6B shapes (~1.2 GB in bf16).
    #[value(name = "qwen3-0.6b")]
    Qwen3_0_6b,
    /// Qwen3-8B shapes (~16 GB in bf16).
    #[value(name = "qwen3-8b")]
    Qwen3_8b,
    /// Llama-3.2-1B shapes (~2.5 GB in bf16).
    #[value(name = "llama3-1b")]
    Llama3_1b,
    /// Qwen2.5-0.5B shapes (~1 GB in bf16).
    #[value(name = "qwen2.5-0.5b")]
    Qwen2_5_0_5b,
}

/// Tokenizer and chat conventions of a model family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// ChatML, `<|endoftext|>` / `<|im_start|>` / `<|im_end|>`.
    Qwen,
    /// Llama 3 headers, `<|begin_of_text|>` … `<|eot_id|>`.
    Llama3,
    /// `[INST]` … `[/INST]`, `<s>` / `</s>`.
    Mistral,
}

impl Family {
    /// Special tokens, in id order at the end of the vocabulary.
    pub fn special_tokens(self) -> &'static [&'static str] {
        match self {
            Family::Qwen => &["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
            Family::Llama3 => &[
                "<|begin_of_text|>",
                "<|end_of_text|>",
                "<|start_header_id|>",
                "<|end_header_id|>",
                "<|eot_id|>",
            ],
            Family::Mistral => &["<unk>", "<s>", "</s>", "[INST]", "[/INST]"],
        }
    }
}

impl Preset {
    /// Every preset.
    pub const ALL: [Preset; 8] = [
        Preset::Tiny,
        Preset::TinyLlama,
        Preset::TinyQwen2,
        Preset::TinyMistral,
        Preset::Qwen3_0_6b,
        Preset::Qwen3_8b,
        Preset::Llama3_1b,
        Preset::Qwen2_5_0_5b,
    ];

    /// The tiny presets (one per architecture), cheap enough for every test run.
    pub const TINY: [Preset; 4] = [
        Preset::Tiny,
        Preset::TinyLlama,
        Preset::TinyQwen2,
        Preset::TinyMistral,
    ];

    /// The command-line name.
    pub fn name(self) -> &'static str {
        match self {
            Preset::Tiny => "tiny",
            Preset::TinyLlama => "tiny-llama",
            Preset::TinyQwen2 => "tiny-qwen2",
            Preset::TinyMistral => "tiny-mistral",
            Preset::Qwen3_0_6b => "qwen3-0.6b",
            Preset::Qwen3_8b => "qwen3-8b",
            Preset::Llama3_1b => "llama3-1b",
            Preset::Qwen2_5_0_5b => "qwen2.5-0.5b",
        }
    }

    /// Parse a command-line name.
    pub fn from_name(name: &str) -> Option<Preset> {
        Preset::ALL.into_iter().find(|p| p.name() == name)
    }

    /// Tokenizer and chat conventions.
    pub fn family(self) -> Family {
        match self.architecture() {
            Architecture::Qwen3 | Architecture::Qwen2 => Family::Qwen,
            Architecture::Llama => Family::Llama3,
            Architecture::Mistral => Family::Mistral,
        }
    }

    fn architecture(self) -> Architecture {
        match self {
            Preset::Tiny | Preset::Qwen3_0_6b | Preset::Qwen3_8b => Architecture::Qwen3,
            Preset::TinyLlama | Preset::Llama3_1b => Architecture::Llama,
            Preset::TinyQwen2 | Preset::Qwen2_5_0_5b => Architecture::Qwen2,
            Preset::TinyMistral => Architecture::Mistral,
        }
    }

    /// The storage dtype written unless overridden (bf16, like the released models).
    pub fn default_dtype(self) -> DType {
        DType::BF16
    }

    /// The model configuration (special-token ids filled in from the family's tokenizer layout).
    pub fn config(self, dtype: DType) -> ModelConfig {
        #[allow(clippy::type_complexity)]
        let (vocab, hidden, layers, heads, kv, head_dim, inter, tied, theta, eps, max_pos): (
            usize, usize, usize, usize, usize, usize, usize, bool, f64, f64, usize,
        ) = match self {
            Preset::Tiny => (1024, 64, 2, 4, 2, 32, 192, true, 1e6, 1e-6, 4096),
            Preset::TinyLlama => (1024, 64, 2, 4, 2, 16, 160, false, 500_000.0, 1e-5, 8192),
            Preset::TinyQwen2 => (1024, 64, 2, 4, 2, 16, 160, true, 1e6, 1e-6, 4096),
            Preset::TinyMistral => (1024, 64, 2, 4, 2, 16, 160, false, 1e6, 1e-5, 4096),
            Preset::Qwen3_0_6b => (151_936, 1024, 28, 16, 8, 128, 3072, true, 1e6, 1e-6, 40_960),
            Preset::Qwen3_8b => (151_936, 4096, 36, 32, 8, 128, 12_288, false, 1e6, 1e-6, 40_960),
            Preset::Llama3_1b => (128_256, 2048, 16, 32, 8, 64, 8192, true, 500_000.0, 1e-5, 131_072),
            Preset::Qwen2_5_0_5b => (151_936, 896, 24, 14, 2, 64, 4864, true, 1e6, 1e-6, 32_768),
        };
        let architecture = self.architecture();
        let rope_scaling = match self {
            Preset::Llama3_1b => RopeScaling::Llama3 {
                factor: 32.0,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_max_position_embeddings: 8192,
            },
            // Short original context so the scaled band covers wavelengths a test reaches.
            Preset::TinyLlama => RopeScaling::Llama3 {
                factor: 8.0,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_max_position_embeddings: 256,
            },
            _ => RopeScaling::None,
        };
        let specials = self.family().special_tokens();
        let first_special = (vocab - specials.len()) as u32;
        let id_of = |token: &str| {
            specials
                .iter()
                .position(|t| *t == token)
                .map(|i| first_special + i as u32)
        };
        let (bos, eos) = match self.family() {
            Family::Qwen => (id_of("<|endoftext|>"), id_of("<|im_end|>")),
            Family::Llama3 => (id_of("<|begin_of_text|>"), id_of("<|end_of_text|>")),
            Family::Mistral => (id_of("<s>"), id_of("</s>")),
        };
        ModelConfig {
            architecture,
            vocab_size: vocab,
            hidden_size: hidden,
            intermediate_size: inter,
            num_hidden_layers: layers,
            num_attention_heads: heads,
            num_key_value_heads: kv,
            head_dim,
            rms_norm_eps: eps,
            rope_theta: theta,
            rope_scaling,
            max_position_embeddings: max_pos,
            tie_word_embeddings: tied,
            attention_bias: architecture == Architecture::Qwen2,
            o_proj_bias: false,
            mlp_bias: false,
            qk_norm: architecture == Architecture::Qwen3,
            sliding_window: (architecture == Architecture::Mistral).then_some(32),
            dtype,
            bos_token_id: bos,
            eos_token_ids: eos.into_iter().collect(),
        }
    }
}

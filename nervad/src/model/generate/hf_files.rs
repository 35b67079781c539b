//! The JSON files of a Hugging Face snapshot, written the way transformers writes them for the
//! real models these presets imitate.

use serde_json::{Value, json};

use super::presets::Family;
use crate::model::config::{Architecture, ModelConfig, RopeScaling};

/// ChatML as used by Qwen (plain: no default system prompt, like Qwen3).
pub const CHATML_TEMPLATE: &str = "{%- for message in messages %}
{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}
{%- endfor %}
{%- if add_generation_prompt %}
{{- '<|im_start|>assistant\\n' }}
{%- endif %}
";

/// ChatML with Qwen2.5's default system prompt.
pub const QWEN2_TEMPLATE: &str = "{%- if messages[0]['role'] != 'system' %}
{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}
{%- endfor %}
{%- if add_generation_prompt %}
{{- '<|im_start|>assistant\\n' }}
{%- endif %}
";

/// Llama 3 header format.
pub const LLAMA3_TEMPLATE: &str = "{{- bos_token }}
{%- for message in messages %}
{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}
{%- endfor %}
{%- if add_generation_prompt %}
{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
";

/// Mistral `[INST]` format; refuses roles it cannot express, like the original.
pub const MISTRAL_TEMPLATE: &str = "{{- bos_token }}
{%- for message in messages %}
{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
{{- raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}
{%- endif %}
{%- if message['role'] == 'user' %}
{{- '[INST] ' + message['content'] + ' [/INST]' }}
{%- elif message['role'] == 'assistant' %}
{{- message['content'] + eos_token }}
{%- else %}
{{- raise_exception('Only user and assistant roles are supported!') }}
{%- endif %}
{%- endfor %}
";

/// `config.json`.
pub fn config_json(config: &ModelConfig) -> Value {
    let rope_scaling = match config.rope_scaling {
        RopeScaling::None => Value::Null,
        RopeScaling::Linear { factor } => json!({ "rope_type": "linear", "factor": factor }),
        RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings,
        } => json!({
            "rope_type": "llama3",
            "factor": factor,
            "low_freq_factor": low_freq_factor,
            "high_freq_factor": high_freq_factor,
            "original_max_position_embeddings": original_max_position_embeddings,
        }),
    };
    let eos = match config.eos_token_ids.as_slice() {
        [one] => json!(one),
        many => json!(many),
    };
    let mut v = json!({
        "architectures": [config.architecture.hf_class()],
        "model_type": config.architecture.hf_model_type(),
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": config.num_hidden_layers,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_key_value_heads,
        "hidden_act": "silu",
        "max_position_embeddings": config.max_position_embeddings,
        "rms_norm_eps": config.rms_norm_eps,
        "rope_theta": config.rope_theta,
        "rope_scaling": rope_scaling,
        "tie_word_embeddings": config.tie_word_embeddings,
        "torch_dtype": config.dtype.hf_name(),
        "bos_token_id": config.bos_token_id,
        "eos_token_id": eos,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "use_cache": true,
    });
    let obj = v.as_object_mut().expect("json! object literal");
    match config.architecture {
        Architecture::Qwen3 => {
            obj.insert("head_dim".into(), json!(config.head_dim));
            obj.insert("attention_bias".into(), json!(config.attention_bias));
            obj.insert("use_sliding_window".into(), json!(false));
            obj.insert("sliding_window".into(), Value::Null);
            obj.insert("max_window_layers".into(), json!(config.num_hidden_layers));
        }
        Architecture::Llama => {
            obj.insert("head_dim".into(), json!(config.head_dim));
            obj.insert("attention_bias".into(), json!(config.attention_bias));
            obj.insert("mlp_bias".into(), json!(config.mlp_bias));
            obj.insert("pretraining_tp".into(), json!(1));
        }
        Architecture::Qwen2 => {
            // Qwen2 derives head_dim from hidden/heads; the released configs do not name it.
            obj.insert("use_sliding_window".into(), json!(false));
            obj.insert(
                "sliding_window".into(),
                json!(config.max_position_embeddings),
            );
            obj.insert("max_window_layers".into(), json!(config.num_hidden_layers));
        }
        Architecture::Mistral => {
            obj.insert("head_dim".into(), json!(config.head_dim));
            obj.insert("sliding_window".into(), json!(config.sliding_window));
        }
    }
    v
}

/// `tokenizer_config.json`. `first_special` is the id of the family's first special token.
pub fn tokenizer_config_json(
    family: Family,
    first_special: u32,
    template: &str,
    max_len: usize,
) -> Value {
    let specials = family.special_tokens();
    let added: serde_json::Map<String, Value> = specials
        .iter()
        .enumerate()
        .map(|(i, t)| {
            (
                (first_special + i as u32).to_string(),
                json!({
                    "content": t,
                    "lstrip": false,
                    "normalized": false,
                    "rstrip": false,
                    "single_word": false,
                    "special": true,
                }),
            )
        })
        .collect();
    let (bos, eos, pad, unk): (Value, &str, &str, Value) = match family {
        Family::Qwen => (Value::Null, "<|im_end|>", "<|endoftext|>", Value::Null),
        Family::Llama3 => (
            json!("<|begin_of_text|>"),
            "<|eot_id|>",
            "<|end_of_text|>",
            Value::Null,
        ),
        Family::Mistral => (json!("<s>"), "</s>", "</s>", json!("<unk>")),
    };
    json!({
        "added_tokens_decoder": added,
        "bos_token": bos,
        "eos_token": eos,
        "pad_token": pad,
        "unk_token": unk,
        "chat_template": template,
        "clean_up_tokenization_spaces": false,
        "model_max_length": max_len,
        "tokenizer_class": "PreTrainedTokenizerFast",
    })
}

/// `generation_config.json`, with the sampling defaults the imitated models ship.
pub fn generation_config_json(family: Family, config: &ModelConfig, first_special: u32) -> Value {
    let id = |token: &str| {
        family
            .special_tokens()
            .iter()
            .position(|t| *t == token)
            .map(|i| first_special + i as u32)
    };
    match family {
        Family::Qwen => json!({
            "bos_token_id": id("<|endoftext|>"),
            "eos_token_id": [id("<|im_end|>"), id("<|endoftext|>")],
            "pad_token_id": id("<|endoftext|>"),
            "do_sample": true,
            "temperature": 0.6,
            "top_k": 20,
            "top_p": 0.95,
        }),
        Family::Llama3 => json!({
            "bos_token_id": config.bos_token_id,
            "eos_token_id": [id("<|end_of_text|>"), id("<|eot_id|>")],
            "do_sample": true,
            "temperature": 0.6,
            "top_p": 0.9,
        }),
        Family::Mistral => json!({
            "bos_token_id": config.bos_token_id,
            "eos_token_id": id("</s>"),
        }),
    }
}

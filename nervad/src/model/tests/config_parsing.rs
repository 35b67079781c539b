use crate::model::config::{Architecture, DType, ModelConfig, RopeScaling};
use crate::model::error::ModelError;

fn parse(text: &str) -> Result<ModelConfig, ModelError> {
    ModelConfig::from_json_str(text).map(|p| p.config)
}

#[test]
fn qwen3_0_6b() {
    let c = parse(include_str!("fixtures/qwen3-0.6b.json")).unwrap();
    assert_eq!(c.architecture, Architecture::Qwen3);
    assert_eq!(
        (c.hidden_size, c.num_hidden_layers, c.intermediate_size),
        (1024, 28, 3072)
    );
    assert_eq!(
        (c.num_attention_heads, c.num_key_value_heads, c.head_dim),
        (16, 8, 128)
    );
    assert_eq!(
        c.q_dim(),
        2048,
        "Qwen3's head_dim is explicit, not hidden/heads"
    );
    assert_eq!(c.vocab_size, 151_936);
    assert!(c.tie_word_embeddings && c.qk_norm);
    assert!(!c.attention_bias && !c.o_proj_bias && !c.mlp_bias);
    assert_eq!(c.rope_theta, 1e6);
    assert_eq!(c.rope_scaling, RopeScaling::None);
    assert_eq!(c.rms_norm_eps, 1e-6);
    assert_eq!(c.max_position_embeddings, 40_960);
    assert_eq!(c.sliding_window, None);
    assert_eq!(c.dtype, DType::BF16);
    assert_eq!(c.bos_token_id, Some(151_643));
    assert_eq!(c.eos_token_ids, vec![151_645]);
}

#[test]
fn llama_3_2_1b_with_llama3_rope() {
    let c = parse(include_str!("fixtures/llama-3.2-1b.json")).unwrap();
    assert_eq!(c.architecture, Architecture::Llama);
    assert_eq!(
        (c.hidden_size, c.num_hidden_layers, c.head_dim),
        (2048, 16, 64)
    );
    assert_eq!(c.gqa_group(), 4);
    assert_eq!(
        c.rope_scaling,
        RopeScaling::Llama3 {
            factor: 32.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192
        }
    );
    assert_eq!(c.rope_theta, 500_000.0);
    assert_eq!(c.rms_norm_eps, 1e-5);
    assert!(c.tie_word_embeddings && !c.qk_norm);
}

#[test]
fn transformers5_layout_rope_parameters_and_dtype() {
    let c = parse(include_str!("fixtures/llama-3.1-8b-instruct-tf5.json")).unwrap();
    assert_eq!(
        c.rope_theta, 500_000.0,
        "rope_theta read from rope_parameters"
    );
    assert!(matches!(
        c.rope_scaling,
        RopeScaling::Llama3 { factor: 8.0, .. }
    ));
    assert_eq!(c.dtype, DType::BF16);
    assert_eq!(c.eos_token_ids, vec![128_001, 128_008, 128_009]);
    assert!(!c.tie_word_embeddings);
}

#[test]
fn qwen2_5_has_qkv_bias_and_ignores_disabled_window() {
    let c = parse(include_str!("fixtures/qwen2.5-0.5b.json")).unwrap();
    assert_eq!(c.architecture, Architecture::Qwen2);
    assert_eq!(c.head_dim, 64, "896 / 14");
    assert!(c.attention_bias && !c.o_proj_bias);
    assert_eq!(c.sliding_window, None, "use_sliding_window is false");
    assert_eq!(c.eos_token_ids, vec![151_643]);
}

#[test]
fn mistral_sliding_window_number_or_null() {
    let v1 = parse(include_str!("fixtures/mistral-7b-v0.1.json")).unwrap();
    assert_eq!(v1.architecture, Architecture::Mistral);
    assert_eq!(v1.sliding_window, Some(4096));
    assert_eq!(v1.head_dim, 128);
    let v3 = parse(include_str!("fixtures/mistral-7b-v0.3.json")).unwrap();
    assert_eq!(v3.sliding_window, None);
    assert_eq!(v3.rope_theta, 1e6);
    assert!(!v3.attention_bias && !v3.qk_norm);
}

fn edit(fixture: &str, f: impl FnOnce(&mut serde_json::Map<String, serde_json::Value>)) -> String {
    let mut v: serde_json::Value = serde_json::from_str(fixture).unwrap();
    f(v.as_object_mut().unwrap());
    v.to_string()
}

fn qwen3_with(
    f: impl FnOnce(&mut serde_json::Map<String, serde_json::Value>),
) -> Result<ModelConfig, ModelError> {
    parse(&edit(include_str!("fixtures/qwen3-0.6b.json"), f))
}

#[test]
fn unsupported_things_are_named() {
    use serde_json::json;
    let err = qwen3_with(|c| {
        c.insert("architectures".into(), json!(["GemmaForCausalLM"]));
    })
    .unwrap_err();
    assert!(
        matches!(err, ModelError::UnsupportedArchitecture(ref a) if a == "GemmaForCausalLM"),
        "{err}"
    );
    assert!(err.to_string().contains("GemmaForCausalLM"));

    let err = qwen3_with(|c| {
        c.insert("torch_dtype".into(), json!("float8_e4m3fn"));
    })
    .unwrap_err();
    assert!(err.to_string().contains("float8_e4m3fn"), "{err}");

    let err = qwen3_with(|c| {
        c.insert(
            "rope_scaling".into(),
            json!({"rope_type": "yarn", "factor": 4.0}),
        );
    })
    .unwrap_err();
    assert!(
        matches!(err, ModelError::UnsupportedRope(ref r) if r == "yarn"),
        "{err}"
    );

    let err = qwen3_with(|c| {
        c.insert("hidden_act".into(), json!("gelu_pytorch_tanh"));
    })
    .unwrap_err();
    assert!(err.to_string().contains("gelu_pytorch_tanh"), "{err}");

    let err = qwen3_with(|c| {
        c.insert("use_sliding_window".into(), json!(true));
    })
    .unwrap_err();
    assert!(err.to_string().contains("use_sliding_window"), "{err}");

    let err = qwen3_with(|c| {
        c.insert("quantization_config".into(), json!({"quant_method": "awq"}));
    })
    .unwrap_err();
    assert!(err.to_string().contains("quantiz"), "{err}");
}

#[test]
fn inconsistent_or_missing_dimensions() {
    use serde_json::json;
    let err = qwen3_with(|c| {
        c.insert("num_key_value_heads".into(), json!(5));
    })
    .unwrap_err();
    assert!(err.to_string().contains("num_key_value_heads"), "{err}");

    let err = qwen3_with(|c| {
        c.remove("hidden_size");
    })
    .unwrap_err();
    assert!(err.to_string().contains("hidden_size is missing"), "{err}");

    let err = qwen3_with(|c| {
        c.remove("head_dim");
        c.insert("num_attention_heads".into(), json!(15));
        c.insert("num_key_value_heads".into(), json!(5));
    })
    .unwrap_err();
    assert!(err.to_string().contains("not a multiple"), "{err}");

    let err = qwen3_with(|c| {
        c.insert("eos_token_id".into(), json!(200_000));
    })
    .unwrap_err();
    assert!(err.to_string().contains("eos_token_id 200000"), "{err}");

    let err = qwen3_with(|c| {
        c.insert(
            "rope_scaling".into(),
            json!({"rope_type": "llama3", "factor": 8.0}),
        );
    })
    .unwrap_err();
    assert!(err.to_string().contains("low_freq_factor"), "{err}");

    let err = parse("{\"architectures\": [\"LlamaForCausalLM\"], ").unwrap_err();
    assert!(matches!(err, ModelError::Json { .. }), "{err}");
}

#[test]
fn defaults_and_spellings() {
    use serde_json::json;
    // No head_dim on Qwen2: hidden / heads; legacy `type` key for rope scaling; no dtype.
    let c = parse(&edit(include_str!("fixtures/qwen2.5-0.5b.json"), |c| {
        c.insert(
            "rope_scaling".into(),
            json!({"type": "linear", "factor": 2.0}),
        );
        c.remove("torch_dtype");
        c.remove("num_key_value_heads");
    }))
    .unwrap();
    assert_eq!(c.rope_scaling, RopeScaling::Linear { factor: 2.0 });
    assert_eq!(c.num_key_value_heads, c.num_attention_heads);
    let parsed =
        ModelConfig::from_json_str(&edit(include_str!("fixtures/qwen2.5-0.5b.json"), |c| {
            c.remove("torch_dtype");
        }))
        .unwrap();
    assert!(!parsed.dtype_given);
    let c = qwen3_with(|c| {
        c.insert("torch_dtype".into(), json!("torch.float16"));
        c.insert(
            "rope_parameters".into(),
            json!({"rope_type": "default", "rope_theta": 5e5}),
        );
    })
    .unwrap();
    assert_eq!(c.dtype, DType::F16);
    assert_eq!(c.rope_theta, 5e5);
}

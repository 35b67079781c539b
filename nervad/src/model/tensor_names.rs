//! The tensors a configuration implies: names exactly as transformers writes them, with shapes.
//!
//! One list serves both the loader (what to look for and check) and the checkpoint generator
//! (what to write), so the two cannot drift apart.

use super::config::ModelConfig;

/// What a tensor is, which decides how the generator initializes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TensorRole {
    /// Token embedding (or an untied LM head): rows are token vectors.
    Embedding,
    /// A projection weight `[out, in]`; `fan_in` is `in`.
    Projection {
        /// Input width.
        fan_in: usize,
    },
    /// A bias vector.
    Bias,
    /// An RMSNorm weight.
    Norm,
}

/// One expected tensor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorSpec {
    /// Full name, e.g. `model.layers.3.self_attn.q_proj.weight`.
    pub name: String,
    /// Row-major shape.
    pub shape: Vec<usize>,
    /// How it is used.
    pub role: TensorRole,
}

fn spec(name: String, shape: Vec<usize>, role: TensorRole) -> TensorSpec {
    TensorSpec { name, shape, role }
}

/// Name prefix of decoder layer `layer`.
pub fn layer_prefix(layer: usize) -> String {
    format!("model.layers.{layer}")
}

fn projection(out: &mut Vec<TensorSpec>, prefix: &str, rows: usize, cols: usize, bias: bool) {
    out.push(spec(
        format!("{prefix}.weight"),
        vec![rows, cols],
        TensorRole::Projection { fan_in: cols },
    ));
    if bias {
        out.push(spec(format!("{prefix}.bias"), vec![rows], TensorRole::Bias));
    }
}

/// Every tensor `config` requires, in the order transformers' module tree lists them.
/// `lm_head.weight` is absent when the embeddings are tied (transformers does not save it).
pub fn expected_tensors(config: &ModelConfig) -> Vec<TensorSpec> {
    let h = config.hidden_size;
    let inter = config.intermediate_size;
    let (q, kv) = (config.q_dim(), config.kv_dim());
    let mut out = vec![spec(
        "model.embed_tokens.weight".into(),
        vec![config.vocab_size, h],
        TensorRole::Embedding,
    )];
    for layer in 0..config.num_hidden_layers {
        let p = layer_prefix(layer);
        out.push(spec(
            format!("{p}.input_layernorm.weight"),
            vec![h],
            TensorRole::Norm,
        ));
        projection(
            &mut out,
            &format!("{p}.self_attn.q_proj"),
            q,
            h,
            config.attention_bias,
        );
        projection(
            &mut out,
            &format!("{p}.self_attn.k_proj"),
            kv,
            h,
            config.attention_bias,
        );
        projection(
            &mut out,
            &format!("{p}.self_attn.v_proj"),
            kv,
            h,
            config.attention_bias,
        );
        projection(
            &mut out,
            &format!("{p}.self_attn.o_proj"),
            h,
            q,
            config.o_proj_bias,
        );
        if config.qk_norm {
            out.push(spec(
                format!("{p}.self_attn.q_norm.weight"),
                vec![config.head_dim],
                TensorRole::Norm,
            ));
            out.push(spec(
                format!("{p}.self_attn.k_norm.weight"),
                vec![config.head_dim],
                TensorRole::Norm,
            ));
        }
        out.push(spec(
            format!("{p}.post_attention_layernorm.weight"),
            vec![h],
            TensorRole::Norm,
        ));
        projection(
            &mut out,
            &format!("{p}.mlp.gate_proj"),
            inter,
            h,
            config.mlp_bias,
        );
        projection(
            &mut out,
            &format!("{p}.mlp.up_proj"),
            inter,
            h,
            config.mlp_bias,
        );
        projection(
            &mut out,
            &format!("{p}.mlp.down_proj"),
            h,
            inter,
            config.mlp_bias,
        );
    }
    out.push(spec("model.norm.weight".into(), vec![h], TensorRole::Norm));
    if !config.tie_word_embeddings {
        out.push(spec(
            "lm_head.weight".into(),
            vec![config.vocab_size, h],
            TensorRole::Embedding,
        ));
    }
    out
}

/// Total bytes of `expected_tensors(config)` stored as `config.dtype`.
pub fn checkpoint_bytes(config: &ModelConfig) -> u64 {
    expected_tensors(config)
        .iter()
        .map(|t| t.shape.iter().product::<usize>() as u64 * config.dtype.size() as u64)
        .sum()
}

use std::collections::BTreeMap;

use super::{TempDir, shared_checkpoint};
use crate::model::config::DType;
use crate::model::generate::{GeneratedTensor, Preset, make_checkpoint, write_weights};
use crate::model::loaded::LoadedModel;
use crate::model::safetensors_loader::{LoadOptions, all_tensors, load_weights};
use crate::model::tensor_names::expected_tensors;

const FILES: [&str; 5] = [
    "config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "generation_config.json",
];

#[test]
fn every_tiny_preset_round_trips() {
    for preset in Preset::TINY {
        let dir = shared_checkpoint(preset);
        let model = LoadedModel::load(&dir).unwrap_or_else(|e| panic!("{}: {e}", preset.name()));
        let expected = preset.config(DType::BF16);
        assert_eq!(model.config, expected, "{}", preset.name());
        assert_eq!(
            model.tokenizer.len(),
            expected.vocab_size,
            "every id has a token"
        );
        assert_eq!(model.weights.layers.len(), expected.num_hidden_layers);
        assert_eq!(model.weights_report.files, 1);
        assert!(model.weights_report.ignored_tensors.is_empty());
        assert_eq!(model.weights_report.realigned_tensors, 0);
        // Tied presets share the embedding view; untied ones have their own head.
        let head_is_embed =
            model.weights.lm_head.bytes().as_ptr() == model.weights.embed_tokens.bytes().as_ptr();
        assert_eq!(
            head_is_embed,
            expected.tie_word_embeddings,
            "{}",
            preset.name()
        );
        for t in all_tensors(&model.weights) {
            assert_eq!(t.dtype(), DType::BF16);
            assert!(t.to_f32_vec().iter().all(|v| v.is_finite()));
        }
        // Biases exist exactly where the architecture has them, and are non-zero.
        let q = &model.weights.layers[0].self_attn.q_proj;
        assert_eq!(q.bias.is_some(), expected.attention_bias);
        if let Some(b) = &q.bias {
            assert!(b.to_f32_vec().iter().any(|v| v.abs() > 0.01));
        }
        assert_eq!(
            model.weights.layers[0].self_attn.q_norm.is_some(),
            expected.qk_norm
        );
        // eos: generation_config first; always non-empty and inside the vocabulary.
        let eos = model.eos_token_ids();
        assert!(!eos.is_empty());
        assert!(
            eos.iter()
                .all(|&id| (id as usize) < expected.vocab_size && model.tokenizer.is_special(id))
        );
        let template = model
            .chat_template
            .as_ref()
            .expect("every preset has a chat template");
        let text = template
            .render(r#"[{"role":"user","content":"Hello"}]"#, true)
            .unwrap();
        assert!(text.contains("Hello"));
        let ids = model.tokenizer.encode(&text, false).unwrap();
        assert!(!ids.is_empty());
    }
}

#[test]
fn weights_are_well_spread() {
    let model = LoadedModel::load(&shared_checkpoint(Preset::Tiny)).unwrap();
    let embed = model.weights.embed_tokens.to_f32_vec();
    let n = embed.len() as f64;
    let mean = embed.iter().map(|&v| f64::from(v)).sum::<f64>() / n;
    let var = embed
        .iter()
        .map(|&v| (f64::from(v) - mean).powi(2))
        .sum::<f64>()
        / n;
    assert!(
        mean.abs() < 0.02 && (var - 1.0).abs() < 0.05,
        "embeddings ~ N(0,1): mean {mean} var {var}"
    );
    let norm = model.weights.layers[0].input_layernorm.to_f32_vec();
    assert!(norm.iter().all(|v| (v - 1.0).abs() < 0.3) && norm.iter().any(|v| *v != 1.0));
}

fn read_all(dir: &std::path::Path) -> Vec<Vec<u8>> {
    FILES
        .iter()
        .map(|f| std::fs::read(dir.join(f)).unwrap())
        .collect()
}

#[test]
fn generation_is_deterministic_by_seed() {
    let a = TempDir::new("det-a");
    let b = TempDir::new("det-b");
    let c = TempDir::new("det-c");
    for preset in [Preset::Tiny, Preset::TinyLlama] {
        let (da, db, dc) = (
            a.path().join(preset.name()),
            b.path().join(preset.name()),
            c.path().join(preset.name()),
        );
        make_checkpoint(preset, &da, 11, None).unwrap();
        make_checkpoint(preset, &db, 11, None).unwrap();
        make_checkpoint(preset, &dc, 12, None).unwrap();
        let (fa, fb, fc) = (read_all(&da), read_all(&db), read_all(&dc));
        for (i, file) in FILES.iter().enumerate() {
            assert!(
                fa[i] == fb[i],
                "same seed → identical {file} ({})",
                preset.name()
            );
        }
        assert!(fa[1] != fc[1], "another seed → other weights");
        assert!(
            fa[2] == fc[2],
            "the tokenizer does not depend on the weight seed"
        );
    }
}

#[test]
fn dtype_override_is_respected() {
    let dir = TempDir::new("dtype");
    for dtype in [DType::F32, DType::F16] {
        let out = dir.path().join(format!("{dtype:?}"));
        let summary = make_checkpoint(Preset::TinyQwen2, &out, 3, Some(dtype)).unwrap();
        assert_eq!(summary.dtype, dtype);
        let model = LoadedModel::load(&out).unwrap();
        assert_eq!(model.config.dtype, dtype);
        assert!(
            all_tensors(&model.weights)
                .iter()
                .all(|t| t.dtype() == dtype)
        );
    }
}

#[test]
fn refuses_to_overwrite() {
    let dir = TempDir::new("overwrite");
    std::fs::write(dir.path().join("keep.txt"), b"x").unwrap();
    let err = make_checkpoint(Preset::Tiny, dir.path(), 0, None).unwrap_err();
    assert!(err.to_string().contains("not an empty directory"), "{err}");
    assert!(dir.path().join("keep.txt").is_file());
}

#[test]
fn sharded_checkpoint_with_index_loads() {
    let dir = TempDir::new("sharded");
    let config = Preset::Tiny.config(DType::F32);
    // Generate into a normal checkpoint, then replace the weights by small shards.
    make_checkpoint(Preset::Tiny, &dir.path().join("m"), 5, Some(DType::F32)).unwrap();
    let m = dir.path().join("m");
    std::fs::remove_file(m.join("model.safetensors")).unwrap();
    let tensors = expected_tensors(&config)
        .into_iter()
        .map(|s| GeneratedTensor::new(s, DType::F32, 5))
        .collect();
    let meta = BTreeMap::from([("format".to_string(), "pt".to_string())]);
    let written = write_weights(&m, tensors, 100_000, &meta).unwrap();
    assert!(written.files.len() > 2);
    assert!(m.join("model.safetensors.index.json").is_file());
    let sharded = LoadedModel::load(&m).unwrap();
    assert_eq!(sharded.weights_report.files, written.files.len());
    let single_dir = dir.path().join("single");
    make_checkpoint(Preset::Tiny, &single_dir, 5, Some(DType::F32)).unwrap();
    let single = LoadedModel::load(&single_dir).unwrap();
    for (a, b) in all_tensors(&sharded.weights)
        .iter()
        .zip(all_tensors(&single.weights))
    {
        assert_eq!(a.bytes(), b.bytes(), "sharding does not change values");
    }
}

#[test]
fn misaligned_data_is_copied_and_counted() {
    let src = shared_checkpoint(Preset::TinyMistral);
    let dir = super::copy_snapshot(&src, "misaligned");
    let path = dir.path().join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    // One extra space in the header shifts every tensor by one byte.
    let mut shifted = Vec::with_capacity(bytes.len() + 1);
    shifted.extend_from_slice(&(n as u64 + 1).to_le_bytes());
    shifted.extend_from_slice(&bytes[8..8 + n]);
    shifted.push(b' ');
    shifted.extend_from_slice(&bytes[8 + n..]);
    std::fs::write(&path, shifted).unwrap();
    let config = Preset::TinyMistral.config(DType::BF16);
    let (weights, report) = load_weights(dir.path(), &config, LoadOptions::default()).unwrap();
    assert_eq!(report.realigned_tensors, expected_tensors(&config).len());
    let (aligned, _) = load_weights(&src, &config, LoadOptions::default()).unwrap();
    for (a, b) in all_tensors(&weights).iter().zip(all_tensors(&aligned)) {
        assert_eq!(a.bytes(), b.bytes());
    }
}

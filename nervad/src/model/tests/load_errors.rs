use std::collections::HashMap;

use safetensors::tensor::{Dtype, TensorView};

use super::{copy_snapshot, shared_checkpoint};
use crate::model::error::ModelError;
use crate::model::generate::Preset;
use crate::model::loaded::LoadedModel;

/// Rewrite `model.safetensors` of `dir` through `edit(name, dtype, shape, data)`; returning
/// `None` drops the tensor.
fn rewrite(
    dir: &std::path::Path,
    edit: impl Fn(&str, Dtype, Vec<usize>, Vec<u8>) -> Option<(Dtype, Vec<usize>, Vec<u8>)>,
) {
    let path = dir.join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let owned: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = st
        .tensors()
        .into_iter()
        .filter_map(|(name, view)| {
            edit(
                &name,
                view.dtype(),
                view.shape().to_vec(),
                view.data().to_vec(),
            )
            .map(|(d, s, b)| (name, d, s, b))
        })
        .collect();
    let views: Vec<(String, TensorView<'_>)> = owned
        .iter()
        .map(|(n, d, s, b)| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap()))
        .collect();
    let meta = HashMap::from([("format".to_string(), "pt".to_string())]);
    safetensors::serialize_to_file(views, Some(meta), &path).unwrap();
}

fn load_err(dir: &std::path::Path) -> ModelError {
    LoadedModel::load(dir).expect_err("loading must fail")
}

#[test]
fn missing_tensor() {
    let dir = copy_snapshot(&shared_checkpoint(Preset::Tiny), "missing-tensor");
    rewrite(dir.path(), |name, d, s, b| {
        (name != "model.layers.1.self_attn.k_norm.weight").then_some((d, s, b))
    });
    let err = load_err(dir.path());
    assert!(
        matches!(err, ModelError::MissingTensor(ref n) if n == "model.layers.1.self_attn.k_norm.weight"),
        "{err}"
    );
}

#[test]
fn wrong_shape() {
    let dir = copy_snapshot(&shared_checkpoint(Preset::TinyLlama), "wrong-shape");
    rewrite(dir.path(), |name, d, s, b| {
        if name == "model.layers.0.mlp.up_proj.weight" {
            // Same bytes, transposed shape.
            Some((d, vec![s[1], s[0]], b))
        } else {
            Some((d, s, b))
        }
    });
    let err = load_err(dir.path());
    let text = err.to_string();
    assert!(matches!(err, ModelError::TensorShape { .. }), "{text}");
    assert!(
        text.contains("model.layers.0.mlp.up_proj.weight") && text.contains("[64, 160]"),
        "{text}"
    );
}

#[test]
fn unsupported_tensor_dtype() {
    let dir = copy_snapshot(&shared_checkpoint(Preset::TinyQwen2), "bad-dtype");
    rewrite(dir.path(), |name, d, s, b| {
        if name == "model.norm.weight" {
            // Same byte count as BF16 × 64: reinterpret as I16.
            Some((Dtype::I16, s, b))
        } else {
            Some((d, s, b))
        }
    });
    let err = load_err(dir.path());
    assert!(
        err.to_string().contains("model.norm.weight") && err.to_string().contains("I16"),
        "{err}"
    );
}

#[test]
fn extra_layer_is_an_error_and_unknown_tensor_a_warning() {
    let dir = copy_snapshot(&shared_checkpoint(Preset::Tiny), "extra");
    rewrite(dir.path(), |_, d, s, b| Some((d, s, b)));
    // Add tensors by rewriting with a duplicate under other names.
    let path = dir.path().join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let norm = st.tensor("model.norm.weight").unwrap();
    let mut views: Vec<(String, TensorView<'_>)> = st.tensors();
    views.push(("vision_tower.proj.weight".into(), norm.clone()));
    let meta = HashMap::from([("format".to_string(), "pt".to_string())]);
    let bytes_ok = safetensors::serialize(views.clone(), Some(meta.clone())).unwrap();
    std::fs::write(&path, &bytes_ok).unwrap();
    let model = LoadedModel::load(dir.path()).unwrap();
    assert_eq!(
        model.weights_report.ignored_tensors,
        vec!["vision_tower.proj.weight".to_string()]
    );

    views.push(("model.layers.2.input_layernorm.weight".into(), norm));
    let bytes_bad = safetensors::serialize(views, Some(meta)).unwrap();
    std::fs::write(&path, &bytes_bad).unwrap();
    let err = load_err(dir.path());
    assert!(matches!(err, ModelError::UnexpectedTensor { .. }), "{err}");
    assert!(err.to_string().contains("num_hidden_layers = 2"), "{err}");
}

#[test]
fn truncated_file_and_header() {
    let dir = copy_snapshot(&shared_checkpoint(Preset::Tiny), "truncated");
    let path = dir.path().join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() - 10]).unwrap();
    let err = load_err(dir.path());
    assert!(matches!(err, ModelError::Safetensors { .. }), "{err}");
    assert!(err.to_string().contains("model.safetensors"), "{err}");
    std::fs::write(&path, &bytes[..100]).unwrap();
    assert!(matches!(
        load_err(dir.path()),
        ModelError::Safetensors { .. }
    ));
    std::fs::write(&path, &bytes[..5]).unwrap();
    assert!(matches!(
        load_err(dir.path()),
        ModelError::Safetensors { .. }
    ));
}

#[test]
fn missing_files_are_named() {
    let src = shared_checkpoint(Preset::TinyMistral);
    for (file, what) in [
        ("tokenizer.json", "tokenizer"),
        ("model.safetensors", "weights"),
        ("config.json", "configuration"),
    ] {
        let dir = copy_snapshot(&src, "missing-file");
        std::fs::remove_file(dir.path().join(file)).unwrap();
        let err = load_err(dir.path());
        let text = err.to_string();
        assert!(matches!(err, ModelError::MissingFile { .. }), "{text}");
        assert!(text.contains(file) && text.contains(what), "{text}");
    }
    let err = load_err(std::path::Path::new("/nonexistent/nerva/model"));
    assert!(
        err.to_string().contains("/nonexistent/nerva/model"),
        "{err}"
    );
}

#[test]
fn broken_index_and_tokenizer() {
    let src = shared_checkpoint(Preset::Tiny);
    let dir = copy_snapshot(&src, "index");
    std::fs::write(
        dir.path().join("model.safetensors.index.json"),
        r#"{"metadata": {}, "weight_map": {"model.norm.weight": "../../etc/passwd"}}"#,
    )
    .unwrap();
    let err = load_err(dir.path());
    assert!(
        err.to_string()
            .contains("not a file in the snapshot directory"),
        "{err}"
    );

    let dir = copy_snapshot(&src, "tokenizer");
    std::fs::write(dir.path().join("tokenizer.json"), b"{\"version\": ").unwrap();
    assert!(matches!(load_err(dir.path()), ModelError::Tokenizer(_)));

    let dir = copy_snapshot(&src, "gen-config");
    std::fs::write(
        dir.path().join("generation_config.json"),
        br#"{"eos_token_id": [5, 99999]}"#,
    )
    .unwrap();
    let err = load_err(dir.path());
    assert!(err.to_string().contains("99999"), "{err}");
}

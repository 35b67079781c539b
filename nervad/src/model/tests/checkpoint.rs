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

/// By hand: `NERVA_MAKE_PRESET=qwen3-0.6b NERVA_MAKE_OUT=/tmp/q cargo test -p nervad --lib
/// make_preset_from_env -- --ignored --nocapture` (generation time and size of a real shape).
#[test]
#[ignore = "writes a possibly large checkpoint; run by hand"]
fn make_preset_from_env() {
    let preset = std::env::var("NERVA_MAKE_PRESET").unwrap_or_else(|_| "tiny".into());
    let out = std::env::var("NERVA_MAKE_OUT").expect("set NERVA_MAKE_OUT");
    let seed = std::env::var("NERVA_MAKE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let preset = Preset::from_name(&preset).expect("unknown preset");
    let summary = make_checkpoint(preset, std::path::Path::new(&out), seed, None).unwrap();
    println!("{summary:?}");
    let started = std::time::Instant::now();
    let model = LoadedModel::load(std::path::Path::new(&out)).unwrap();
    println!(
        "loaded in {:?}: {:?}",
        started.elapsed(),
        model.weights_report
    );
}

#[test]
fn ensure_model_generates_once() {
    use crate::model::generate::ensure_model_at;
    let root = TempDir::new("ensure");
    let dir = root.path().join("cache").join("tiny-0");
    assert_eq!(ensure_model_at(&dir, Preset::Tiny, 0).unwrap(), dir);
    let first = std::fs::metadata(dir.join("model.safetensors"))
        .unwrap()
        .modified()
        .unwrap();
    assert_eq!(ensure_model_at(&dir, Preset::Tiny, 0).unwrap(), dir);
    let second = std::fs::metadata(dir.join("model.safetensors"))
        .unwrap()
        .modified()
        .unwrap();
    assert_eq!(
        first, second,
        "an existing snapshot is reused, not regenerated"
    );
    // No staging directories are left behind.
    let leftovers: Vec<_> = std::fs::read_dir(root.path().join("cache"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(leftovers, vec![std::ffi::OsString::from("tiny-0")]);
    LoadedModel::load(&dir).unwrap();
}

#[test]
fn make_model_force_replaces_only_snapshots() {
    use crate::model::generate::{MakeModelArgs, run_make_model};
    let root = TempDir::new("force");
    let out = root.path().join("m");
    let args = |seed, force| MakeModelArgs {
        preset: Preset::TinyQwen2,
        out: out.clone(),
        seed,
        dtype: None,
        force,
    };
    run_make_model(args(1, false)).unwrap();
    let before = std::fs::read(out.join("model.safetensors")).unwrap();
    let err = run_make_model(args(2, false)).unwrap_err();
    assert!(err.to_string().contains("--force"), "{err}");
    run_make_model(args(2, true)).unwrap();
    assert_ne!(
        std::fs::read(out.join("model.safetensors")).unwrap(),
        before
    );
    // A directory that is not a snapshot is never deleted.
    let other = root.path().join("notes");
    std::fs::create_dir(&other).unwrap();
    std::fs::write(other.join("important.txt"), b"keep").unwrap();
    let err = run_make_model(MakeModelArgs {
        out: other.clone(),
        ..args(3, true)
    })
    .unwrap_err();
    assert!(
        err.to_string()
            .contains("does not look like a model snapshot"),
        "{err}"
    );
    assert!(other.join("important.txt").is_file());
}

#[test]
fn preset_names_round_trip() {
    for p in Preset::ALL {
        assert_eq!(Preset::from_name(p.name()), Some(p));
        let config = p.config(DType::BF16);
        // Every preset is a valid config by the same rules that load real snapshots.
        let json = crate::model::generate::config_json_for_tests(&config);
        let parsed = crate::model::config::ModelConfig::from_json_str(&json).unwrap();
        assert_eq!(parsed.config, config, "{}", p.name());
    }
    let q = Preset::Qwen3_8b.config(DType::BF16);
    assert_eq!(
        crate::model::tensor_names::checkpoint_bytes(&q) / 1_000_000_000,
        16
    );
}

#[test]
fn the_demo_model_is_flatter_with_the_same_greedy_tokens() {
    use crate::engine::api::{
        ClientId, EngineEvent, EventSink, GenerateRequest, InferenceEngine, Prompt, RequestKey,
        SamplingParams, StopConditions,
    };
    use crate::engine::{Engine, EngineModel, EngineOptions};
    use crate::model::generate::{DEMO_FINAL_NORM_SCALE, make_checkpoint_scaled};

    let root = TempDir::new("demo");
    let plain = root.path().join("plain");
    let demo = root.path().join("demo");
    make_checkpoint(Preset::Tiny, &plain, 0, None).unwrap();
    make_checkpoint_scaled(Preset::Tiny, &demo, 0, None, DEMO_FINAL_NORM_SCALE).unwrap();
    let p = LoadedModel::load(&plain).unwrap();
    let d = LoadedModel::load(&demo).unwrap();
    // Only the final norm differs, by exactly the factor (a power of two).
    assert_eq!(
        p.weights.embed_tokens.bytes(),
        d.weights.embed_tokens.bytes()
    );
    let (pn, dn) = (p.weights.norm.to_f32_vec(), d.weights.norm.to_f32_vec());
    assert!(
        pn.iter()
            .zip(&dn)
            .all(|(a, b)| *b == *a * DEMO_FINAL_NORM_SCALE as f32)
    );

    struct Tokens(Vec<u32>);
    impl EventSink for Tokens {
        fn emit(&mut self, event: EngineEvent<'_>) {
            if let EngineEvent::Tokens { ids, .. } = event {
                self.0.extend_from_slice(ids);
            }
        }
    }
    let run = |model: LoadedModel, temperature: f32, seeds: &[u64]| -> Vec<Vec<u32>> {
        let options = EngineOptions {
            max_batch: 4,
            kv_budget_bytes: 16 << 20,
            threads: 1,
            ..EngineOptions::default()
        };
        let mut e = Engine::with_cpu_backend(EngineModel::from_loaded(model), options).unwrap();
        seeds
            .iter()
            .map(|&seed| {
                let mut sink = Tokens(Vec::new());
                e.submit(GenerateRequest {
                    key: RequestKey {
                        client: ClientId {
                            slot: 0,
                            generation: 0,
                        },
                        tag: seed,
                    },
                    prompt: Prompt::Text("Once upon a time".into()),
                    // The demo's sampling (nervactl demo): temperature 0.8, top-p 0.95.
                    sampling: SamplingParams {
                        temperature,
                        top_p: 0.95,
                        seed,
                        ..SamplingParams::default()
                    },
                    max_tokens: 24,
                    stop: StopConditions {
                        ignore_eos: true,
                        ..StopConditions::default()
                    },
                    n_samples: 1,
                    priority: 0,
                    received_at: std::time::Instant::now(),
                })
                .unwrap();
                while e.step(&mut sink) {}
                sink.0
            })
            .collect()
    };
    // Logits scaled alike: greedy decoding cannot tell the models apart.
    assert_eq!(
        run(LoadedModel::load(&plain).unwrap(), 0.0, &[1]),
        run(LoadedModel::load(&demo).unwrap(), 0.0, &[1])
    );
    // With the demo's sampling, the plain model's wide logits leave little to sample (its
    // outputs repeat few distinct tokens); the demo model's vary with the seed.
    let distinct = |outs: &[Vec<u32>]| {
        let mut all: Vec<u32> = outs.concat();
        all.sort_unstable();
        all.dedup();
        all.len()
    };
    let seeds = [1, 2, 3, 4];
    let plain_out = run(p, 0.8, &seeds);
    let demo_out = run(d, 0.8, &seeds);
    println!(
        "distinct tokens at temperature 0.8 over {} seeds: plain {}, demo {}",
        seeds.len(),
        distinct(&plain_out),
        distinct(&demo_out)
    );
    let mut unique = demo_out.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), seeds.len(), "every seed its own text");
    assert!(
        distinct(&demo_out) > 2 * distinct(&plain_out),
        "demo {} distinct tokens vs plain {}",
        distinct(&demo_out),
        distinct(&plain_out)
    );
}

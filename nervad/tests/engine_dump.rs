//! `nervad dump` on generated tiny checkpoints of every architecture: files, shapes, and the
//! greedy continuation equal to the argmax of teacher-forced logits.

use nervad::engine::EngineModel;
use nervad::engine::dump::{DumpArgs, dump_model, parse_token_list, run_dump};
use nervad::model::LoadedModel;
use nervad::model::generate::{Preset, make_checkpoint};

fn scratch_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("nerva-engine-dump-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn argmax(row: &[f32]) -> u32 {
    row.iter()
        .enumerate()
        .fold(
            (0, f32::NEG_INFINITY),
            |a, (i, &v)| if v > a.1 { (i, v) } else { a },
        )
        .0 as u32
}

#[test]
fn dump_writes_files_and_greedy_matches_teacher_forcing() {
    let dir = scratch_dir("tiny");
    make_checkpoint(Preset::Tiny, &dir.join("model"), 3, None).unwrap();
    let out = dir.join("out");
    run_dump(DumpArgs {
        model: dir.join("model"),
        tokens: "1, 5,9,42".into(),
        steps: 6,
        out: out.clone(),
        threads: 2,
        backend: nervad::backend::BackendChoice::Cpu,
        device: 0,
        gpu_memory: nervad::backend::cuda::GpuMemory::Fraction(0.5),
        fast_prefill: false,
        projections: Default::default(),
    })
    .unwrap();
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("result.json")).unwrap()).unwrap();
    assert_eq!(json["prompt_tokens"], serde_json::json!([1, 5, 9, 42]));
    assert_eq!(json["positions"], 4);
    let vocab = json["vocab_size"].as_u64().unwrap() as usize;
    let greedy: Vec<u32> = json["greedy_tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect();
    assert_eq!(greedy.len(), 6);
    let bytes = std::fs::read(out.join("logits.f32")).unwrap();
    assert_eq!(bytes.len(), 4 * vocab * 4);
    let last: Vec<f32> = bytes[3 * vocab * 4..]
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    assert_eq!(greedy[0], argmax(&last));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn every_tiny_architecture_runs_through_the_engine() {
    for (i, preset) in [
        Preset::Tiny,
        Preset::TinyLlama,
        Preset::TinyQwen2,
        Preset::TinyMistral,
    ]
    .into_iter()
    .enumerate()
    {
        let dir = scratch_dir(&format!("arch{i}"));
        make_checkpoint(preset, &dir, 11, None).unwrap();
        let prompt: Vec<u32> = (0..40).map(|k| (k * 13 + 7) % 200).collect();
        let loaded = LoadedModel::load(&dir).unwrap();
        let r = dump_model(EngineModel::from_loaded(loaded), &prompt, 8, 2).unwrap();
        assert_eq!(r.greedy_tokens.len(), 8);
        // Teacher-force prompt + continuation: each greedy token is the argmax before it.
        let mut all = prompt.clone();
        all.extend(&r.greedy_tokens);
        let loaded = LoadedModel::load(&dir).unwrap();
        let tf = dump_model(EngineModel::from_loaded(loaded), &all, 0, 2).unwrap();
        let v = tf.vocab_size;
        for (k, &tok) in r.greedy_tokens.iter().enumerate() {
            let pos = prompt.len() - 1 + k;
            assert_eq!(
                tok,
                argmax(&tf.logits[pos * v..(pos + 1) * v]),
                "{preset:?} step {k}"
            );
        }
        assert_eq!(&tf.logits[..prompt.len() * v], &r.logits[..], "{preset:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[test]
fn token_list_parsing() {
    assert_eq!(parse_token_list(" 1,2 ,3,").unwrap(), vec![1, 2, 3]);
    assert!(parse_token_list("1,x").is_err());
    assert!(parse_token_list("").is_err());
}

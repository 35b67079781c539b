use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::shared_checkpoint;
use crate::model::generate::Preset;
use crate::model::tokenizer::{DecoderKind, Tokenizer};

fn check_table(tok: &Tokenizer, sequences: usize) {
    let n = tok.len() as u32;
    for id in 0..n {
        let expected = tok.decode(&[id], false).unwrap();
        assert_eq!(
            String::from_utf8_lossy(tok.token_bytes(id)),
            expected,
            "token {id}"
        );
        assert!(
            !tok.token_bytes(id).is_empty(),
            "token {id} decodes to nothing"
        );
    }
    let mut rng = ChaCha8Rng::seed_from_u64(42);
    for _ in 0..sequences {
        let len = rng.random_range(1..24);
        let ids: Vec<u32> = (0..len).map(|_| rng.random_range(0..n)).collect();
        let bytes: Vec<u8> = ids
            .iter()
            .flat_map(|&id| tok.token_bytes(id).to_vec())
            .collect();
        assert_eq!(
            String::from_utf8_lossy(&bytes),
            tok.decode(&ids, false).unwrap(),
            "sequence {ids:?}"
        );
    }
    assert!(tok.token_bytes(n).is_empty() && tok.token_bytes(u32::MAX).is_empty());
}

#[test]
fn byte_table_matches_decode_for_every_generated_tokenizer() {
    for preset in Preset::TINY {
        let tok = Tokenizer::from_file(&shared_checkpoint(preset).join("tokenizer.json")).unwrap();
        assert_eq!(tok.decoder_kind(), DecoderKind::ByteLevel);
        check_table(&tok, if cfg!(debug_assertions) { 300 } else { 3000 });
    }
}

#[test]
fn text_round_trips_through_encode_and_bytes() {
    let tok =
        Tokenizer::from_file(&shared_checkpoint(Preset::Tiny).join("tokenizer.json")).unwrap();
    for text in [
        "Hello, world! The model serves many clients.",
        "日本語のテキスト 🙂🚀 naïve café — “quotes”",
        "  leading spaces\n\ttabs and\r\nnewlines  ",
        "<|im_start|>user\nhi<|im_end|>",
    ] {
        let ids = tok.encode(text, false).unwrap();
        let bytes: Vec<u8> = ids
            .iter()
            .flat_map(|&id| tok.token_bytes(id).to_vec())
            .collect();
        assert_eq!(std::str::from_utf8(&bytes).unwrap(), text);
    }
    // Special tokens are recognized as single ids and flagged.
    let ids = tok.encode("<|im_start|>", false).unwrap();
    assert_eq!(ids.len(), 1);
    assert!(tok.is_special(ids[0]));
    assert!(!tok.is_special(tok.encode("a", false).unwrap()[0]));
    // Multi-byte characters may split across tokens: bytes are exact where `decode` is lossy.
    let split = (0..tok.len() as u32).find(|&id| std::str::from_utf8(tok.token_bytes(id)).is_err());
    assert!(
        split.is_some(),
        "a byte-level vocabulary has tokens that are partial code points"
    );
}

#[test]
fn llama_style_post_processor_adds_bos() {
    let tok =
        Tokenizer::from_file(&shared_checkpoint(Preset::TinyLlama).join("tokenizer.json")).unwrap();
    let bos = tok.token_id("<|begin_of_text|>").unwrap();
    assert_eq!(tok.encode("hi", true).unwrap()[0], bos);
    assert_ne!(tok.encode("hi", false).unwrap()[0], bos);
    let qwen =
        Tokenizer::from_file(&shared_checkpoint(Preset::Tiny).join("tokenizer.json")).unwrap();
    assert_eq!(
        qwen.encode("hi", true).unwrap(),
        qwen.encode("hi", false).unwrap()
    );
}

/// A SentencePiece-style tokenizer (Llama 2 / Mistral v0.1 decoder chain) with byte fallback.
#[test]
fn sentencepiece_byte_fallback_table() {
    let json = r#"{
      "version": "1.0", "truncation": null, "padding": null,
      "added_tokens": [{"id": 0, "content": "<unk>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
                       {"id": 1, "content": "<s>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}],
      "normalizer": {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "▁"}, {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]},
      "pre_tokenizer": null,
      "post_processor": null,
      "decoder": {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
        {"type": "ByteFallback"}, {"type": "Fuse"},
        {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
      "model": {"type": "BPE", "dropout": null, "unk_token": "<unk>", "continuing_subword_prefix": null,
        "end_of_word_suffix": null, "fuse_unk": true, "byte_fallback": true, "ignore_merges": false,
        "vocab": {"<unk>": 0, "<s>": 1, "<0x0A>": 2, "<0xC3>": 3, "<0xA9>": 4, "▁": 5, "h": 6, "i": 7, "▁h": 8, "▁hi": 9},
        "merges": [["▁", "h"], ["▁h", "i"]]}
    }"#;
    let inner = tokenizers::Tokenizer::from_bytes(json).unwrap();
    let tok = Tokenizer::from_tokenizer(inner);
    assert!(matches!(
        tok.decoder_kind(),
        DecoderKind::SentencePiece {
            byte_fallback: true,
            ..
        }
    ));
    assert!(tok.strips_leading_space());
    assert_eq!(tok.token_bytes(2), b"\n");
    assert_eq!(tok.token_bytes(3), &[0xC3]);
    assert_eq!(tok.token_bytes(9), b" hi");
    // é split over two byte tokens: concatenated bytes are the exact UTF-8.
    let bytes: Vec<u8> = [9u32, 3, 4]
        .iter()
        .flat_map(|&i| tok.token_bytes(i).to_vec())
        .collect();
    assert_eq!(std::str::from_utf8(&bytes).unwrap(), " hié");
    // `decode` strips the text's leading space; the engine does that once per sample.
    assert_eq!(tok.decode(&[9, 3, 4], false).unwrap(), "hié");
}

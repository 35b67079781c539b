//! A real byte-level BPE tokenizer of an exact size, built with the `tokenizers` crate.
//!
//! 1. Train `BpeTrainer` (GPT-2 byte alphabet, so every byte is a token) on a small embedded
//!    corpus: the first merges are the ones a real tokenizer would learn.
//! 2. Real presets need ~150k tokens, far more than the corpus supports, so deterministic
//!    synthetic merges (a pseudo-random existing token + a short trained token, at most
//!    [`MAX_TOKEN_BYTES`] bytes, never a duplicate) fill the vocabulary to the exact size.
//! 3. Special tokens go at the end, so the tokenizer has exactly `vocab_size` ids and every id
//!    the model can emit decodes.

use std::collections::{HashMap, HashSet};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{Value, json};
use tokenizers::decoders::DecoderWrapper;
use tokenizers::models::bpe::{BPE, BpeTrainerBuilder};
use tokenizers::models::{ModelWrapper, TrainerWrapper};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::processors::PostProcessorWrapper;
use tokenizers::processors::sequence::Sequence as PostSequence;
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::{AddedToken, Model};

use crate::model::error::ModelError;

const CORPUS: &str = include_str!("corpus.txt");
/// Longest synthetic token, in bytes (real vocabularies rarely go much beyond this).
const MAX_TOKEN_BYTES: usize = 12;
/// Fixed stream for synthetic merges: the tokenizer depends only on its size and special
/// tokens, never on the weight seed, so checkpoints of one preset share a tokenizer.
const MERGE_STREAM_SEED: u64 = 0x6e65_7276_615f_6270; // "nerva_bp"

/// What the tokenizer must contain.
#[derive(Debug, Clone)]
pub struct TokenizerSpec {
    /// Total ids, special tokens included (= the model's `vocab_size`).
    pub vocab_size: usize,
    /// Special tokens, appended in this order after the BPE vocabulary.
    pub special_tokens: Vec<String>,
    /// A special token the post-processor prepends when `add_special_tokens` is set (Llama's
    /// `<|begin_of_text|>`, Mistral's `<s>`); `None` for Qwen, which adds nothing.
    pub prepend_bos: Option<String>,
}

fn gen_error(message: impl std::fmt::Display) -> ModelError {
    ModelError::Generator(format!("building the tokenizer: {message}"))
}

/// The corpus used for training, repeated with variations so common pairs clear
/// `min_frequency` while rarer ones still appear.
fn corpus_lines() -> Vec<String> {
    let mut lines: Vec<String> = CORPUS.lines().map(str::to_owned).collect();
    lines.extend(CORPUS.lines().map(str::to_lowercase));
    lines.extend(CORPUS.lines().map(str::to_uppercase));
    lines
}

/// Train on the corpus: returns the vocabulary (token → id) and the ordered merges.
/// A trained vocabulary (token → id) and its merges in rank order.
type Trained = (HashMap<String, u32>, Vec<(String, String)>);

fn train(target: usize) -> Result<Trained, ModelError> {
    let alphabet = ByteLevel::alphabet().into_iter().collect();
    let trainer = BpeTrainerBuilder::new()
        .vocab_size(target)
        .min_frequency(2)
        .show_progress(false)
        .initial_alphabet(alphabet)
        .max_token_length(Some(MAX_TOKEN_BYTES))
        .build();
    let mut trainer = TrainerWrapper::BpeTrainer(trainer);
    let mut tokenizer = tokenizers::Tokenizer::new(BPE::default());
    tokenizer.with_pre_tokenizer(Some(ByteLevel::default().add_prefix_space(false)));
    tokenizer
        .train(&mut trainer, corpus_lines().into_iter())
        .map_err(gen_error)?;
    let model = serde_json::to_value(tokenizer.get_model()).map_err(gen_error)?;
    let vocab: HashMap<String, u32> =
        serde_json::from_value(model["vocab"].clone()).map_err(gen_error)?;
    let merges = model["merges"]
        .as_array()
        .ok_or_else(|| gen_error("trained model has no merges list"))?
        .iter()
        .map(|m| match m {
            Value::Array(pair) => match (pair.first(), pair.get(1)) {
                (Some(Value::String(a)), Some(Value::String(b))) => Ok((a.clone(), b.clone())),
                _ => Err(gen_error("malformed merge")),
            },
            // Older serializations: "a b".
            Value::String(s) => s
                .split_once(' ')
                .map(|(a, b)| (a.to_owned(), b.to_owned()))
                .ok_or_else(|| gen_error("malformed merge")),
            _ => Err(gen_error("malformed merge")),
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok((vocab, merges))
}

/// Build the tokenizer described by `spec`.
pub fn build_tokenizer(spec: &TokenizerSpec) -> Result<tokenizers::Tokenizer, ModelError> {
    let specials = spec.special_tokens.len();
    if spec.vocab_size < 256 + specials + 1 {
        return Err(gen_error(format!(
            "vocab_size {} leaves no room for 256 byte tokens and {specials} special tokens",
            spec.vocab_size
        )));
    }
    let bpe_size = spec.vocab_size - specials;
    let (trained_vocab, mut merges) = train(bpe_size)?;

    // Tokens by id (the trainer numbers them densely from 0).
    let mut tokens = vec![String::new(); trained_vocab.len()];
    for (token, &id) in &trained_vocab {
        let slot = tokens
            .get_mut(id as usize)
            .ok_or_else(|| gen_error("trained vocabulary ids are not dense"))?;
        *slot = token.clone();
    }
    tokens.truncate(bpe_size);
    let mut known: HashSet<String> = tokens.iter().cloned().collect();
    // Byte-level strings are one char per byte.
    let short: Vec<String> = tokens
        .iter()
        .filter(|t| t.chars().count() <= 3)
        .cloned()
        .collect();
    let mut rng = ChaCha8Rng::seed_from_u64(MERGE_STREAM_SEED ^ spec.vocab_size as u64);
    let mut attempts = 0u64;
    while tokens.len() < bpe_size {
        attempts += 1;
        if attempts > 100 * bpe_size as u64 {
            return Err(gen_error("could not find enough distinct synthetic merges"));
        }
        let left = &tokens[rng.random_range(0..tokens.len())];
        let right = &short[rng.random_range(0..short.len())];
        if left.chars().count() + right.chars().count() > MAX_TOKEN_BYTES {
            continue;
        }
        let merged = format!("{left}{right}");
        if known.contains(&merged) {
            continue;
        }
        merges.push((left.clone(), right.clone()));
        known.insert(merged.clone());
        tokens.push(merged);
    }

    let vocab: serde_json::Map<String, Value> = tokens
        .iter()
        .enumerate()
        .map(|(id, t)| (t.clone(), json!(id)))
        .collect();
    let merges: Vec<Value> = merges.into_iter().map(|(a, b)| json!([a, b])).collect();
    // Through text: BPE's deserializer borrows strings, which a `Value` cannot lend.
    let model_json = json!({
        "type": "BPE",
        "dropout": null,
        "unk_token": null,
        "continuing_subword_prefix": null,
        "end_of_word_suffix": null,
        "fuse_unk": false,
        "byte_fallback": false,
        "ignore_merges": false,
        "vocab": vocab,
        "merges": merges,
    })
    .to_string();
    let model: BPE = serde_json::from_str(&model_json).map_err(gen_error)?;
    if model.get_vocab_size() != bpe_size {
        return Err(gen_error(format!(
            "BPE has {} tokens, expected {bpe_size}",
            model.get_vocab_size()
        )));
    }

    let mut tokenizer = tokenizers::Tokenizer::new(ModelWrapper::BPE(model));
    tokenizer.with_pre_tokenizer(Some(
        ByteLevel::default().add_prefix_space(false).use_regex(true),
    ));
    tokenizer.with_decoder(Some(DecoderWrapper::ByteLevel(ByteLevel::default())));
    let added: Vec<AddedToken> = spec
        .special_tokens
        .iter()
        .map(|t| AddedToken::from(t.clone(), true))
        .collect();
    tokenizer.add_special_tokens(&added);
    let byte_level = PostProcessorWrapper::ByteLevel(ByteLevel::default().trim_offsets(false));
    let post = match &spec.prepend_bos {
        None => byte_level,
        Some(bos) => {
            let id = tokenizer
                .token_to_id(bos)
                .ok_or_else(|| gen_error(format!("bos token {bos:?} is not a special token")))?;
            let template = TemplateProcessing::builder()
                .try_single(format!("{bos}:0 $A:0"))
                .and_then(|b| b.try_pair(format!("{bos}:0 $A:0 {bos}:1 $B:1")))
                .map_err(gen_error)?
                .special_tokens(vec![(bos.clone(), id)])
                .build()
                .map_err(gen_error)?;
            PostProcessorWrapper::Sequence(PostSequence::new(vec![
                byte_level,
                PostProcessorWrapper::Template(template),
            ]))
        }
    };
    tokenizer.with_post_processor(Some(post));
    let total = tokenizer.get_vocab_size(true);
    if total != spec.vocab_size {
        return Err(gen_error(format!(
            "tokenizer has {total} ids, expected {}",
            spec.vocab_size
        )));
    }
    Ok(tokenizer)
}

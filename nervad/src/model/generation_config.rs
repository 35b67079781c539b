//! `generation_config.json`: end-of-sequence ids and default sampling settings.
//!
//! Every field is optional; a snapshot without the file gets [`GenerationConfig::default`].

use std::path::Path;

use serde::Deserialize;

use super::error::ModelError;
use super::hf_config::TokenIds;

/// Generation defaults shipped with a model.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GenerationConfig {
    /// `eos_token_id` (an int or a list in the file).
    pub eos_token_ids: Vec<u32>,
    /// `bos_token_id`.
    pub bos_token_id: Option<u32>,
    /// `pad_token_id`.
    pub pad_token_id: Option<u32>,
    /// `do_sample`; `Some(false)` means the model's authors intend greedy decoding.
    pub do_sample: Option<bool>,
    /// `temperature`.
    pub temperature: Option<f32>,
    /// `top_k`.
    pub top_k: Option<u32>,
    /// `top_p`.
    pub top_p: Option<f32>,
    /// `min_p`.
    pub min_p: Option<f32>,
    /// `repetition_penalty`.
    pub repetition_penalty: Option<f32>,
    /// `max_new_tokens`.
    pub max_new_tokens: Option<u32>,
}

#[derive(Deserialize)]
struct Raw {
    eos_token_id: Option<TokenIds>,
    bos_token_id: Option<u64>,
    pad_token_id: Option<TokenIds>,
    do_sample: Option<bool>,
    temperature: Option<f32>,
    top_k: Option<u32>,
    top_p: Option<f32>,
    min_p: Option<f32>,
    repetition_penalty: Option<f32>,
    max_new_tokens: Option<u32>,
}

fn id(value: u64, field: &str, path: &Path, vocab: usize) -> Result<u32, ModelError> {
    if value >= vocab as u64 {
        return Err(ModelError::json(
            path,
            format!("{field} {value} is outside the vocabulary (vocab_size {vocab})"),
        ));
    }
    // Below vocab_size, which fits u32.
    Ok(value as u32)
}

impl GenerationConfig {
    /// Read `generation_config.json` from `dir` if it exists; ids must be below `vocab_size`.
    pub fn from_dir(dir: &Path, vocab_size: usize) -> Result<Self, ModelError> {
        let path = dir.join("generation_config.json");
        if !path.is_file() {
            return Ok(GenerationConfig::default());
        }
        let text = std::fs::read_to_string(&path).map_err(|e| ModelError::io(&path, e))?;
        Self::from_json_str(&text, &path, vocab_size)
    }

    /// Parse the text of a `generation_config.json` (`path` only names it in errors).
    pub fn from_json_str(text: &str, path: &Path, vocab_size: usize) -> Result<Self, ModelError> {
        let raw: Raw = serde_json::from_str(text).map_err(|e| ModelError::json(path, e))?;
        let mut eos = Vec::new();
        for value in raw
            .eos_token_id
            .as_ref()
            .map(TokenIds::to_vec)
            .unwrap_or_default()
        {
            let value = id(value, "eos_token_id", path, vocab_size)?;
            if !eos.contains(&value) {
                eos.push(value);
            }
        }
        let pad = match raw.pad_token_id.as_ref().map(TokenIds::to_vec).as_deref() {
            Some([one, ..]) => Some(id(*one, "pad_token_id", path, vocab_size)?),
            _ => None,
        };
        for (name, v) in [
            ("temperature", raw.temperature),
            ("top_p", raw.top_p),
            ("min_p", raw.min_p),
            ("repetition_penalty", raw.repetition_penalty),
        ] {
            if v.is_some_and(|v| !v.is_finite() || v < 0.0) {
                return Err(ModelError::json(
                    path,
                    format!("{name} must be a finite non-negative number"),
                ));
            }
        }
        Ok(GenerationConfig {
            eos_token_ids: eos,
            bos_token_id: raw
                .bos_token_id
                .map(|b| id(b, "bos_token_id", path, vocab_size))
                .transpose()?,
            pad_token_id: pad,
            do_sample: raw.do_sample,
            temperature: raw.temperature,
            top_k: raw.top_k,
            top_p: raw.top_p,
            min_p: raw.min_p,
            repetition_penalty: raw.repetition_penalty,
            max_new_tokens: raw.max_new_tokens,
        })
    }
}

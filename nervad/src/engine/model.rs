//! What the engine needs of a model besides its weights: token bytes, stop ids, and a way to
//! turn text and chat messages into token ids.
//!
//! Kept apart from the loader so the engine can be driven by any model source (a loaded
//! Hugging Face snapshot, or weights built in memory by tests).

use std::sync::Arc;

use super::detok::TokenTable;
use crate::model::{ModelConfig, ModelWeights};

/// Text ↔ token ids through the model's tokenizer, for clients that ask the daemon to
/// tokenize or detokenize (`TOKENIZE` / `DETOKENIZE` admin queries). Shared with the poll
/// thread, which answers those queries off the hot path.
pub trait TextCodec: Send + Sync {
    /// Token ids of `text`; `add_special` adds what a text prompt gets (e.g. a leading bos).
    fn tokenize(&self, text: &str, add_special: bool) -> Result<Vec<u32>, String>;
    /// Text of `ids`; `skip_special` leaves special tokens out. Ids outside the vocabulary are
    /// an error naming the first one.
    fn detokenize(&self, ids: &[u32], skip_special: bool) -> Result<String, String>;
}

impl TextCodec for crate::model::tokenizer::Tokenizer {
    fn tokenize(&self, text: &str, add_special: bool) -> Result<Vec<u32>, String> {
        self.encode(text, add_special).map_err(|e| e.to_string())
    }

    fn detokenize(&self, ids: &[u32], skip_special: bool) -> Result<String, String> {
        if let Some(&bad) = ids.iter().find(|&&id| id as usize >= self.len()) {
            return Err(format!(
                "token id {bad} is outside the vocabulary of {}",
                self.len()
            ));
        }
        self.decode(ids, skip_special).map_err(|e| e.to_string())
    }
}

/// Turns prompts into token ids.
pub trait PromptEncoder: Send {
    /// Tokenize `text`, adding special tokens as the tokenizer's post-processor says.
    fn encode(&self, text: &str) -> Result<Vec<u32>, String>;
    /// Render a JSON array of chat messages with the generation prompt appended and tokenize it
    /// (without adding special tokens again). `None` when the model has no chat template.
    fn encode_chat(&self, messages_json: &str) -> Option<Result<Vec<u32>, String>>;
}

/// A model ready for the engine.
pub struct EngineModel {
    /// Name or path for status displays.
    pub name: String,
    /// Resolved configuration.
    pub config: ModelConfig,
    /// Weights (views over the checkpoint's memory map).
    pub weights: ModelWeights,
    /// Exact bytes of every token id.
    pub tokens: TokenTable,
    /// End-of-sequence ids (config and generation config together).
    pub eos_token_ids: Vec<u32>,
    /// Prompt tokenization.
    pub prompts: Box<dyn PromptEncoder>,
}

impl std::fmt::Debug for EngineModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineModel")
            .field("name", &self.name)
            .field("architecture", &self.config.architecture)
            .field("eos_token_ids", &self.eos_token_ids)
            .finish()
    }
}

/// Prompt encoding through a loaded model's tokenizer and chat template.
struct LoadedPrompts {
    tokenizer: Arc<crate::model::tokenizer::Tokenizer>,
    chat_template: Option<crate::model::chat_template::ChatTemplate>,
}

impl PromptEncoder for LoadedPrompts {
    fn encode(&self, text: &str) -> Result<Vec<u32>, String> {
        self.tokenizer.encode(text, true).map_err(|e| e.to_string())
    }

    fn encode_chat(&self, messages_json: &str) -> Option<Result<Vec<u32>, String>> {
        let template = self.chat_template.as_ref()?;
        // Templates write their own special tokens (bos included), as transformers'
        // `apply_chat_template(tokenize=True)` does with `add_special_tokens=False`.
        Some(
            template
                .render(messages_json, true)
                .and_then(|text| self.tokenizer.encode(&text, false))
                .map_err(|e| e.to_string()),
        )
    }
}

impl EngineModel {
    /// Everything the engine needs from a loaded Hugging Face snapshot.
    pub fn from_loaded(model: crate::model::LoadedModel) -> Self {
        Self::from_loaded_with_codec(model).0
    }

    /// As [`EngineModel::from_loaded`], plus the tokenizer as a [`TextCodec`] the server can
    /// share with the poll thread.
    pub fn from_loaded_with_codec(model: crate::model::LoadedModel) -> (Self, Arc<dyn TextCodec>) {
        let eos_token_ids = model.eos_token_ids();
        let tok = &model.tokenizer;
        let mut tokens = TokenTable::new(
            (0..tok.len() as u32).map(|id| (tok.token_bytes(id), tok.is_special(id))),
        );
        tokens.set_strip_leading_space(tok.strips_leading_space());
        let tokenizer = Arc::new(model.tokenizer);
        let engine_model = EngineModel {
            name: model.name,
            config: model.config,
            weights: model.weights,
            tokens,
            eos_token_ids,
            prompts: Box::new(LoadedPrompts {
                tokenizer: tokenizer.clone(),
                chat_template: model.chat_template,
            }),
        };
        (engine_model, tokenizer)
    }
}

//! `tokenizer_config.json` (and `chat_template.jinja`): special tokens and the chat template.

use std::path::Path;

use serde::Deserialize;
use serde_json::Value;

use super::chat_template::SpecialTokens;
use super::error::ModelError;

/// What the daemon uses from `tokenizer_config.json`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TokenizerConfig {
    /// `bos_token`, `eos_token`, `pad_token`, `unk_token` as strings.
    pub special: SpecialTokens,
    /// The chat template source (the `default` one when the config lists several), or the
    /// contents of `chat_template.jinja`, which newer transformers write instead.
    pub chat_template: Option<String>,
}

#[derive(Deserialize)]
struct Raw {
    bos_token: Option<Value>,
    eos_token: Option<Value>,
    pad_token: Option<Value>,
    unk_token: Option<Value>,
    chat_template: Option<Value>,
}

/// A special token is a string or an AddedToken dict `{"content": ...}`.
fn token_string(
    value: &Option<Value>,
    field: &str,
    path: &Path,
) -> Result<Option<String>, ModelError> {
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(Value::Object(obj)) => match obj.get("content") {
            Some(Value::String(s)) => Ok(Some(s.clone())),
            _ => Err(ModelError::json(
                path,
                format!("{field} has no string \"content\""),
            )),
        },
        Some(_) => Err(ModelError::json(
            path,
            format!("{field} must be a string or an object"),
        )),
    }
}

fn chat_template(value: &Option<Value>, path: &Path) -> Result<Option<String>, ModelError> {
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        // [{"name": "default", "template": "..."}, {"name": "tool_use", ...}]
        Some(Value::Array(named)) => {
            let pick = named
                .iter()
                .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
                .or_else(|| named.first());
            match pick.and_then(|t| t.get("template")).and_then(Value::as_str) {
                Some(s) => Ok(Some(s.to_string())),
                None => Err(ModelError::json(
                    path,
                    "chat_template list has no usable template",
                )),
            }
        }
        Some(_) => Err(ModelError::json(
            path,
            "chat_template must be a string or a list",
        )),
    }
}

impl TokenizerConfig {
    /// Read `tokenizer_config.json` and `chat_template.jinja` from `dir`; both are optional.
    pub fn from_dir(dir: &Path) -> Result<Self, ModelError> {
        let path = dir.join("tokenizer_config.json");
        let mut config = if path.is_file() {
            let text = std::fs::read_to_string(&path).map_err(|e| ModelError::io(&path, e))?;
            Self::from_json_str(&text, &path)?
        } else {
            TokenizerConfig::default()
        };
        let jinja = dir.join("chat_template.jinja");
        if jinja.is_file() {
            config.chat_template =
                Some(std::fs::read_to_string(&jinja).map_err(|e| ModelError::io(&jinja, e))?);
        }
        Ok(config)
    }

    /// Parse the text of a `tokenizer_config.json` (`path` only names it in errors).
    pub fn from_json_str(text: &str, path: &Path) -> Result<Self, ModelError> {
        let raw: Raw = serde_json::from_str(text).map_err(|e| ModelError::json(path, e))?;
        Ok(TokenizerConfig {
            special: SpecialTokens {
                bos: token_string(&raw.bos_token, "bos_token", path)?,
                eos: token_string(&raw.eos_token, "eos_token", path)?,
                pad: token_string(&raw.pad_token, "pad_token", path)?,
                unk: token_string(&raw.unk_token, "unk_token", path)?,
            },
            chat_template: chat_template(&raw.chat_template, path)?,
        })
    }
}

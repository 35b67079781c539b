//! `tokenizer.json` through the `tokenizers` crate, plus a per-token byte table for exact
//! streaming detokenization.
//!
//! `tokenizers`' `decode` returns a `String`: a token that ends in the middle of a UTF-8 code
//! point comes back as U+FFFD. The engine instead concatenates [`Tokenizer::token_bytes`] and
//! emits only whole code points, so the table must hold exactly the bytes `decode` would have
//! produced before its lossy UTF-8 conversion. The decoders in use by the supported model
//! families are mirrored here:
//! - ByteLevel (GPT-2, Qwen, Llama 3): every character of the token maps back to one byte via
//!   the GPT-2 byte↔unicode table; a token with a character outside the table (an added token
//!   such as `"<|im start|>"` with a space) is taken as its UTF-8 bytes, exactly like
//!   `tokenizers::decoders::ByteLevel`.
//! - SentencePiece style (Metaspace, or Replace/ByteFallback/Fuse/Strip sequences: Llama 2,
//!   Mistral): `▁` becomes a space and `<0xNN>` becomes byte `NN`. Such decoders also drop the
//!   space at the very start of a text; [`Tokenizer::strips_leading_space`] says so, and the
//!   engine drops it for the first emitted token.

use std::path::Path;

use tokenizers::decoders::DecoderWrapper;

use super::error::ModelError;

/// How token strings map back to bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecoderKind {
    /// GPT-2 byte-level.
    ByteLevel,
    /// SentencePiece `▁` spaces, optionally with `<0xNN>` byte fallback.
    SentencePiece {
        /// `<0xNN>` tokens decode to the byte `NN`.
        byte_fallback: bool,
        /// The decoder removes one leading space from the whole text.
        strip_leading_space: bool,
    },
    /// No decoder, or one we do not mirror: the token string's own UTF-8 bytes.
    Plain,
}

/// GPT-2's reversible byte → printable-character table (`bytes_to_unicode` in openai/gpt-2
/// `encoder.py`): printable Latin-1 bytes map to themselves, the other 68 bytes to U+0100…
fn gpt2_char_to_byte() -> std::collections::HashMap<char, u8> {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    let mut map = std::collections::HashMap::with_capacity(256);
    let mut next = 256u32;
    for b in 0..=255u8 {
        let c = if printable(b) {
            char::from(b)
        } else {
            let c = char::from_u32(next).unwrap_or(char::REPLACEMENT_CHARACTER);
            next += 1;
            c
        };
        map.insert(c, b);
    }
    map
}

/// Inverse of [`gpt2_char_to_byte`]: byte → character (used to write byte-level vocabularies).
pub fn gpt2_byte_to_char() -> [char; 256] {
    let mut out = ['\0'; 256];
    for (c, b) in gpt2_char_to_byte() {
        out[usize::from(b)] = c;
    }
    out
}

fn decoder_kind(decoder: Option<&DecoderWrapper>) -> DecoderKind {
    let parts: Vec<&DecoderWrapper> = match decoder {
        None => return DecoderKind::Plain,
        Some(DecoderWrapper::Sequence(seq)) => seq.get_decoders().iter().collect(),
        Some(one) => vec![one],
    };
    if parts
        .iter()
        .any(|d| matches!(d, DecoderWrapper::ByteLevel(_)))
    {
        return DecoderKind::ByteLevel;
    }
    let metaspace = parts.iter().find_map(|d| match d {
        DecoderWrapper::Metaspace(m) => Some(m),
        _ => None,
    });
    let replace = parts
        .iter()
        .any(|d| matches!(d, DecoderWrapper::Replace(_)));
    if metaspace.is_some() || replace {
        let strip = parts.iter().any(|d| matches!(d, DecoderWrapper::Strip(_)))
            || metaspace.is_some_and(|m| {
                m.prepend_scheme != tokenizers::pre_tokenizers::metaspace::PrependScheme::Never
            });
        return DecoderKind::SentencePiece {
            byte_fallback: parts
                .iter()
                .any(|d| matches!(d, DecoderWrapper::ByteFallback(_))),
            strip_leading_space: strip,
        };
    }
    DecoderKind::Plain
}

fn byte_fallback_value(token: &str) -> Option<u8> {
    let hex = token.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

/// A loaded tokenizer with its byte table.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    kind: DecoderKind,
    /// Concatenated bytes of every token; token `i` is `bytes[offsets[i]..offsets[i + 1]]`.
    bytes: Vec<u8>,
    offsets: Vec<usize>,
    special: Vec<bool>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("len", &self.len())
            .field("kind", &self.kind)
            .finish_non_exhaustive()
    }
}

impl Tokenizer {
    /// Load `tokenizer.json`.
    pub fn from_file(path: &Path) -> Result<Self, ModelError> {
        if !path.is_file() {
            return Err(ModelError::MissingFile {
                path: path.to_path_buf(),
                what: "the tokenizer",
            });
        }
        let inner = tokenizers::Tokenizer::from_file(path)
            .map_err(|e| ModelError::Tokenizer(format!("{}: {e}", path.display())))?;
        Ok(Self::from_tokenizer(inner))
    }

    /// Wrap an already built tokenizer (the generator uses this).
    pub fn from_tokenizer(inner: tokenizers::Tokenizer) -> Self {
        let kind = decoder_kind(inner.get_decoder());
        let added = inner.get_added_tokens_decoder();
        let max_added = added.keys().max().map_or(0, |&id| id as usize + 1);
        let len = inner.get_vocab_size(true).max(max_added);
        let char_to_byte = gpt2_char_to_byte();
        let mut bytes = Vec::new();
        let mut offsets = Vec::with_capacity(len + 1);
        let mut special = vec![false; len];
        offsets.push(0);
        for id in 0..len {
            // Same lookup order as `tokenizers::Tokenizer::decode`: added tokens, then the model.
            if let Some(token) = inner.id_to_token(id as u32) {
                match kind {
                    DecoderKind::ByteLevel => {
                        let mapped: Option<Vec<u8>> = token
                            .chars()
                            .map(|c| char_to_byte.get(&c).copied())
                            .collect();
                        match mapped {
                            Some(b) => bytes.extend_from_slice(&b),
                            None => bytes.extend_from_slice(token.as_bytes()),
                        }
                    }
                    DecoderKind::SentencePiece { byte_fallback, .. } => {
                        match byte_fallback_value(&token).filter(|_| byte_fallback) {
                            Some(b) => bytes.push(b),
                            None => {
                                bytes.extend_from_slice(token.replace('\u{2581}', " ").as_bytes())
                            }
                        }
                    }
                    DecoderKind::Plain => bytes.extend_from_slice(token.as_bytes()),
                }
            }
            offsets.push(bytes.len());
        }
        for (&id, token) in &added {
            if token.special {
                special[id as usize] = true;
            }
        }
        if kind == DecoderKind::Plain && inner.get_decoder().is_some() {
            tracing::warn!(
                "tokenizer decoder is not ByteLevel or SentencePiece-style; streaming text uses raw token strings"
            );
        }
        Tokenizer {
            inner,
            kind,
            bytes,
            offsets,
            special,
        }
    }

    /// Number of token ids (model vocabulary plus added tokens).
    pub fn len(&self) -> usize {
        self.special.len()
    }

    /// No tokens at all (never true for a loaded model).
    pub fn is_empty(&self) -> bool {
        self.special.is_empty()
    }

    /// The exact bytes token `id` contributes to decoded text (empty for ids without a token).
    pub fn token_bytes(&self, id: u32) -> &[u8] {
        let id = id as usize;
        match (self.offsets.get(id), self.offsets.get(id + 1)) {
            (Some(&start), Some(&end)) => &self.bytes[start..end],
            _ => &[],
        }
    }

    /// `id` is a special added token (`<|im_end|>` …), which `decode(skip_special_tokens)` drops.
    pub fn is_special(&self, id: u32) -> bool {
        self.special.get(id as usize).copied().unwrap_or(false)
    }

    /// The decoder family the byte table mirrors.
    pub fn decoder_kind(&self) -> DecoderKind {
        self.kind
    }

    /// The decoder drops one leading space of the whole text (SentencePiece style).
    pub fn strips_leading_space(&self) -> bool {
        matches!(
            self.kind,
            DecoderKind::SentencePiece {
                strip_leading_space: true,
                ..
            }
        )
    }

    /// Token ids of `text`; `add_special` applies the post-processor (e.g. a leading bos).
    pub fn encode(&self, text: &str, add_special: bool) -> Result<Vec<u32>, ModelError> {
        self.inner
            .encode(text, add_special)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| ModelError::Tokenizer(format!("encoding failed: {e}")))
    }

    /// `tokenizers`' own decode (lossy at split code points; use the byte table for streaming).
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String, ModelError> {
        self.inner
            .decode(ids, skip_special)
            .map_err(|e| ModelError::Tokenizer(format!("decoding failed: {e}")))
    }

    /// The id of a token string (vocabulary entry or added token).
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The wrapped `tokenizers` tokenizer.
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }
}

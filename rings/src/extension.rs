//! The versioned extension block: generation options that do not fit the 64-byte descriptor.
//! The client writes it into the input region and points the descriptor's
//! `(ext_offset, ext_len)` at it; the daemon copies it out and parses the private copy.
//!
//! # Layout (little-endian; version 1)
//!
//! | bytes | field |
//! | ---: | --- |
//! | 0..2 | `version: u16` = 1 (a reader refuses versions it does not know) |
//! | 2..4 | `fixed_len: u16` = 32: bytes of the fixed part; later versions append fields and raise it; a reader uses defaults for fields past `fixed_len` |
//! | 4..8 | `total_len: u32`: whole block; must equal the descriptor's `ext_len` |
//! | 8..12 | `presence_penalty: f32`, finite, in [-2, 2], 0 = off |
//! | 12..16 | `frequency_penalty: f32`, finite, in [-2, 2], 0 = off |
//! | 16 | `top_logprobs: u8`, 0..=[`MAX_TOP_LOGPROBS`] alternatives per position |
//! | 17 | `flags: u8`: bit 0 `ignore_eos`; other bits must be 0 |
//! | 18..20 | `stop_token_count: u16` ≤ [`MAX_STOP_TOKENS`] |
//! | 20..22 | `stop_string_count: u16` ≤ [`MAX_STOP_STRINGS`] |
//! | 22..24 | reserved, 0 |
//! | 24..28 | `stop_strings_bytes: u32`: bytes of the stop-string section |
//! | 28..32 | reserved, 0 |
//! | `fixed_len`.. | `stop_token_count` × `u32` token ids |
//! | then | `stop_string_count` × (`u16` length, that many UTF-8 bytes), each 1..=[`MAX_STOP_STRING_BYTES`] |
//!
//! `total_len` must be exactly `fixed_len + 4 × stop_token_count + stop_strings_bytes`.

use crate::wire_bytes::{u16_at, u32_at};

/// Version this build writes and the highest it reads.
pub const EXTENSION_VERSION: u16 = 1;
/// Fixed part of a version-1 block.
pub const EXTENSION_FIXED_LEN: usize = 32;
/// Most stop token ids per request.
pub const MAX_STOP_TOKENS: usize = 64;
/// Most stop strings per request.
pub const MAX_STOP_STRINGS: usize = 16;
/// Longest stop string in bytes.
pub const MAX_STOP_STRING_BYTES: usize = 256;
/// Most top-logprob alternatives per position.
pub const MAX_TOP_LOGPROBS: u8 = 20;
/// Largest possible version-1 block.
pub const MAX_EXTENSION_BYTES: usize =
    EXTENSION_FIXED_LEN + 4 * MAX_STOP_TOKENS + MAX_STOP_STRINGS * (2 + MAX_STOP_STRING_BYTES);

const FLAG_IGNORE_EOS: u8 = 1;

/// Options carried by an extension block (owned; the client builds one and encodes it).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Extension {
    /// Stop when any of these token ids is sampled.
    pub stop_token_ids: Vec<u32>,
    /// Stop when the output text contains any of these (matched across token boundaries).
    pub stop_strings: Vec<String>,
    /// OpenAI-style presence penalty.
    pub presence_penalty: f32,
    /// OpenAI-style frequency penalty.
    pub frequency_penalty: f32,
    /// Alternatives to report per generated position (`TOP_LOGPROBS` completions).
    pub top_logprobs: u8,
    /// Keep generating past the end-of-sequence token.
    pub ignore_eos: bool,
}

/// An extension block is malformed. The daemon answers [`crate::StatusCode::BadExtension`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ExtensionError {
    /// Block shorter than its fixed part, or lengths inconsistent.
    Length {
        /// Bytes the headers imply.
        expected: usize,
        /// Bytes present.
        got: usize,
    },
    /// Version this build does not know (or 0).
    Version(u16),
    /// `fixed_len` below version 1's.
    FixedLen(u16),
    /// Unknown flag bits or non-zero reserved bytes.
    Reserved,
    /// Too many stop tokens.
    TooManyStopTokens(usize),
    /// Too many stop strings.
    TooManyStopStrings(usize),
    /// A stop string is empty or longer than [`MAX_STOP_STRING_BYTES`].
    StopStringLength(usize),
    /// A stop string is not UTF-8.
    StopStringUtf8,
    /// A penalty is not finite or outside [-2, 2] (`"presence"` or `"frequency"`).
    Penalty(&'static str),
    /// `top_logprobs` above [`MAX_TOP_LOGPROBS`].
    TopLogprobs(u8),
}

impl core::fmt::Display for ExtensionError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::Length { expected, got } => {
                write!(f, "extension block of {got} bytes, headers say {expected}")
            }
            Self::Version(v) => write!(
                f,
                "extension version {v} (this build reads 1..={EXTENSION_VERSION})"
            ),
            Self::FixedLen(n) => write!(
                f,
                "extension fixed part of {n} bytes, at least {EXTENSION_FIXED_LEN}"
            ),
            Self::Reserved => write!(f, "extension reserved bits or bytes set"),
            Self::TooManyStopTokens(n) => write!(f, "{n} stop tokens, at most {MAX_STOP_TOKENS}"),
            Self::TooManyStopStrings(n) => {
                write!(f, "{n} stop strings, at most {MAX_STOP_STRINGS}")
            }
            Self::StopStringLength(n) => write!(
                f,
                "stop string of {n} bytes, must be 1..={MAX_STOP_STRING_BYTES}"
            ),
            Self::StopStringUtf8 => write!(f, "stop string is not UTF-8"),
            Self::Penalty(which) => write!(f, "{which} penalty must be finite and in [-2, 2]"),
            Self::TopLogprobs(n) => write!(f, "top_logprobs {n}, at most {MAX_TOP_LOGPROBS}"),
        }
    }
}

impl std::error::Error for ExtensionError {}

fn check_penalty(value: f32, which: &'static str) -> Result<(), ExtensionError> {
    if value.is_finite() && (-2.0..=2.0).contains(&value) {
        Ok(())
    } else {
        Err(ExtensionError::Penalty(which))
    }
}

impl Extension {
    fn check(&self) -> Result<(), ExtensionError> {
        if self.stop_token_ids.len() > MAX_STOP_TOKENS {
            return Err(ExtensionError::TooManyStopTokens(self.stop_token_ids.len()));
        }
        if self.stop_strings.len() > MAX_STOP_STRINGS {
            return Err(ExtensionError::TooManyStopStrings(self.stop_strings.len()));
        }
        for s in &self.stop_strings {
            if s.is_empty() || s.len() > MAX_STOP_STRING_BYTES {
                return Err(ExtensionError::StopStringLength(s.len()));
            }
        }
        check_penalty(self.presence_penalty, "presence")?;
        check_penalty(self.frequency_penalty, "frequency")?;
        if self.top_logprobs > MAX_TOP_LOGPROBS {
            return Err(ExtensionError::TopLogprobs(self.top_logprobs));
        }
        Ok(())
    }

    /// Whether every option has its default (then no block needs to be sent).
    pub fn is_default(&self) -> bool {
        *self == Self::default()
    }

    /// Bytes [`Extension::encode`] produces.
    pub fn encoded_len(&self) -> usize {
        EXTENSION_FIXED_LEN
            + 4 * self.stop_token_ids.len()
            + self.stop_strings.iter().map(|s| 2 + s.len()).sum::<usize>()
    }

    /// Encode into a new buffer after checking every limit.
    pub fn encode(&self) -> Result<Vec<u8>, ExtensionError> {
        self.check()?;
        let strings_bytes: usize = self.stop_strings.iter().map(|s| 2 + s.len()).sum();
        let total = self.encoded_len();
        let mut out = Vec::with_capacity(total);
        out.extend_from_slice(&EXTENSION_VERSION.to_le_bytes());
        out.extend_from_slice(&(EXTENSION_FIXED_LEN as u16).to_le_bytes());
        out.extend_from_slice(&(total as u32).to_le_bytes());
        out.extend_from_slice(&self.presence_penalty.to_le_bytes());
        out.extend_from_slice(&self.frequency_penalty.to_le_bytes());
        out.push(self.top_logprobs);
        out.push(if self.ignore_eos { FLAG_IGNORE_EOS } else { 0 });
        out.extend_from_slice(&(self.stop_token_ids.len() as u16).to_le_bytes());
        out.extend_from_slice(&(self.stop_strings.len() as u16).to_le_bytes());
        out.extend_from_slice(&[0, 0]);
        out.extend_from_slice(&(strings_bytes as u32).to_le_bytes());
        out.extend_from_slice(&[0, 0, 0, 0]);
        debug_assert_eq!(out.len(), EXTENSION_FIXED_LEN);
        for id in &self.stop_token_ids {
            out.extend_from_slice(&id.to_le_bytes());
        }
        for s in &self.stop_strings {
            out.extend_from_slice(&(s.len() as u16).to_le_bytes());
            out.extend_from_slice(s.as_bytes());
        }
        debug_assert_eq!(out.len(), total);
        Ok(out)
    }
}

/// A parsed, validated view of a block in private memory (no allocation; the daemon parses
/// into this from its own copy of the bytes).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ExtensionView<'a> {
    /// Presence penalty.
    pub presence_penalty: f32,
    /// Frequency penalty.
    pub frequency_penalty: f32,
    /// Alternatives per position.
    pub top_logprobs: u8,
    /// Keep going past end-of-sequence.
    pub ignore_eos: bool,
    stop_tokens: &'a [u8],
    stop_strings: &'a [u8],
    stop_string_count: usize,
}

impl<'a> ExtensionView<'a> {
    /// Parse and fully validate `bytes` (exactly the block: `ext_len` bytes).
    pub fn parse(bytes: &'a [u8]) -> Result<Self, ExtensionError> {
        if bytes.len() < EXTENSION_FIXED_LEN {
            return Err(ExtensionError::Length {
                expected: EXTENSION_FIXED_LEN,
                got: bytes.len(),
            });
        }
        let version = u16_at(bytes, 0);
        if version == 0 || version > EXTENSION_VERSION {
            return Err(ExtensionError::Version(version));
        }
        let fixed_len = u16_at(bytes, 2);
        if usize::from(fixed_len) < EXTENSION_FIXED_LEN {
            return Err(ExtensionError::FixedLen(fixed_len));
        }
        let total = u32_at(bytes, 4) as usize;
        let token_count = usize::from(u16_at(bytes, 18));
        let string_count = usize::from(u16_at(bytes, 20));
        let strings_bytes = u32_at(bytes, 24) as usize;
        if bytes[17] & !FLAG_IGNORE_EOS != 0
            || bytes[22..24] != [0, 0]
            || bytes[28..32] != [0, 0, 0, 0]
        {
            return Err(ExtensionError::Reserved);
        }
        if token_count > MAX_STOP_TOKENS {
            return Err(ExtensionError::TooManyStopTokens(token_count));
        }
        if string_count > MAX_STOP_STRINGS {
            return Err(ExtensionError::TooManyStopStrings(string_count));
        }
        // All terms are bounded (u16 / u32 widened to usize on 64-bit): no overflow.
        let expected = usize::from(fixed_len) + 4 * token_count + strings_bytes;
        if total != bytes.len() || expected != bytes.len() {
            return Err(ExtensionError::Length {
                expected,
                got: bytes.len(),
            });
        }
        let presence_penalty = f32::from_bits(u32_at(bytes, 8));
        let frequency_penalty = f32::from_bits(u32_at(bytes, 12));
        check_penalty(presence_penalty, "presence")?;
        check_penalty(frequency_penalty, "frequency")?;
        let top_logprobs = bytes[16];
        if top_logprobs > MAX_TOP_LOGPROBS {
            return Err(ExtensionError::TopLogprobs(top_logprobs));
        }
        let tokens_start = usize::from(fixed_len);
        let strings_start = tokens_start + 4 * token_count;
        let stop_tokens = &bytes[tokens_start..strings_start];
        let stop_strings = &bytes[strings_start..];
        // Walk the string section once to validate framing and UTF-8.
        let mut rest = stop_strings;
        for _ in 0..string_count {
            if rest.len() < 2 {
                return Err(ExtensionError::Length {
                    expected: strings_bytes + 2,
                    got: strings_bytes,
                });
            }
            let len = usize::from(u16_at(rest, 0));
            if len == 0 || len > MAX_STOP_STRING_BYTES {
                return Err(ExtensionError::StopStringLength(len));
            }
            let Some(s) = rest.get(2..2 + len) else {
                return Err(ExtensionError::Length {
                    expected: strings_bytes + len,
                    got: strings_bytes,
                });
            };
            core::str::from_utf8(s).map_err(|_| ExtensionError::StopStringUtf8)?;
            rest = &rest[2 + len..];
        }
        if !rest.is_empty() {
            return Err(ExtensionError::Length {
                expected: strings_bytes - rest.len(),
                got: strings_bytes,
            });
        }
        Ok(Self {
            presence_penalty,
            frequency_penalty,
            top_logprobs,
            ignore_eos: bytes[17] & FLAG_IGNORE_EOS != 0,
            stop_tokens,
            stop_strings,
            stop_string_count: string_count,
        })
    }

    /// Stop token ids.
    pub fn stop_token_ids(&self) -> impl Iterator<Item = u32> + 'a {
        self.stop_tokens
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
    }

    /// Stop strings (validated UTF-8).
    pub fn stop_strings(&self) -> impl Iterator<Item = &'a str> + 'a {
        let mut rest = self.stop_strings;
        (0..self.stop_string_count).filter_map(move |_| {
            let len = usize::from(u16::from_le_bytes([*rest.first()?, *rest.get(1)?]));
            let s = core::str::from_utf8(rest.get(2..2 + len)?).ok()?;
            rest = &rest[2 + len..];
            Some(s)
        })
    }

    /// An owned copy.
    pub fn to_owned(&self) -> Extension {
        Extension {
            stop_token_ids: self.stop_token_ids().collect(),
            stop_strings: self.stop_strings().map(str::to_owned).collect(),
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            top_logprobs: self.top_logprobs,
            ignore_eos: self.ignore_eos,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Extension {
        Extension {
            stop_token_ids: vec![2, 151643, u32::MAX],
            stop_strings: vec!["\n\nUser:".into(), "✓ done".into()],
            presence_penalty: 0.5,
            frequency_penalty: -1.5,
            top_logprobs: 5,
            ignore_eos: true,
        }
    }

    #[test]
    fn round_trips() {
        let ext = sample();
        let bytes = ext.encode().expect("valid");
        assert_eq!(bytes.len(), ext.encoded_len());
        let view = ExtensionView::parse(&bytes).expect("parses");
        assert_eq!(view.to_owned(), ext);
        let empty = Extension::default();
        assert!(empty.is_default());
        let bytes = empty.encode().expect("valid");
        assert_eq!(bytes.len(), EXTENSION_FIXED_LEN);
        assert_eq!(ExtensionView::parse(&bytes).expect("ok").to_owned(), empty);
    }

    #[test]
    fn encode_checks_limits() {
        let mut e = sample();
        e.top_logprobs = MAX_TOP_LOGPROBS + 1;
        assert_eq!(e.encode(), Err(ExtensionError::TopLogprobs(21)));
        let mut e = sample();
        e.presence_penalty = f32::NAN;
        assert_eq!(e.encode(), Err(ExtensionError::Penalty("presence")));
        let mut e = sample();
        e.stop_strings.push(String::new());
        assert_eq!(e.encode(), Err(ExtensionError::StopStringLength(0)));
        let mut e = sample();
        e.stop_token_ids = vec![0; MAX_STOP_TOKENS + 1];
        assert!(matches!(
            e.encode(),
            Err(ExtensionError::TooManyStopTokens(_))
        ));
    }

    #[test]
    fn parse_rejects_malformed_blocks() {
        let good = sample().encode().expect("valid");
        let mutate = |f: &dyn Fn(&mut Vec<u8>)| {
            let mut b = good.clone();
            f(&mut b);
            ExtensionView::parse(&b).map(|_| ())
        };
        assert!(matches!(
            mutate(&|b| b.truncate(10)),
            Err(ExtensionError::Length { .. })
        ));
        assert_eq!(mutate(&|b| b[0] = 9), Err(ExtensionError::Version(9)));
        assert_eq!(mutate(&|b| b[2] = 8), Err(ExtensionError::FixedLen(8)));
        assert!(matches!(
            mutate(&|b| b[4] ^= 1),
            Err(ExtensionError::Length { .. })
        ));
        assert!(matches!(
            mutate(&|b| b.push(0)),
            Err(ExtensionError::Length { .. })
        ));
        assert_eq!(mutate(&|b| b[17] |= 0x80), Err(ExtensionError::Reserved));
        assert_eq!(mutate(&|b| b[30] = 1), Err(ExtensionError::Reserved));
        assert_eq!(
            mutate(&|b| b[16] = 200),
            Err(ExtensionError::TopLogprobs(200))
        );
        // Break the first stop string's UTF-8 (its bytes start after 3 token ids + 2-byte len).
        let s0 = EXTENSION_FIXED_LEN + 12 + 2;
        assert_eq!(
            mutate(&|b| b[s0] = 0xff),
            Err(ExtensionError::StopStringUtf8)
        );
        // A string length pointing past the section.
        assert!(matches!(
            mutate(&|b| b[s0 - 2] = 200),
            Err(ExtensionError::Length { .. })
        ));
        // Arbitrary bytes never panic.
        for len in 0..80 {
            for seed in 0..64u8 {
                let bytes: Vec<u8> = (0..len)
                    .map(|i| (i as u8).wrapping_mul(seed) ^ seed)
                    .collect();
                let _ = ExtensionView::parse(&bytes);
            }
        }
    }
}

//! The 64-byte submission entry a client writes into its submission ring.
//!
//! # Layout (ABI; `DESCRIPTOR_VERSION` = 1; native byte order, the peer is on the same host)
//!
//! | bytes | field | `GENERATE` | `CANCEL` | `ADMIN` | `NOP` |
//! | ---: | --- | --- | --- | --- | --- |
//! | 0 | `opcode: u8` | 1 | 2 | 3 | 0 |
//! | 1 | `version: u8` | [`DESCRIPTOR_VERSION`] | same | same | same |
//! | 2..4 | `flags: u16` | [`GenerateFlags`] | 0 | 0 | 0 |
//! | 4 | `kind: u8` | [`PromptKind`] | 0 | [`AdminQuery`] | 0 |
//! | 5 | `priority: i8` | higher runs first, 0 normal | 0 | 0 | 0 |
//! | 6..8 | `n_samples: u16` | samples sharing the prompt, 1..=[`MAX_SAMPLES`] | 0 | 0 | 0 |
//! | 8..16 | `tag: u64` | request tag (client-chosen) | tag to cancel | reply tag | echo tag |
//! | 16..20 | `region_offset: u32` | prompt offset in the input region | 0 | reply offset in the output region | 0 |
//! | 20..24 | `region_len: u32` | prompt bytes | 0 | reply capacity | 0 |
//! | 24..28 | `max_tokens: u32` | ≥ 1 | 0 | 0 | 0 |
//! | 28..32 | `temperature: f32` | finite, ≥ 0 (0 = greedy) | 0 | 0 | 0 |
//! | 32..36 | `top_k: u32` | 0 = off | 0 | 0 | 0 |
//! | 36..40 | `top_p: f32` | (0, 1], 1 = off | 0 | 0 | 0 |
//! | 40..44 | `min_p: f32` | [0, 1], 0 = off | 0 | 0 | 0 |
//! | 44..48 | `repetition_penalty: f32` | finite, > 0, 1 = off | 0 | 0 | 0 |
//! | 48..56 | `word: u64` | sampling seed | 0 | [`AdminOptions`] (`TOKENIZE`/`DETOKENIZE`), else 0 | payload echoed by `NOP_REPLY` |
//! | 56..60 | `ext_offset: u32` | [`crate::extension`] block offset in the input region | 0 | input offset (`TOKENIZE`/`DETOKENIZE`), else 0 | 0 |
//! | 60..64 | `ext_len: u32` | block bytes, 0 = none (then `ext_offset` must be 0) | 0 | input bytes ≥ 1 (`TOKENIZE`/`DETOKENIZE`), else 0 | 0 |
//!
//! Every byte is used; growth goes through the versioned extension block (new options), the
//! reserved flag bits (new behaviours) and `version` (a new layout). Fields an opcode does not
//! use must be zero, so a later version can give them meaning without misreading old clients.
//!
//! A descriptor read from shared memory is a private copy (the ring copies each entry once);
//! [`Descriptor::validate`] checks everything decidable without the data area, and
//! [`Request::check_regions`] checks the byte ranges against the regions' sizes.

use crate::pod::Pod;
use crate::status::StatusCode;

/// Layout version of [`Descriptor`] this build writes and accepts.
pub const DESCRIPTOR_VERSION: u8 = 1;
/// Largest `n_samples` a descriptor may ask for.
pub const MAX_SAMPLES: u16 = 64;
/// `max_tokens` used by [`GenerateRequest::new`].
pub const DEFAULT_MAX_TOKENS: u32 = 256;

/// One submission entry. Construct with [`Descriptor::nop`], [`Descriptor::generate`],
/// [`Descriptor::cancel`] or [`Descriptor::admin`]; read with [`Descriptor::validate`].
#[derive(Clone, Copy, PartialEq, Default)]
#[repr(C, align(64))]
pub struct Descriptor {
    opcode: u8,
    version: u8,
    flags: u16,
    kind: u8,
    priority: i8,
    n_samples: u16,
    tag: u64,
    region_offset: u32,
    region_len: u32,
    max_tokens: u32,
    temperature: f32,
    top_k: u32,
    top_p: f32,
    min_p: f32,
    repetition_penalty: f32,
    word: u64,
    ext_offset: u32,
    ext_len: u32,
}

const _: () = assert!(core::mem::size_of::<Descriptor>() == 64);
const _: () = assert!(core::mem::align_of::<Descriptor>() == 64);
const _: () = {
    use core::mem::offset_of;
    assert!(offset_of!(Descriptor, opcode) == 0);
    assert!(offset_of!(Descriptor, version) == 1);
    assert!(offset_of!(Descriptor, flags) == 2);
    assert!(offset_of!(Descriptor, kind) == 4);
    assert!(offset_of!(Descriptor, priority) == 5);
    assert!(offset_of!(Descriptor, n_samples) == 6);
    assert!(offset_of!(Descriptor, tag) == 8);
    assert!(offset_of!(Descriptor, region_offset) == 16);
    assert!(offset_of!(Descriptor, region_len) == 20);
    assert!(offset_of!(Descriptor, max_tokens) == 24);
    assert!(offset_of!(Descriptor, temperature) == 28);
    assert!(offset_of!(Descriptor, top_k) == 32);
    assert!(offset_of!(Descriptor, top_p) == 36);
    assert!(offset_of!(Descriptor, min_p) == 40);
    assert!(offset_of!(Descriptor, repetition_penalty) == 44);
    assert!(offset_of!(Descriptor, word) == 48);
    assert!(offset_of!(Descriptor, ext_offset) == 56);
    assert!(offset_of!(Descriptor, ext_len) == 60);
};

// SAFETY: `repr(C)` of integers and `f32` only (every bit pattern valid, NaN included), laid out
// without padding (asserted above: the fields tile 0..64), no pointers, no drop glue.
unsafe impl Pod for Descriptor {}

impl core::fmt::Debug for Descriptor {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Descriptor")
            .field("opcode", &self.opcode)
            .field("version", &self.version)
            .field("flags", &format_args!("{:#06x}", self.flags))
            .field("kind", &self.kind)
            .field("priority", &self.priority)
            .field("n_samples", &self.n_samples)
            .field("tag", &self.tag)
            .field("region", &(self.region_offset, self.region_len))
            .field("max_tokens", &self.max_tokens)
            .field("temperature", &self.temperature)
            .field("top_k", &self.top_k)
            .field("top_p", &self.top_p)
            .field("min_p", &self.min_p)
            .field("repetition_penalty", &self.repetition_penalty)
            .field("word", &self.word)
            .field("ext", &(self.ext_offset, self.ext_len))
            .finish()
    }
}

/// What a descriptor asks for (byte 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Opcode {
    /// Echo `word` back in a `NOP_REPLY` completion (round-trip measurement).
    Nop = 0,
    /// Start a generation.
    Generate = 1,
    /// Cancel the request whose tag is in `tag`.
    Cancel = 2,
    /// Run an admin query; the reply goes to the output region.
    Admin = 3,
}

impl Opcode {
    /// Decode byte 0; `None` for unknown opcodes.
    pub const fn from_u8(value: u8) -> Option<Self> {
        Some(match value {
            0 => Self::Nop,
            1 => Self::Generate,
            2 => Self::Cancel,
            3 => Self::Admin,
            _ => return None,
        })
    }
}

/// How the prompt bytes of a `GENERATE` are encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum PromptKind {
    /// UTF-8 text, tokenized by the daemon.
    Text = 0,
    /// Token ids, `u32` little-endian, 4 bytes each.
    TokenIds = 1,
    /// UTF-8 JSON array of `{"role": ..., "content": ...}` messages, rendered through the
    /// model's chat template.
    ChatJson = 2,
}

impl PromptKind {
    /// Decode; `None` for unknown kinds.
    pub const fn from_u8(value: u8) -> Option<Self> {
        Some(match value {
            0 => Self::Text,
            1 => Self::TokenIds,
            2 => Self::ChatJson,
            _ => return None,
        })
    }
}

/// What an `ADMIN` descriptor asks for. Replies are UTF-8 JSON in the output region.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum AdminQuery {
    /// Model, backend, device, arenas, page size, uptime.
    Status = 0,
    /// Connected clients with ring occupancy and counters.
    Clients = 1,
    /// Throughput and latency percentiles.
    Stats = 2,
    /// Ask the daemon to drain and exit (subject to its access policy).
    Shutdown = 3,
    /// The served model and the daemon's limits (name, architecture, dtype, vocabulary,
    /// context, batch, sample and stop-list limits) as JSON.
    ModelInfo = 4,
    /// Tokenize the UTF-8 text at the descriptor's input range with the model's tokenizer; the
    /// reply is the ids as `u32` little-endian. [`AdminOptions::ADD_SPECIAL_TOKENS`] adds the
    /// special tokens a text prompt gets.
    Tokenize = 5,
    /// Detokenize the `u32` little-endian ids at the descriptor's input range; the reply is
    /// UTF-8 text. [`AdminOptions::SKIP_SPECIAL_TOKENS`] leaves special tokens out.
    Detokenize = 6,
    /// The token ledger of recent samples: each sample's sums and its per-token records
    /// (latency, observation lag, device time, launches, syncs, copies), as JSON. The oldest
    /// samples are left out of a reply that would not fit the reply buffer.
    Ledger = 7,
}

impl AdminQuery {
    /// Whether this query reads an input range (`ext_offset`/`ext_len`) and options (`word`).
    pub const fn takes_input(self) -> bool {
        matches!(self, Self::Tokenize | Self::Detokenize)
    }
}

/// Options of a `TOKENIZE` / `DETOKENIZE` admin query (descriptor bytes 48..56). Bits not
/// defined here must be zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct AdminOptions(u64);

impl AdminOptions {
    /// `TOKENIZE`: add special tokens (e.g. BOS) as a text prompt gets them.
    pub const ADD_SPECIAL_TOKENS: Self = Self(1 << 0);
    /// `DETOKENIZE`: leave special tokens out of the text.
    pub const SKIP_SPECIAL_TOKENS: Self = Self(1 << 1);
    /// Every defined bit.
    pub const ALL: Self = Self(0b11);
    /// No option.
    pub const NONE: Self = Self(0);

    /// Raw bits.
    pub const fn bits(self) -> u64 {
        self.0
    }

    /// From raw bits; `None` if undefined bits are set.
    pub const fn from_bits(bits: u64) -> Option<Self> {
        if bits & !Self::ALL.0 != 0 {
            None
        } else {
            Some(Self(bits))
        }
    }

    /// Whether every bit of `other` is set.
    pub const fn contains(self, other: Self) -> bool {
        self.0 & other.0 == other.0
    }

    /// Both sets of bits.
    pub const fn union(self, other: Self) -> Self {
        Self(self.0 | other.0)
    }
}

impl AdminQuery {
    /// Decode; `None` for unknown kinds.
    pub const fn from_u8(value: u8) -> Option<Self> {
        Some(match value {
            0 => Self::Status,
            1 => Self::Clients,
            2 => Self::Stats,
            3 => Self::Shutdown,
            4 => Self::ModelInfo,
            5 => Self::Tokenize,
            6 => Self::Detokenize,
            7 => Self::Ledger,
            _ => return None,
        })
    }
}

/// Behaviour bits of a `GENERATE` (bytes 2..4). Bits not defined here must be zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct GenerateFlags(u16);

impl GenerateFlags {
    /// Stream `TOKENS` completions (token ids as they are sampled).
    pub const STREAM_TOKENS: Self = Self(1 << 0);
    /// Stream `TEXT` completions (detokenized UTF-8 pieces).
    pub const STREAM_TEXT: Self = Self(1 << 1);
    /// Fill the logprob of each sampled token in `TOKENS` completions (else NaN).
    pub const LOGPROBS: Self = Self(1 << 2);
    /// Every bit this version defines.
    pub const ALL: Self = Self(0b111);
    /// No bit set: only the final `DONE` (or `ERROR`) is sent.
    pub const NONE: Self = Self(0);

    /// The raw bits.
    pub const fn bits(self) -> u16 {
        self.0
    }

    /// From raw bits, refusing bits this version does not define.
    pub const fn from_bits(bits: u16) -> Option<Self> {
        if bits & !Self::ALL.0 != 0 {
            None
        } else {
            Some(Self(bits))
        }
    }

    /// Whether every bit of `other` is set in `self`.
    pub const fn contains(self, other: Self) -> bool {
        self.0 & other.0 == other.0
    }

    /// Union.
    pub const fn union(self, other: Self) -> Self {
        Self(self.0 | other.0)
    }
}

impl core::ops::BitOr for GenerateFlags {
    type Output = Self;
    fn bitor(self, rhs: Self) -> Self {
        self.union(rhs)
    }
}

/// A byte range `[offset, offset + len)` inside one data region.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ByteRange {
    /// First byte, relative to the region start.
    pub offset: u32,
    /// Length in bytes.
    pub len: u32,
}

impl ByteRange {
    /// A range.
    pub const fn new(offset: u32, len: u32) -> Self {
        Self { offset, len }
    }

    /// Whether the range lies inside a region of `region_len` bytes (see [`check_range`]).
    pub fn fits(self, region_len: u64) -> bool {
        check_range(self.offset, self.len, region_len).is_ok()
    }

    /// The range as `usize` bounds, for slicing a private copy of the region.
    pub fn as_usize_range(self) -> core::ops::Range<usize> {
        let start = self.offset as usize;
        start..start + self.len as usize
    }
}

/// A byte range does not lie inside its region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RangeError {
    /// Offset asked for.
    pub offset: u64,
    /// Length asked for.
    pub len: u64,
    /// Size of the region.
    pub region_len: u64,
}

impl core::fmt::Display for RangeError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "byte range {}+{} outside a region of {} bytes",
            self.offset, self.len, self.region_len
        )
    }
}

impl std::error::Error for RangeError {}

/// Check `[offset, offset + len)` against a region of `region_len` bytes without overflow
/// (the sum is computed in `u64` from `u32` parts, so it cannot wrap).
pub fn check_range(offset: u32, len: u32, region_len: u64) -> Result<(), RangeError> {
    let end = u64::from(offset) + u64::from(len);
    if end <= region_len {
        Ok(())
    } else {
        Err(RangeError {
            offset: offset.into(),
            len: len.into(),
            region_len,
        })
    }
}

/// Sampling parameters carried in the descriptor itself.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SamplingParams {
    /// Softmax temperature; 0 means greedy.
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens; 0 disables.
    pub top_k: u32,
    /// Nucleus mass in (0, 1]; 1 disables.
    pub top_p: f32,
    /// Drop tokens below `min_p × p(max)`; 0 disables.
    pub min_p: f32,
    /// Penalty on already-seen tokens (CTRL style); 1 disables.
    pub repetition_penalty: f32,
    /// Seed of this request's random stream (same seed and prompt → same tokens).
    pub seed: u64,
}

impl Default for SamplingParams {
    /// Plain sampling at temperature 1 with every filter off, seed 0.
    fn default() -> Self {
        Self {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            seed: 0,
        }
    }
}

impl SamplingParams {
    /// Greedy decoding (temperature 0).
    pub fn greedy() -> Self {
        Self {
            temperature: 0.0,
            ..Self::default()
        }
    }

    /// Range checks, with the specific error for the first bad field.
    pub fn validate(&self) -> Result<(), DescriptorError> {
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return Err(DescriptorError::BadTemperature(self.temperature));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(DescriptorError::BadTopP(self.top_p));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return Err(DescriptorError::BadMinP(self.min_p));
        }
        if !(self.repetition_penalty.is_finite() && self.repetition_penalty > 0.0) {
            return Err(DescriptorError::BadRepetitionPenalty(
                self.repetition_penalty,
            ));
        }
        Ok(())
    }
}

/// A validated (or to-be-encoded) generation request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GenerateRequest {
    /// Client-chosen tag; every completion of this request carries it.
    pub tag: u64,
    /// Encoding of the prompt bytes.
    pub prompt_kind: PromptKind,
    /// Prompt bytes in the input region.
    pub prompt: ByteRange,
    /// Most tokens to generate per sample (≥ 1).
    pub max_tokens: u32,
    /// Sampling parameters.
    pub sampling: SamplingParams,
    /// Samples sharing the prompt (1..=[`MAX_SAMPLES`]); completions carry the sample index.
    pub n_samples: u16,
    /// Scheduling priority; higher first, 0 normal, negative for background work.
    pub priority: i8,
    /// What to stream.
    pub flags: GenerateFlags,
    /// Extension block (stop conditions, penalties, ...) in the input region, if any.
    pub extension: Option<ByteRange>,
}

impl GenerateRequest {
    /// A request with default sampling, one sample, [`DEFAULT_MAX_TOKENS`], streaming both
    /// token ids and text, and no extension block.
    pub fn new(tag: u64, prompt_kind: PromptKind, prompt: ByteRange) -> Self {
        Self {
            tag,
            prompt_kind,
            prompt,
            max_tokens: DEFAULT_MAX_TOKENS,
            sampling: SamplingParams::default(),
            n_samples: 1,
            priority: 0,
            flags: GenerateFlags::STREAM_TOKENS | GenerateFlags::STREAM_TEXT,
            extension: None,
        }
    }

    /// Every check that needs no data area (the same ones [`Descriptor::validate`] runs).
    pub fn validate(&self) -> Result<(), DescriptorError> {
        if self.prompt.len == 0 {
            return Err(DescriptorError::EmptyPrompt);
        }
        if self.prompt_kind == PromptKind::TokenIds && self.prompt.len % 4 != 0 {
            return Err(DescriptorError::MisalignedTokenIds(self.prompt.len));
        }
        if self.max_tokens == 0 {
            return Err(DescriptorError::BadMaxTokens);
        }
        self.sampling.validate()?;
        if self.n_samples == 0 || self.n_samples > MAX_SAMPLES {
            return Err(DescriptorError::BadSampleCount(self.n_samples));
        }
        if let Some(ext) = self.extension {
            if ext.len == 0 {
                return Err(DescriptorError::EmptyExtension);
            }
        }
        Ok(())
    }
}

/// A descriptor that passed [`Descriptor::validate`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Request {
    /// Echo `payload` back.
    Nop {
        /// Tag echoed in the reply.
        tag: u64,
        /// Payload echoed in the reply (e.g. a send timestamp).
        payload: u64,
    },
    /// Start a generation.
    Generate(GenerateRequest),
    /// Cancel the request tagged `target`.
    Cancel {
        /// Tag of the request to cancel.
        target: u64,
    },
    /// Admin query.
    Admin {
        /// Tag of the `ADMIN_REPLY`.
        tag: u64,
        /// What to report or do.
        query: AdminQuery,
        /// Where the reply may go in the output region (`len` is the capacity).
        reply: ByteRange,
        /// `TOKENIZE` / `DETOKENIZE`: the bytes to convert, in the input region (never empty);
        /// `None` for the other queries.
        input: Option<ByteRange>,
        /// `TOKENIZE` / `DETOKENIZE` options; `NONE` for the other queries.
        options: AdminOptions,
    },
}

impl Request {
    /// The tag completions for this request carry (for `Cancel`: the target's tag).
    pub fn tag(&self) -> u64 {
        match *self {
            Request::Nop { tag, .. } | Request::Admin { tag, .. } => tag,
            Request::Generate(g) => g.tag,
            Request::Cancel { target } => target,
        }
    }

    /// Check every byte range against the data regions' sizes. Call on the daemon side with
    /// the sizes from the layout it created, before copying anything out of the data area.
    pub fn check_regions(&self, input_len: u64, output_len: u64) -> Result<(), DescriptorError> {
        match self {
            Request::Generate(g) => {
                check_range(g.prompt.offset, g.prompt.len, input_len)
                    .map_err(DescriptorError::PromptOutOfRange)?;
                if let Some(ext) = g.extension {
                    check_range(ext.offset, ext.len, input_len)
                        .map_err(DescriptorError::ExtensionOutOfRange)?;
                }
                Ok(())
            }
            Request::Admin { reply, input, .. } => {
                check_range(reply.offset, reply.len, output_len)
                    .map_err(DescriptorError::ReplyOutOfRange)?;
                if let Some(input) = input {
                    check_range(input.offset, input.len, input_len)
                        .map_err(DescriptorError::AdminInputOutOfRange)?;
                }
                Ok(())
            }
            Request::Nop { .. } | Request::Cancel { .. } => Ok(()),
        }
    }
}

/// Why a descriptor was refused. Each maps to a wire [`StatusCode`] via
/// [`DescriptorError::status`], which the daemon sends back in an `ERROR` completion.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub enum DescriptorError {
    /// Unknown opcode byte.
    UnknownOpcode(u8),
    /// Layout version not [`DESCRIPTOR_VERSION`].
    UnsupportedVersion(u8),
    /// Flag bits this version does not define (the offending bits).
    ReservedFlags(u16),
    /// A field unused by the opcode is not zero (byte offset of the field).
    ReservedNonZero {
        /// Byte offset of the first non-zero unused field.
        field_offset: usize,
    },
    /// Unknown prompt kind.
    BadPromptKind(u8),
    /// Zero-length prompt.
    EmptyPrompt,
    /// Token-id prompt whose length is not a multiple of 4.
    MisalignedTokenIds(u32),
    /// Prompt outside the input region.
    PromptOutOfRange(RangeError),
    /// `max_tokens` is zero.
    BadMaxTokens,
    /// Temperature not finite or negative.
    BadTemperature(f32),
    /// `top_p` not in (0, 1].
    BadTopP(f32),
    /// `min_p` not in [0, 1].
    BadMinP(f32),
    /// Repetition penalty not finite and > 0.
    BadRepetitionPenalty(f32),
    /// `n_samples` zero or above [`MAX_SAMPLES`].
    BadSampleCount(u16),
    /// `ext_len` is 0 but `ext_offset` is not.
    EmptyExtension,
    /// Extension block outside the input region.
    ExtensionOutOfRange(RangeError),
    /// Unknown admin query.
    BadAdminQuery(u8),
    /// Admin reply buffer outside the output region.
    ReplyOutOfRange(RangeError),
    /// `TOKENIZE` / `DETOKENIZE` without input bytes.
    EmptyAdminInput,
    /// `TOKENIZE` / `DETOKENIZE` input outside the input region.
    AdminInputOutOfRange(RangeError),
    /// Undefined [`AdminOptions`] bits.
    BadAdminOptions(u64),
}

impl DescriptorError {
    /// The wire status code for this error.
    pub const fn status(&self) -> StatusCode {
        match self {
            Self::UnknownOpcode(_) => StatusCode::UnknownOpcode,
            Self::UnsupportedVersion(_) => StatusCode::UnsupportedVersion,
            Self::ReservedFlags(_) => StatusCode::ReservedFlags,
            Self::ReservedNonZero { .. } => StatusCode::ReservedNonZero,
            Self::BadPromptKind(_) => StatusCode::BadPromptKind,
            Self::EmptyPrompt => StatusCode::EmptyPrompt,
            Self::MisalignedTokenIds(_) => StatusCode::MisalignedTokenIds,
            Self::PromptOutOfRange(_) => StatusCode::PromptOutOfRange,
            Self::BadMaxTokens => StatusCode::BadMaxTokens,
            Self::BadTemperature(_) => StatusCode::BadTemperature,
            Self::BadTopP(_) => StatusCode::BadTopP,
            Self::BadMinP(_) => StatusCode::BadMinP,
            Self::BadRepetitionPenalty(_) => StatusCode::BadRepetitionPenalty,
            Self::BadSampleCount(_) => StatusCode::BadSampleCount,
            Self::EmptyExtension => StatusCode::BadExtension,
            Self::ExtensionOutOfRange(_) => StatusCode::ExtensionOutOfRange,
            Self::BadAdminQuery(_) => StatusCode::BadAdminQuery,
            Self::ReplyOutOfRange(_) => StatusCode::ReplyOutOfRange,
            Self::EmptyAdminInput => StatusCode::EmptyPrompt,
            Self::AdminInputOutOfRange(_) => StatusCode::PromptOutOfRange,
            Self::BadAdminOptions(_) => StatusCode::ReservedFlags,
        }
    }
}

impl core::fmt::Display for DescriptorError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::UnknownOpcode(v) => write!(f, "unknown opcode {v}"),
            Self::UnsupportedVersion(v) => {
                write!(f, "descriptor version {v}, expected {DESCRIPTOR_VERSION}")
            }
            Self::ReservedFlags(bits) => write!(f, "undefined flag bits {bits:#06x}"),
            Self::ReservedNonZero { field_offset } => {
                write!(f, "unused field at byte {field_offset} is not zero")
            }
            Self::BadPromptKind(k) => write!(f, "unknown prompt kind {k}"),
            Self::EmptyPrompt => write!(f, "empty prompt"),
            Self::MisalignedTokenIds(len) => {
                write!(f, "token-id prompt of {len} bytes is not a multiple of 4")
            }
            Self::PromptOutOfRange(e) => write!(f, "prompt: {e}"),
            Self::BadMaxTokens => write!(f, "max_tokens must be at least 1"),
            Self::BadTemperature(v) => write!(f, "temperature {v} must be finite and >= 0"),
            Self::BadTopP(v) => write!(f, "top_p {v} must be in (0, 1]"),
            Self::BadMinP(v) => write!(f, "min_p {v} must be in [0, 1]"),
            Self::BadRepetitionPenalty(v) => {
                write!(f, "repetition penalty {v} must be finite and > 0")
            }
            Self::BadSampleCount(n) => write!(f, "n_samples {n} must be in 1..={MAX_SAMPLES}"),
            Self::EmptyExtension => write!(f, "extension length 0 with a non-zero offset"),
            Self::ExtensionOutOfRange(e) => write!(f, "extension block: {e}"),
            Self::BadAdminQuery(k) => write!(f, "unknown admin query {k}"),
            Self::ReplyOutOfRange(e) => write!(f, "admin reply buffer: {e}"),
            Self::EmptyAdminInput => write!(f, "tokenize/detokenize input is empty"),
            Self::AdminInputOutOfRange(e) => write!(f, "tokenize/detokenize input: {e}"),
            Self::BadAdminOptions(bits) => write!(f, "undefined admin option bits {bits:#x}"),
        }
    }
}

impl std::error::Error for DescriptorError {}

impl Descriptor {
    fn blank(opcode: Opcode, tag: u64) -> Self {
        Self {
            opcode: opcode as u8,
            version: DESCRIPTOR_VERSION,
            tag,
            ..Self::default()
        }
    }

    /// A `NOP` that the daemon echoes as `NOP_REPLY` carrying `tag` and `payload`.
    pub fn nop(tag: u64, payload: u64) -> Self {
        Self {
            word: payload,
            ..Self::blank(Opcode::Nop, tag)
        }
    }

    /// A `CANCEL` of the request tagged `target`.
    pub fn cancel(target: u64) -> Self {
        Self::blank(Opcode::Cancel, target)
    }

    /// An `ADMIN` query whose reply may use `reply` in the output region. For the queries
    /// that take input ([`AdminQuery::takes_input`]) use [`Descriptor::admin_with_input`].
    pub fn admin(tag: u64, query: AdminQuery, reply: ByteRange) -> Self {
        Self {
            kind: query as u8,
            region_offset: reply.offset,
            region_len: reply.len,
            ..Self::blank(Opcode::Admin, tag)
        }
    }

    /// A `TOKENIZE` / `DETOKENIZE` admin query over `input` (in the input region).
    pub fn admin_with_input(
        tag: u64,
        query: AdminQuery,
        reply: ByteRange,
        input: ByteRange,
        options: AdminOptions,
    ) -> Self {
        Self {
            word: options.bits(),
            ext_offset: input.offset,
            ext_len: input.len,
            ..Self::admin(tag, query, reply)
        }
    }

    /// A `GENERATE`. Checks the request first so a client never sends what the daemon
    /// would refuse for reasons visible here (ranges are checked later, against the layout).
    pub fn generate(request: &GenerateRequest) -> Result<Self, DescriptorError> {
        request.validate()?;
        let s = &request.sampling;
        let ext = request.extension.unwrap_or_default();
        Ok(Self {
            flags: request.flags.bits(),
            kind: request.prompt_kind as u8,
            priority: request.priority,
            n_samples: request.n_samples,
            region_offset: request.prompt.offset,
            region_len: request.prompt.len,
            max_tokens: request.max_tokens,
            temperature: s.temperature,
            top_k: s.top_k,
            top_p: s.top_p,
            min_p: s.min_p,
            repetition_penalty: s.repetition_penalty,
            word: s.seed,
            ext_offset: ext.offset,
            ext_len: ext.len,
            ..Self::blank(Opcode::Generate, request.tag)
        })
    }

    /// Encode any validated request (inverse of [`Descriptor::validate`]).
    pub fn from_request(request: &Request) -> Result<Self, DescriptorError> {
        Ok(match *request {
            Request::Nop { tag, payload } => Self::nop(tag, payload),
            Request::Generate(ref g) => Self::generate(g)?,
            Request::Cancel { target } => Self::cancel(target),
            Request::Admin {
                tag,
                query,
                reply,
                input,
                options,
            } => match input {
                Some(input) => Self::admin_with_input(tag, query, reply, input, options),
                None => Self::admin(tag, query, reply),
            },
        })
    }

    /// Raw opcode byte (possibly unknown).
    pub fn opcode_byte(&self) -> u8 {
        self.opcode
    }

    /// Decoded opcode, if known.
    pub fn opcode(&self) -> Option<Opcode> {
        Opcode::from_u8(self.opcode)
    }

    /// Layout version byte.
    pub fn version(&self) -> u8 {
        self.version
    }

    /// Raw flags.
    pub fn flags(&self) -> u16 {
        self.flags
    }

    /// The tag (for `CANCEL`: the target's tag). Useful for an `ERROR` reply even when
    /// validation fails.
    pub fn tag(&self) -> u64 {
        self.tag
    }

    /// Set the tag (clients usually assign tags when submitting).
    pub fn set_tag(&mut self, tag: u64) {
        self.tag = tag;
    }

    /// The 64 bytes, for hex dumps and fuzzing.
    pub fn to_bytes(&self) -> [u8; 64] {
        let mut out = [0u8; 64];
        out[0] = self.opcode;
        out[1] = self.version;
        out[2..4].copy_from_slice(&self.flags.to_ne_bytes());
        out[4] = self.kind;
        out[5] = self.priority as u8;
        out[6..8].copy_from_slice(&self.n_samples.to_ne_bytes());
        out[8..16].copy_from_slice(&self.tag.to_ne_bytes());
        out[16..20].copy_from_slice(&self.region_offset.to_ne_bytes());
        out[20..24].copy_from_slice(&self.region_len.to_ne_bytes());
        out[24..28].copy_from_slice(&self.max_tokens.to_ne_bytes());
        out[28..32].copy_from_slice(&self.temperature.to_ne_bytes());
        out[32..36].copy_from_slice(&self.top_k.to_ne_bytes());
        out[36..40].copy_from_slice(&self.top_p.to_ne_bytes());
        out[40..44].copy_from_slice(&self.min_p.to_ne_bytes());
        out[44..48].copy_from_slice(&self.repetition_penalty.to_ne_bytes());
        out[48..56].copy_from_slice(&self.word.to_ne_bytes());
        out[56..60].copy_from_slice(&self.ext_offset.to_ne_bytes());
        out[60..64].copy_from_slice(&self.ext_len.to_ne_bytes());
        out
    }

    /// From 64 raw bytes (any bytes: this never fails; [`Descriptor::validate`] judges them).
    pub fn from_bytes(b: &[u8; 64]) -> Self {
        let u16_at = |i: usize| u16::from_ne_bytes([b[i], b[i + 1]]);
        let u32_at = |i: usize| u32::from_ne_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let u64_at = |i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&b[i..i + 8]);
            u64::from_ne_bytes(w)
        };
        Self {
            opcode: b[0],
            version: b[1],
            flags: u16_at(2),
            kind: b[4],
            priority: b[5] as i8,
            n_samples: u16_at(6),
            tag: u64_at(8),
            region_offset: u32_at(16),
            region_len: u32_at(20),
            max_tokens: u32_at(24),
            temperature: f32::from_bits(u32_at(28)),
            top_k: u32_at(32),
            top_p: f32::from_bits(u32_at(36)),
            min_p: f32::from_bits(u32_at(40)),
            repetition_penalty: f32::from_bits(u32_at(44)),
            word: u64_at(48),
            ext_offset: u32_at(56),
            ext_len: u32_at(60),
        }
    }

    /// First non-zero field among those the opcode leaves unused, as a byte offset.
    fn first_nonzero_unused(&self, opcode: Opcode) -> Option<usize> {
        // (byte offset, is the field non-zero) for fields 2..64 other than the tag.
        let fields: [(usize, bool); 15] = [
            (2, self.flags != 0),
            (4, self.kind != 0),
            (5, self.priority != 0),
            (6, self.n_samples != 0),
            (16, self.region_offset != 0),
            (20, self.region_len != 0),
            (24, self.max_tokens != 0),
            (28, self.temperature.to_bits() != 0),
            (32, self.top_k != 0),
            (36, self.top_p.to_bits() != 0),
            (40, self.min_p.to_bits() != 0),
            (44, self.repetition_penalty.to_bits() != 0),
            (48, self.word != 0),
            (56, self.ext_offset != 0),
            (60, self.ext_len != 0),
        ];
        let used: &[usize] = match opcode {
            Opcode::Nop => &[48],
            Opcode::Cancel => &[],
            Opcode::Admin
                if AdminQuery::from_u8(self.kind).is_some_and(AdminQuery::takes_input) =>
            {
                &[4, 16, 20, 48, 56, 60]
            }
            Opcode::Admin => &[4, 16, 20],
            Opcode::Generate => return None,
        };
        fields
            .iter()
            .find(|(at, nonzero)| *nonzero && !used.contains(at))
            .map(|(at, _)| *at)
    }

    /// Every check possible without the data area: opcode, version, flags, kinds, parameter
    /// ranges, unused fields zero. Byte ranges are checked by [`Request::check_regions`].
    pub fn validate(&self) -> Result<Request, DescriptorError> {
        let opcode =
            Opcode::from_u8(self.opcode).ok_or(DescriptorError::UnknownOpcode(self.opcode))?;
        if self.version != DESCRIPTOR_VERSION {
            return Err(DescriptorError::UnsupportedVersion(self.version));
        }
        if opcode != Opcode::Generate && self.flags != 0 {
            return Err(DescriptorError::ReservedFlags(self.flags));
        }
        if let Some(field_offset) = self.first_nonzero_unused(opcode) {
            return Err(DescriptorError::ReservedNonZero { field_offset });
        }
        match opcode {
            Opcode::Nop => Ok(Request::Nop {
                tag: self.tag,
                payload: self.word,
            }),
            Opcode::Cancel => Ok(Request::Cancel { target: self.tag }),
            Opcode::Admin => {
                let query = AdminQuery::from_u8(self.kind)
                    .ok_or(DescriptorError::BadAdminQuery(self.kind))?;
                let (input, options) = if query.takes_input() {
                    if self.ext_len == 0 {
                        return Err(DescriptorError::EmptyAdminInput);
                    }
                    let options = AdminOptions::from_bits(self.word)
                        .ok_or(DescriptorError::BadAdminOptions(self.word))?;
                    (Some(ByteRange::new(self.ext_offset, self.ext_len)), options)
                } else {
                    (None, AdminOptions::NONE)
                };
                Ok(Request::Admin {
                    tag: self.tag,
                    query,
                    reply: ByteRange::new(self.region_offset, self.region_len),
                    input,
                    options,
                })
            }
            Opcode::Generate => {
                let flags = GenerateFlags::from_bits(self.flags).ok_or(
                    DescriptorError::ReservedFlags(self.flags & !GenerateFlags::ALL.bits()),
                )?;
                let prompt_kind = PromptKind::from_u8(self.kind)
                    .ok_or(DescriptorError::BadPromptKind(self.kind))?;
                let extension = match (self.ext_offset, self.ext_len) {
                    (0, 0) => None,
                    (_, 0) => return Err(DescriptorError::EmptyExtension),
                    (offset, len) => Some(ByteRange::new(offset, len)),
                };
                let request = GenerateRequest {
                    tag: self.tag,
                    prompt_kind,
                    prompt: ByteRange::new(self.region_offset, self.region_len),
                    max_tokens: self.max_tokens,
                    sampling: SamplingParams {
                        temperature: self.temperature,
                        top_k: self.top_k,
                        top_p: self.top_p,
                        min_p: self.min_p,
                        repetition_penalty: self.repetition_penalty,
                        seed: self.word,
                    },
                    n_samples: self.n_samples,
                    priority: self.priority,
                    flags,
                    extension,
                };
                request.validate()?;
                Ok(Request::Generate(request))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample_generate() -> GenerateRequest {
        GenerateRequest {
            max_tokens: 32,
            sampling: SamplingParams {
                temperature: 0.7,
                top_k: 40,
                top_p: 0.9,
                min_p: 0.05,
                repetition_penalty: 1.1,
                seed: 0xdead_beef_0123,
            },
            n_samples: 3,
            priority: -2,
            flags: GenerateFlags::STREAM_TEXT | GenerateFlags::LOGPROBS,
            extension: Some(ByteRange::new(4096, 64)),
            ..GenerateRequest::new(77, PromptKind::TokenIds, ByteRange::new(128, 40))
        }
    }

    #[test]
    fn every_opcode_round_trips_through_bytes_and_validate() {
        let requests = [
            Request::Nop {
                tag: 1,
                payload: u64::MAX,
            },
            Request::Generate(sample_generate()),
            Request::Cancel { target: 9 },
            Request::Admin {
                tag: 3,
                query: AdminQuery::Stats,
                reply: ByteRange::new(0, 65536),
                input: None,
                options: AdminOptions::NONE,
            },
            Request::Admin {
                tag: 4,
                query: AdminQuery::Tokenize,
                reply: ByteRange::new(64, 4096),
                input: Some(ByteRange::new(128, 17)),
                options: AdminOptions::ADD_SPECIAL_TOKENS,
            },
            Request::Admin {
                tag: 5,
                query: AdminQuery::Detokenize,
                reply: ByteRange::new(0, 4096),
                input: Some(ByteRange::new(0, 8)),
                options: AdminOptions::SKIP_SPECIAL_TOKENS,
            },
        ];
        for request in requests {
            let d = Descriptor::from_request(&request).expect("encodes");
            let back = Descriptor::from_bytes(&d.to_bytes());
            assert_eq!(back.to_bytes(), d.to_bytes());
            assert_eq!(back.validate(), Ok(request));
            assert_eq!(d.version(), DESCRIPTOR_VERSION);
        }
    }

    #[test]
    fn parameter_ranges_are_refused_with_specific_codes() {
        let base = sample_generate();
        let cases: Vec<(GenerateRequest, StatusCode)> = vec![
            (
                GenerateRequest {
                    max_tokens: 0,
                    ..base
                },
                StatusCode::BadMaxTokens,
            ),
            (
                GenerateRequest {
                    n_samples: 0,
                    ..base
                },
                StatusCode::BadSampleCount,
            ),
            (
                GenerateRequest {
                    n_samples: MAX_SAMPLES + 1,
                    ..base
                },
                StatusCode::BadSampleCount,
            ),
            (
                GenerateRequest {
                    prompt: ByteRange::new(0, 0),
                    ..base
                },
                StatusCode::EmptyPrompt,
            ),
            (
                GenerateRequest {
                    prompt: ByteRange::new(0, 6),
                    ..base
                },
                StatusCode::MisalignedTokenIds,
            ),
        ];
        let sampling = |f: fn(&mut SamplingParams)| {
            let mut r = base;
            f(&mut r.sampling);
            r
        };
        let sampling_cases = [
            (
                sampling(|s| s.temperature = -0.1),
                StatusCode::BadTemperature,
            ),
            (
                sampling(|s| s.temperature = f32::NAN),
                StatusCode::BadTemperature,
            ),
            (
                sampling(|s| s.temperature = f32::INFINITY),
                StatusCode::BadTemperature,
            ),
            (sampling(|s| s.top_p = 0.0), StatusCode::BadTopP),
            (sampling(|s| s.top_p = 1.0001), StatusCode::BadTopP),
            (sampling(|s| s.top_p = f32::NAN), StatusCode::BadTopP),
            (sampling(|s| s.min_p = -0.01), StatusCode::BadMinP),
            (sampling(|s| s.min_p = 1.5), StatusCode::BadMinP),
            (sampling(|s| s.min_p = f32::NAN), StatusCode::BadMinP),
            (
                sampling(|s| s.repetition_penalty = 0.0),
                StatusCode::BadRepetitionPenalty,
            ),
            (
                sampling(|s| s.repetition_penalty = f32::NAN),
                StatusCode::BadRepetitionPenalty,
            ),
        ];
        for (request, code) in cases.into_iter().chain(sampling_cases) {
            // The safe constructor refuses ...
            let err = Descriptor::generate(&request).expect_err("constructor refuses");
            assert_eq!(err.status(), code, "{request:?}");
            // ... and so does validation of hostile bytes that skipped the constructor.
            let mut raw = Descriptor::generate(&base).expect("base ok");
            raw.max_tokens = request.max_tokens;
            raw.n_samples = request.n_samples;
            raw.region_offset = request.prompt.offset;
            raw.region_len = request.prompt.len;
            raw.temperature = request.sampling.temperature;
            raw.top_p = request.sampling.top_p;
            raw.min_p = request.sampling.min_p;
            raw.repetition_penalty = request.sampling.repetition_penalty;
            assert_eq!(raw.validate().expect_err("refused").status(), code);
        }
        // Edges that are valid.
        for ok in [
            sampling(|s| s.temperature = 0.0),
            sampling(|s| s.top_p = 1.0),
            sampling(|s| s.min_p = 0.0),
            sampling(|s| s.min_p = 1.0),
            GenerateRequest {
                n_samples: MAX_SAMPLES,
                ..base
            },
        ] {
            assert!(Descriptor::generate(&ok).is_ok(), "{ok:?}");
        }
    }

    #[test]
    fn header_errors_unused_fields_and_kinds() {
        let mut d = Descriptor::nop(1, 2);
        d.opcode = 200;
        assert_eq!(d.validate(), Err(DescriptorError::UnknownOpcode(200)));
        let mut d = Descriptor::nop(1, 2);
        d.version = 2;
        assert_eq!(d.validate(), Err(DescriptorError::UnsupportedVersion(2)));
        let mut d = Descriptor::nop(1, 2);
        d.flags = 1;
        assert_eq!(d.validate(), Err(DescriptorError::ReservedFlags(1)));
        let mut d = Descriptor::cancel(5);
        d.max_tokens = 1;
        assert_eq!(
            d.validate(),
            Err(DescriptorError::ReservedNonZero { field_offset: 24 })
        );
        let mut d = Descriptor::admin(1, AdminQuery::Status, ByteRange::new(0, 10));
        d.kind = 9;
        assert_eq!(d.validate(), Err(DescriptorError::BadAdminQuery(9)));
        let mut d = Descriptor::generate(&sample_generate()).expect("ok");
        d.kind = 7;
        assert_eq!(d.validate(), Err(DescriptorError::BadPromptKind(7)));
        let mut d = Descriptor::generate(&sample_generate()).expect("ok");
        d.flags = 0x8000 | GenerateFlags::STREAM_TEXT.bits();
        assert_eq!(d.validate(), Err(DescriptorError::ReservedFlags(0x8000)));
        let mut d = Descriptor::generate(&sample_generate()).expect("ok");
        d.ext_len = 0;
        assert_eq!(d.validate(), Err(DescriptorError::EmptyExtension));
        // Zeroed memory is not a descriptor: version 0 is refused.
        assert_eq!(
            Descriptor::from_bytes(&[0; 64]).validate(),
            Err(DescriptorError::UnsupportedVersion(0))
        );
    }

    #[test]
    fn ranges_are_checked_without_overflow() {
        assert!(check_range(0, 0, 0).is_ok());
        assert!(check_range(10, 6, 16).is_ok());
        assert!(check_range(10, 7, 16).is_err());
        assert!(check_range(u32::MAX, u32::MAX, u64::from(u32::MAX)).is_err());
        assert!(check_range(u32::MAX, u32::MAX, u64::MAX).is_ok());
        let request = Request::Generate(sample_generate());
        assert_eq!(request.check_regions(4096 + 64, 0), Ok(()));
        assert_eq!(
            request.check_regions(4096 + 63, 0).map_err(|e| e.status()),
            Err(StatusCode::ExtensionOutOfRange)
        );
        assert_eq!(
            request.check_regions(100, 0).map_err(|e| e.status()),
            Err(StatusCode::PromptOutOfRange)
        );
        let admin = Request::Admin {
            tag: 0,
            query: AdminQuery::Clients,
            reply: ByteRange::new(8, 8),
            input: None,
            options: AdminOptions::NONE,
        };
        assert!(admin.check_regions(0, 16).is_ok());
        assert_eq!(
            admin.check_regions(0, 15).map_err(|e| e.status()),
            Err(StatusCode::ReplyOutOfRange)
        );
        let tokenize = Request::Admin {
            tag: 0,
            query: AdminQuery::Tokenize,
            reply: ByteRange::new(0, 8),
            input: Some(ByteRange::new(4, 4)),
            options: AdminOptions::NONE,
        };
        assert!(tokenize.check_regions(8, 8).is_ok());
        assert_eq!(
            tokenize.check_regions(7, 8).map_err(|e| e.status()),
            Err(StatusCode::PromptOutOfRange)
        );
    }

    #[test]
    fn admin_input_fields_are_only_for_tokenize_and_detokenize() {
        let reply = ByteRange::new(0, 64);
        let input = ByteRange::new(0, 4);
        // Input fields on a query that takes none are unused fields, refused as such.
        let mut d = Descriptor::admin(1, AdminQuery::Status, reply);
        d.ext_len = 4;
        assert_eq!(
            d.validate(),
            Err(DescriptorError::ReservedNonZero { field_offset: 60 })
        );
        let mut d = Descriptor::admin(1, AdminQuery::ModelInfo, reply);
        d.word = 1;
        assert_eq!(
            d.validate(),
            Err(DescriptorError::ReservedNonZero { field_offset: 48 })
        );
        // Tokenize needs input bytes and defined options only.
        let d = Descriptor::admin(1, AdminQuery::Tokenize, reply);
        assert_eq!(d.validate(), Err(DescriptorError::EmptyAdminInput));
        let mut d = Descriptor::admin_with_input(
            1,
            AdminQuery::Detokenize,
            reply,
            input,
            AdminOptions::SKIP_SPECIAL_TOKENS,
        );
        assert!(d.validate().is_ok());
        d.word = 1 << 40;
        assert_eq!(
            d.validate().map_err(|e| e.status()),
            Err(StatusCode::ReservedFlags)
        );
        assert_eq!(AdminOptions::from_bits(4), None);
        assert!(AdminOptions::ALL.contains(AdminOptions::ADD_SPECIAL_TOKENS));
    }
}

//! The 64-byte completion entry the daemon writes into a client's completion ring.
//!
//! # Layout (ABI; payload little-endian)
//!
//! | bytes | field | meaning |
//! | ---: | --- | --- |
//! | 0..8 | `tag: u64` | request tag (0 for `SHUTDOWN`) |
//! | 8 | `kind: u8` | [`EventKind`] |
//! | 9 | `count: u8` | items in the payload (token ids, text bytes, logprob pairs, message bytes) |
//! | 10..12 | `sample: u16` | sample index within the request (0 when `n_samples` = 1) |
//! | 12..16 | `seq: u32` | per-request event sequence number, from 0, +1 per completion of that tag |
//! | 16..64 | `payload: [u8; 48]` | by kind, below |
//!
//! Payload by kind (offsets relative to the entry):
//!
//! | kind | payload |
//! | --- | --- |
//! | `TOKENS` (1) | 16..40 up to 6 token ids `u32`; 40..64 their logprobs `f32` (NaN unless `LOGPROBS` was asked). `count` 1..=6 |
//! | `TEXT` (2) | 16..64 up to 48 bytes of UTF-8 that start and end on code-point boundaries. `count` 1..=48 |
//! | `DONE` (3) | 16 finish reason `u8`; 18..20 status `u16`; 20..24 prompt tokens `u32`; 24..28 generated tokens `u32`; 32..40 queue µs `u64`; 40..48 time to first token µs `u64`; 48..56 decode µs `u64` (first to last token) |
//! | `ERROR` (4) | 16..18 status `u16`; 20..64 up to 44 bytes of UTF-8 detail, `count` bytes. Terminal for the whole request |
//! | `SHUTDOWN` (5) | 16..18 status `u16`. The daemon is going away; no more completions follow |
//! | `NOP_REPLY` (6) | 16..24 the `NOP`'s payload `u64` |
//! | `ADMIN_REPLY` (7) | 16..18 status `u16`; 18 query `u8`; 20..24 reply offset `u32` in the output region; 24..28 reply bytes written `u32`; 28..32 bytes the full reply needs `u32` |
//! | `TOP_LOGPROBS` (8) | 16..20 position `u32` (index of the generated token in its sample); 24..64 up to 5 pairs (token id `u32`, logprob `f32`), `count` pairs; more than 5 alternatives span several entries with the same position |
//!
//! Each sample of a `GENERATE` ends with exactly one `DONE`; a request refused or failed as a
//! whole gets one `ERROR` instead. Every accessor tolerates any bytes: decoding a completion
//! from hostile memory returns [`CompletionError`], never panics.

use crate::pod::Pod;
use crate::status::StatusCode;
use crate::wire_bytes;

/// Token ids (and logprobs) one `TOKENS` completion carries.
pub const INLINE_TOKENS: usize = 6;
/// UTF-8 bytes one `TEXT` completion carries.
pub const INLINE_TEXT_BYTES: usize = 48;
/// UTF-8 bytes of detail one `ERROR` completion carries.
pub const INLINE_ERROR_BYTES: usize = 44;
/// (token id, logprob) pairs one `TOP_LOGPROBS` completion carries.
pub const INLINE_TOP_LOGPROBS: usize = 5;

const PAYLOAD: usize = 48;
const P: usize = 16; // payload start within the entry, for the offsets in the docs

/// One completion entry.
#[derive(Clone, Copy, PartialEq, Eq)]
#[repr(C, align(64))]
pub struct Completion {
    tag: u64,
    kind: u8,
    count: u8,
    sample: u16,
    seq: u32,
    payload: [u8; PAYLOAD],
}

const _: () = assert!(core::mem::size_of::<Completion>() == 64);
const _: () = assert!(core::mem::align_of::<Completion>() == 64);
const _: () = {
    use core::mem::offset_of;
    assert!(offset_of!(Completion, tag) == 0);
    assert!(offset_of!(Completion, kind) == 8);
    assert!(offset_of!(Completion, count) == 9);
    assert!(offset_of!(Completion, sample) == 10);
    assert!(offset_of!(Completion, seq) == 12);
    assert!(offset_of!(Completion, payload) == P);
};

// SAFETY: `repr(C)` of integers and a byte array that tile 0..64 without padding (asserted
// above); every bit pattern is valid; no pointers or drop glue.
unsafe impl Pod for Completion {}

impl Default for Completion {
    fn default() -> Self {
        crate::pod::zeroed()
    }
}

impl core::fmt::Debug for Completion {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Completion")
            .field("tag", &self.tag)
            .field("kind", &self.kind)
            .field("count", &self.count)
            .field("sample", &self.sample)
            .field("seq", &self.seq)
            .field("event", &self.event())
            .finish()
    }
}

/// Kind of a completion (byte 8).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum EventKind {
    /// Sampled token ids (with logprobs).
    Tokens = 1,
    /// A detokenized UTF-8 piece.
    Text = 2,
    /// A sample finished; finish reason and timings.
    Done = 3,
    /// The request failed as a whole.
    Error = 4,
    /// The daemon is shutting down.
    Shutdown = 5,
    /// Answer to a `NOP`.
    NopReply = 6,
    /// Answer to an `ADMIN` query.
    AdminReply = 7,
    /// Top-n alternatives at one generated position.
    TopLogprobs = 8,
}

impl EventKind {
    /// Decode; `None` for unknown kinds.
    pub const fn from_u8(value: u8) -> Option<Self> {
        Some(match value {
            1 => Self::Tokens,
            2 => Self::Text,
            3 => Self::Done,
            4 => Self::Error,
            5 => Self::Shutdown,
            6 => Self::NopReply,
            7 => Self::AdminReply,
            8 => Self::TopLogprobs,
            _ => return None,
        })
    }
}

/// Why a sample stopped (`DONE` byte 16).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum FinishReason {
    /// End-of-sequence token, a stop token id or a stop string.
    Stop = 1,
    /// `max_tokens` reached.
    Length = 2,
    /// The model's context length reached.
    ContextLength = 3,
    /// Cancelled by the client (`CANCEL`) or because it disconnected.
    Cancelled = 4,
    /// Failed; the status says why.
    Error = 5,
    /// The daemon shut down before the sample finished.
    Shutdown = 6,
}

impl FinishReason {
    /// Decode; `None` for unknown values.
    pub const fn from_u8(value: u8) -> Option<Self> {
        Some(match value {
            1 => Self::Stop,
            2 => Self::Length,
            3 => Self::ContextLength,
            4 => Self::Cancelled,
            5 => Self::Error,
            6 => Self::Shutdown,
            _ => return None,
        })
    }

    /// Stable lowercase name.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Stop => "stop",
            Self::Length => "length",
            Self::ContextLength => "context_length",
            Self::Cancelled => "cancelled",
            Self::Error => "error",
            Self::Shutdown => "shutdown",
        }
    }
}

/// Up to [`INLINE_TOKENS`] token ids with their logprobs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TokenChunk {
    ids: [u32; INLINE_TOKENS],
    logprobs: [f32; INLINE_TOKENS],
    len: u8,
}

impl TokenChunk {
    /// The token ids.
    pub fn ids(&self) -> &[u32] {
        &self.ids[..usize::from(self.len)]
    }

    /// Their logprobs (NaN where not computed).
    pub fn logprobs(&self) -> &[f32] {
        &self.logprobs[..usize::from(self.len)]
    }
}

/// Up to 48 bytes of UTF-8 carried inline.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct InlineText {
    bytes: [u8; INLINE_TEXT_BYTES],
    len: u8,
}

impl InlineText {
    /// The text (validated as UTF-8 when the completion was decoded).
    pub fn as_str(&self) -> &str {
        // Decoding checked these bytes; a failure here would be a bug in this module, so fall
        // back to an empty string rather than panic on a path a peer can reach.
        core::str::from_utf8(&self.bytes[..usize::from(self.len)]).unwrap_or("")
    }
}

impl core::fmt::Debug for InlineText {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        core::fmt::Debug::fmt(self.as_str(), f)
    }
}

/// Final report of one sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DoneInfo {
    /// Why it stopped.
    pub finish: FinishReason,
    /// Raw status code (0 unless `finish` is `Error`); see [`StatusCode::from_u16`].
    pub status: u16,
    /// Prompt tokens (after templating/tokenization).
    pub prompt_tokens: u32,
    /// Tokens generated for this sample.
    pub generated_tokens: u32,
    /// Microseconds from the daemon reading the descriptor to the request's first scheduling.
    pub queue_us: u64,
    /// Microseconds from the daemon reading the descriptor to this sample's first token.
    pub first_token_us: u64,
    /// Microseconds from the first to the last token of this sample.
    pub decode_us: u64,
}

/// Reply to an `ADMIN` query.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdminReply {
    /// Raw status (0, or `ReplyTruncated`, `PermissionDenied`, ...).
    pub status: u16,
    /// Raw query kind answered.
    pub query: u8,
    /// Offset of the JSON in the output region.
    pub offset: u32,
    /// Bytes written there.
    pub len: u32,
    /// Bytes the full reply needs (> `len` when truncated).
    pub required: u32,
}

/// Top-n alternatives at one generated position.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TopLogprobs {
    /// Index of the generated token within its sample.
    pub position: u32,
    pairs: [(u32, f32); INLINE_TOP_LOGPROBS],
    len: u8,
}

impl TopLogprobs {
    /// (token id, logprob) pairs, most likely first.
    pub fn pairs(&self) -> &[(u32, f32)] {
        &self.pairs[..usize::from(self.len)]
    }
}

/// A decoded completion payload.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Event {
    /// Sampled token ids.
    Tokens(TokenChunk),
    /// A UTF-8 text piece.
    Text(InlineText),
    /// A sample finished.
    Done(DoneInfo),
    /// The request failed as a whole.
    Error {
        /// Raw status code; see [`StatusCode::from_u16`].
        status: u16,
        /// Short detail (may be empty).
        detail: InlineText,
    },
    /// The daemon is shutting down.
    Shutdown {
        /// Raw status code.
        status: u16,
    },
    /// Answer to a `NOP`.
    NopReply {
        /// The `NOP`'s payload.
        payload: u64,
    },
    /// Answer to an `ADMIN` query.
    AdminReply(AdminReply),
    /// Top-n alternatives.
    TopLogprobs(TopLogprobs),
}

/// A completion's bytes do not decode (only a broken or hostile daemon produces these).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum CompletionError {
    /// Unknown kind byte.
    UnknownKind(u8),
    /// `count` larger than the kind allows (or 0 where at least one item is required).
    BadCount {
        /// The kind.
        kind: EventKind,
        /// The count found.
        count: u8,
    },
    /// Unknown finish reason in a `DONE`.
    UnknownFinish(u8),
    /// Inline text is not UTF-8.
    InvalidUtf8,
}

impl core::fmt::Display for CompletionError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::UnknownKind(k) => write!(f, "unknown completion kind {k}"),
            Self::BadCount { kind, count } => write!(f, "count {count} invalid for {kind:?}"),
            Self::UnknownFinish(r) => write!(f, "unknown finish reason {r}"),
            Self::InvalidUtf8 => write!(f, "inline text is not UTF-8"),
        }
    }
}

impl std::error::Error for CompletionError {}

/// A text piece does not fit one `TEXT` completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TextTooLong(pub usize);

impl core::fmt::Display for TextTooLong {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "text piece of {} bytes exceeds the {INLINE_TEXT_BYTES} inline bytes (or is empty)",
            self.0
        )
    }
}

impl std::error::Error for TextTooLong {}

fn put_u16(p: &mut [u8; PAYLOAD], at: usize, v: u16) {
    p[at - P..at - P + 2].copy_from_slice(&v.to_le_bytes());
}
fn put_u32(p: &mut [u8; PAYLOAD], at: usize, v: u32) {
    p[at - P..at - P + 4].copy_from_slice(&v.to_le_bytes());
}
fn put_u64(p: &mut [u8; PAYLOAD], at: usize, v: u64) {
    p[at - P..at - P + 8].copy_from_slice(&v.to_le_bytes());
}
fn get_u16(p: &[u8; PAYLOAD], at: usize) -> u16 {
    wire_bytes::u16_at(p, at - P)
}
fn get_u32(p: &[u8; PAYLOAD], at: usize) -> u32 {
    wire_bytes::u32_at(p, at - P)
}
fn get_u64(p: &[u8; PAYLOAD], at: usize) -> u64 {
    wire_bytes::u64_at(p, at - P)
}

/// Split `text` into pieces of at most [`INLINE_TEXT_BYTES`] bytes, each ending on a
/// code-point boundary, for consecutive `TEXT` completions. Empty input yields no piece.
pub fn split_text(text: &str) -> impl Iterator<Item = &str> {
    let mut rest = text;
    core::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        // Never 0: a code point is at most 4 bytes, a piece up to INLINE_TEXT_BYTES.
        let end = wire_bytes::floor_char_boundary(rest, INLINE_TEXT_BYTES);
        let (piece, tail) = rest.split_at(end);
        rest = tail;
        Some(piece)
    })
}

impl Completion {
    fn header(tag: u64, kind: EventKind, sample: u16, seq: u32) -> Self {
        Self {
            tag,
            kind: kind as u8,
            count: 0,
            sample,
            seq,
            payload: [0; PAYLOAD],
        }
    }

    /// A `TOKENS` completion. Takes at most [`INLINE_TOKENS`] ids from `ids` (and the same
    /// number of logprobs, NaN where `logprobs` is shorter) and returns how many it took.
    pub fn tokens(tag: u64, sample: u16, seq: u32, ids: &[u32], logprobs: &[f32]) -> (Self, usize) {
        let mut c = Self::header(tag, EventKind::Tokens, sample, seq);
        let n = ids.len().min(INLINE_TOKENS);
        // Unused positions keep id 0 and a NaN logprob, so the bytes are deterministic.
        for i in 0..INLINE_TOKENS {
            put_u32(&mut c.payload, 40 + 4 * i, f32::NAN.to_bits());
        }
        for (i, id) in ids[..n].iter().enumerate() {
            let lp = logprobs.get(i).copied().unwrap_or(f32::NAN);
            put_u32(&mut c.payload, 16 + 4 * i, *id);
            put_u32(&mut c.payload, 40 + 4 * i, lp.to_bits());
        }
        c.count = n as u8;
        (c, n)
    }

    /// A `TEXT` completion carrying `piece` (1..=48 bytes; see [`split_text`]).
    pub fn text(tag: u64, sample: u16, seq: u32, piece: &str) -> Result<Self, TextTooLong> {
        if piece.is_empty() || piece.len() > INLINE_TEXT_BYTES {
            return Err(TextTooLong(piece.len()));
        }
        let mut c = Self::header(tag, EventKind::Text, sample, seq);
        c.payload[..piece.len()].copy_from_slice(piece.as_bytes());
        c.count = piece.len() as u8;
        Ok(c)
    }

    /// A `DONE` completion.
    pub fn done(tag: u64, sample: u16, seq: u32, info: &DoneInfo) -> Self {
        let mut c = Self::header(tag, EventKind::Done, sample, seq);
        c.payload[0] = info.finish as u8;
        put_u16(&mut c.payload, 18, info.status);
        put_u32(&mut c.payload, 20, info.prompt_tokens);
        put_u32(&mut c.payload, 24, info.generated_tokens);
        put_u64(&mut c.payload, 32, info.queue_us);
        put_u64(&mut c.payload, 40, info.first_token_us);
        put_u64(&mut c.payload, 48, info.decode_us);
        c
    }

    /// An `ERROR` completion; `detail` is truncated at a code-point boundary to
    /// [`INLINE_ERROR_BYTES`].
    pub fn error(tag: u64, seq: u32, status: StatusCode, detail: &str) -> Self {
        let mut c = Self::header(tag, EventKind::Error, 0, seq);
        put_u16(&mut c.payload, 16, status.as_u16());
        let end = wire_bytes::floor_char_boundary(detail, INLINE_ERROR_BYTES);
        c.payload[4..4 + end].copy_from_slice(&detail.as_bytes()[..end]);
        c.count = end as u8;
        c
    }

    /// A `SHUTDOWN` completion (tag 0).
    pub fn shutdown(status: StatusCode) -> Self {
        let mut c = Self::header(0, EventKind::Shutdown, 0, 0);
        put_u16(&mut c.payload, 16, status.as_u16());
        c
    }

    /// A `NOP_REPLY` echoing `payload`.
    pub fn nop_reply(tag: u64, payload: u64) -> Self {
        let mut c = Self::header(tag, EventKind::NopReply, 0, 0);
        put_u64(&mut c.payload, 16, payload);
        c
    }

    /// An `ADMIN_REPLY`.
    pub fn admin_reply(tag: u64, reply: &AdminReply) -> Self {
        let mut c = Self::header(tag, EventKind::AdminReply, 0, 0);
        put_u16(&mut c.payload, 16, reply.status);
        c.payload[18 - P] = reply.query;
        put_u32(&mut c.payload, 20, reply.offset);
        put_u32(&mut c.payload, 24, reply.len);
        put_u32(&mut c.payload, 28, reply.required);
        c
    }

    /// A `TOP_LOGPROBS` completion; takes at most [`INLINE_TOP_LOGPROBS`] pairs and returns
    /// how many it took.
    pub fn top_logprobs(
        tag: u64,
        sample: u16,
        seq: u32,
        position: u32,
        pairs: &[(u32, f32)],
    ) -> (Self, usize) {
        let mut c = Self::header(tag, EventKind::TopLogprobs, sample, seq);
        put_u32(&mut c.payload, 16, position);
        let n = pairs.len().min(INLINE_TOP_LOGPROBS);
        for (i, (id, lp)) in pairs[..n].iter().enumerate() {
            put_u32(&mut c.payload, 24 + 8 * i, *id);
            put_u32(&mut c.payload, 28 + 8 * i, lp.to_bits());
        }
        c.count = n as u8;
        (c, n)
    }

    /// Request tag.
    pub fn tag(&self) -> u64 {
        self.tag
    }

    /// Raw kind byte.
    pub fn kind_byte(&self) -> u8 {
        self.kind
    }

    /// Decoded kind, if known.
    pub fn kind(&self) -> Option<EventKind> {
        EventKind::from_u8(self.kind)
    }

    /// Sample index.
    pub fn sample(&self) -> u16 {
        self.sample
    }

    /// Per-request event sequence number.
    pub fn seq(&self) -> u32 {
        self.seq
    }

    /// Set the per-request sequence number (the daemon numbers events as it emits them).
    pub fn set_seq(&mut self, seq: u32) {
        self.seq = seq;
    }

    /// Raw payload item count.
    pub fn count(&self) -> u8 {
        self.count
    }

    /// The raw inline bytes of a `TEXT` completion (`count` clamped to
    /// [`INLINE_TEXT_BYTES`]), without UTF-8 validation; `None` for other kinds. For clients
    /// that reassemble text defensively instead of trusting piece boundaries.
    pub fn text_bytes(&self) -> Option<&[u8]> {
        if self.kind() != Some(EventKind::Text) {
            return None;
        }
        let n = usize::from(self.count).min(INLINE_TEXT_BYTES);
        Some(&self.payload[..n])
    }

    /// Whether this completion ends its request or sample stream (`DONE`, `ERROR`,
    /// `NOP_REPLY`, `ADMIN_REPLY`, `SHUTDOWN`).
    pub fn is_terminal(&self) -> bool {
        !matches!(
            self.kind(),
            Some(EventKind::Tokens | EventKind::Text | EventKind::TopLogprobs) | None
        )
    }

    fn inline_text(bytes: &[u8]) -> Result<InlineText, CompletionError> {
        core::str::from_utf8(bytes).map_err(|_| CompletionError::InvalidUtf8)?;
        let mut out = InlineText {
            bytes: [0; INLINE_TEXT_BYTES],
            len: bytes.len() as u8,
        };
        out.bytes[..bytes.len()].copy_from_slice(bytes);
        Ok(out)
    }

    /// Decode the payload. Never panics, whatever the bytes.
    pub fn event(&self) -> Result<Event, CompletionError> {
        let kind = self.kind().ok_or(CompletionError::UnknownKind(self.kind))?;
        let count = self.count;
        let n = usize::from(count);
        let bad_count = || CompletionError::BadCount { kind, count };
        let p = &self.payload;
        Ok(match kind {
            EventKind::Tokens => {
                if n == 0 || n > INLINE_TOKENS {
                    return Err(bad_count());
                }
                let mut ids = [0u32; INLINE_TOKENS];
                let mut logprobs = [f32::NAN; INLINE_TOKENS];
                for i in 0..n {
                    ids[i] = get_u32(p, 16 + 4 * i);
                    logprobs[i] = f32::from_bits(get_u32(p, 40 + 4 * i));
                }
                Event::Tokens(TokenChunk {
                    ids,
                    logprobs,
                    len: count,
                })
            }
            EventKind::Text => {
                if n == 0 || n > INLINE_TEXT_BYTES {
                    return Err(bad_count());
                }
                Event::Text(Self::inline_text(&p[..n])?)
            }
            EventKind::Done => {
                let finish =
                    FinishReason::from_u8(p[0]).ok_or(CompletionError::UnknownFinish(p[0]))?;
                Event::Done(DoneInfo {
                    finish,
                    status: get_u16(p, 18),
                    prompt_tokens: get_u32(p, 20),
                    generated_tokens: get_u32(p, 24),
                    queue_us: get_u64(p, 32),
                    first_token_us: get_u64(p, 40),
                    decode_us: get_u64(p, 48),
                })
            }
            EventKind::Error => {
                if n > INLINE_ERROR_BYTES {
                    return Err(bad_count());
                }
                Event::Error {
                    status: get_u16(p, 16),
                    detail: Self::inline_text(&p[4..4 + n])?,
                }
            }
            EventKind::Shutdown => Event::Shutdown {
                status: get_u16(p, 16),
            },
            EventKind::NopReply => Event::NopReply {
                payload: get_u64(p, 16),
            },
            EventKind::AdminReply => Event::AdminReply(AdminReply {
                status: get_u16(p, 16),
                query: p[18 - P],
                offset: get_u32(p, 20),
                len: get_u32(p, 24),
                required: get_u32(p, 28),
            }),
            EventKind::TopLogprobs => {
                if n > INLINE_TOP_LOGPROBS {
                    return Err(bad_count());
                }
                let mut pairs = [(0u32, f32::NAN); INLINE_TOP_LOGPROBS];
                for (i, pair) in pairs.iter_mut().enumerate().take(n) {
                    *pair = (
                        get_u32(p, 24 + 8 * i),
                        f32::from_bits(get_u32(p, 28 + 8 * i)),
                    );
                }
                Event::TopLogprobs(TopLogprobs {
                    position: get_u32(p, 16),
                    pairs,
                    len: count,
                })
            }
        })
    }

    /// The 64 bytes (native order for the header, little-endian payload), for dumps/fuzzing.
    pub fn to_bytes(&self) -> [u8; 64] {
        let mut out = [0u8; 64];
        out[0..8].copy_from_slice(&self.tag.to_ne_bytes());
        out[8] = self.kind;
        out[9] = self.count;
        out[10..12].copy_from_slice(&self.sample.to_ne_bytes());
        out[12..16].copy_from_slice(&self.seq.to_ne_bytes());
        out[16..].copy_from_slice(&self.payload);
        out
    }

    /// From any 64 bytes (never fails; [`Completion::event`] judges them).
    pub fn from_bytes(b: &[u8; 64]) -> Self {
        let mut tag = [0u8; 8];
        tag.copy_from_slice(&b[0..8]);
        let mut payload = [0u8; PAYLOAD];
        payload.copy_from_slice(&b[16..]);
        Self {
            tag: u64::from_ne_bytes(tag),
            kind: b[8],
            count: b[9],
            sample: u16::from_ne_bytes([b[10], b[11]]),
            seq: u32::from_ne_bytes([b[12], b[13], b[14], b[15]]),
            payload,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_round_trip_with_and_without_logprobs() {
        let (c, took) = Completion::tokens(5, 2, 9, &[1, 2, 3, 4, 5, 6, 7], &[-0.5, -1.0]);
        assert_eq!(took, 6);
        assert_eq!((c.tag(), c.sample(), c.seq()), (5, 2, 9));
        let Ok(Event::Tokens(chunk)) = c.event() else {
            panic!("not tokens: {c:?}")
        };
        assert_eq!(chunk.ids(), &[1, 2, 3, 4, 5, 6]);
        assert_eq!(chunk.logprobs()[..2], [-0.5, -1.0]);
        assert!(chunk.logprobs()[2..].iter().all(|x| x.is_nan()));
        assert!(!c.is_terminal());
    }

    #[test]
    fn text_split_never_breaks_code_points() {
        let text = "héllo wörld ✓ 🚀🚀🚀 ".repeat(9);
        let pieces: Vec<&str> = split_text(&text).collect();
        assert_eq!(pieces.concat(), text);
        for (i, piece) in pieces.iter().enumerate() {
            assert!(!piece.is_empty() && piece.len() <= INLINE_TEXT_BYTES);
            let c = Completion::text(1, 0, i as u32, piece).expect("fits");
            let Ok(Event::Text(t)) = c.event() else {
                panic!("not text")
            };
            assert_eq!(t.as_str(), *piece);
            assert_eq!(c.text_bytes(), Some(piece.as_bytes()));
        }
        assert_eq!(split_text("").count(), 0);
        assert!(Completion::text(1, 0, 0, "").is_err());
        assert!(Completion::text(1, 0, 0, &"x".repeat(49)).is_err());
    }

    #[test]
    fn done_error_admin_nop_shutdown_top_round_trip() {
        let info = DoneInfo {
            finish: FinishReason::Length,
            status: 0,
            prompt_tokens: 12,
            generated_tokens: 34,
            queue_us: u64::MAX,
            first_token_us: 7,
            decode_us: 8,
        };
        let c = Completion::done(3, 1, 40, &info);
        assert_eq!(c.event(), Ok(Event::Done(info)));
        assert!(c.is_terminal());

        let c = Completion::error(4, 0, StatusCode::BadTopP, &"é".repeat(30));
        let Ok(Event::Error { status, detail }) = c.event() else {
            panic!("not error")
        };
        assert_eq!(StatusCode::from_u16(status), Some(StatusCode::BadTopP));
        assert_eq!(detail.as_str(), "é".repeat(22));

        let reply = AdminReply {
            status: StatusCode::ReplyTruncated.as_u16(),
            query: 2,
            offset: 4096,
            len: 100,
            required: 300,
        };
        assert_eq!(
            Completion::admin_reply(8, &reply).event(),
            Ok(Event::AdminReply(reply))
        );
        assert_eq!(
            Completion::nop_reply(1, 0x1234).event(),
            Ok(Event::NopReply { payload: 0x1234 })
        );
        assert_eq!(
            Completion::shutdown(StatusCode::ShuttingDown).event(),
            Ok(Event::Shutdown {
                status: StatusCode::ShuttingDown.as_u16()
            })
        );
        let (c, took) = Completion::top_logprobs(1, 0, 2, 17, &[(1, -0.1), (2, -0.2), (3, -3.0)]);
        assert_eq!(took, 3);
        let Ok(Event::TopLogprobs(top)) = c.event() else {
            panic!("not top")
        };
        assert_eq!(top.position, 17);
        assert_eq!(top.pairs(), &[(1, -0.1), (2, -0.2), (3, -3.0)]);
        let back = Completion::from_bytes(&c.to_bytes());
        assert_eq!(back, c);
    }

    #[test]
    fn hostile_bytes_decode_to_errors_not_panics() {
        let mut b = [0u8; 64];
        b[8] = 99;
        assert_eq!(
            Completion::from_bytes(&b).event(),
            Err(CompletionError::UnknownKind(99))
        );
        b[8] = EventKind::Tokens as u8;
        b[9] = 7;
        assert!(matches!(
            Completion::from_bytes(&b).event(),
            Err(CompletionError::BadCount { .. })
        ));
        b[8] = EventKind::Text as u8;
        b[9] = 2;
        b[16] = 0xff;
        b[17] = 0xfe;
        assert_eq!(
            Completion::from_bytes(&b).event(),
            Err(CompletionError::InvalidUtf8)
        );
        b[8] = EventKind::Done as u8;
        b[16] = 0;
        assert_eq!(
            Completion::from_bytes(&b).event(),
            Err(CompletionError::UnknownFinish(0))
        );
        // Every (kind, count) combination with arbitrary payload bytes: no panic.
        for kind in 0..=255u8 {
            for count in 0..=255u8 {
                let mut b = [0xabu8; 64];
                b[8] = kind;
                b[9] = count;
                let _ = Completion::from_bytes(&b).event();
            }
        }
    }
}

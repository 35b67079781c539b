//! Status codes shared by the daemon and every client: the `u16` carried in `ERROR`, `DONE`,
//! `ADMIN_REPLY` and `SHUTDOWN` completions. The numbers are ABI: never renumber, only add.
//!
//! | code | name | meaning |
//! | ---: | --- | --- |
//! | 0 | `Ok` | success |
//! | 1 | `UnknownOpcode` | descriptor opcode not known to this daemon |
//! | 2 | `UnsupportedVersion` | descriptor layout version not supported |
//! | 3 | `ReservedFlags` | a flag bit this version does not define was set |
//! | 4 | `ReservedNonZero` | a field unused by this opcode was not zero |
//! | 5 | `BadPromptKind` | prompt kind not text / token ids / chat JSON |
//! | 6 | `EmptyPrompt` | prompt length is zero |
//! | 7 | `MisalignedTokenIds` | token-id prompt length not a multiple of 4 |
//! | 8 | `PromptOutOfRange` | prompt (offset, len) outside the input region |
//! | 9 | `BadMaxTokens` | `max_tokens` is zero |
//! | 10 | `BadTemperature` | temperature not finite or negative |
//! | 11 | `BadTopP` | `top_p` not in (0, 1] |
//! | 12 | `BadMinP` | `min_p` not in [0, 1] |
//! | 13 | `BadRepetitionPenalty` | repetition penalty not finite and > 0 |
//! | 14 | `BadSampleCount` | `n_samples` is 0 or above [`crate::MAX_SAMPLES`] |
//! | 15 | `ExtensionOutOfRange` | extension (offset, len) outside the input region |
//! | 16 | `BadExtension` | extension block malformed (version, lengths, values, UTF-8), or `ext_len` 0 with a non-zero `ext_offset` |
//! | 17 | `BadAdminQuery` | admin query kind not known |
//! | 18 | `ReplyOutOfRange` | admin reply (offset, capacity) outside the output region |
//! | 32 | `InvalidUtf8` | text prompt or chat JSON is not UTF-8 |
//! | 33 | `TokenOutOfVocab` | a prompt token id is outside the model's vocabulary |
//! | 34 | `PromptTooLong` | the prompt alone leaves no room in the context (or the KV pool); a `max_tokens` beyond the context is not refused: generation stops at the context with finish reason `context_length` |
//! | 35 | `BadChatMessages` | chat JSON is not a valid message list, or no chat template |
//! | 36 | `DuplicateTag` | a request with this tag is already in flight |
//! | 37 | `UnknownTag` | `CANCEL` named a tag with no request in flight |
//! | 64 | `Overloaded` | request table full; retry later |
//! | 65 | `ReplyTruncated` | admin reply larger than the capacity given (see `required`) |
//! | 66 | `ShuttingDown` | the daemon is draining and refuses new work |
//! | 67 | `PermissionDenied` | the client may not run this admin query |
//! | 68 | `Internal` | daemon-side failure; details in the daemon's log |

/// A status code (see the module table). Unknown numbers from a newer peer decode to `None`
/// through [`StatusCode::from_u16`]; keep the raw `u16` in that case.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u16)]
#[non_exhaustive]
pub enum StatusCode {
    /// Success.
    Ok = 0,
    /// Descriptor opcode not known to this daemon.
    UnknownOpcode = 1,
    /// Descriptor layout version not supported.
    UnsupportedVersion = 2,
    /// A flag bit this version does not define was set.
    ReservedFlags = 3,
    /// A field unused by this opcode was not zero.
    ReservedNonZero = 4,
    /// Prompt kind not text / token ids / chat JSON.
    BadPromptKind = 5,
    /// Prompt length is zero.
    EmptyPrompt = 6,
    /// Token-id prompt length is not a multiple of 4.
    MisalignedTokenIds = 7,
    /// Prompt (offset, len) lies outside the input region.
    PromptOutOfRange = 8,
    /// `max_tokens` is zero.
    BadMaxTokens = 9,
    /// Temperature is not finite or is negative.
    BadTemperature = 10,
    /// `top_p` is not in (0, 1].
    BadTopP = 11,
    /// `min_p` is not in [0, 1].
    BadMinP = 12,
    /// Repetition penalty is not finite and > 0.
    BadRepetitionPenalty = 13,
    /// `n_samples` is 0 or above [`crate::MAX_SAMPLES`].
    BadSampleCount = 14,
    /// Extension (offset, len) lies outside the input region.
    ExtensionOutOfRange = 15,
    /// Extension block malformed.
    BadExtension = 16,
    /// Admin query kind not known.
    BadAdminQuery = 17,
    /// Admin reply (offset, capacity) lies outside the output region.
    ReplyOutOfRange = 18,
    /// Text prompt or chat JSON is not UTF-8.
    InvalidUtf8 = 32,
    /// A prompt token id is outside the model's vocabulary.
    TokenOutOfVocab = 33,
    /// The prompt leaves no room to generate within the context length (a `max_tokens`
    /// beyond the context is not refused: generation stops at the context).
    PromptTooLong = 34,
    /// Chat JSON is not a valid message list, or the model has no chat template.
    BadChatMessages = 35,
    /// A request with this tag is already in flight for this client.
    DuplicateTag = 36,
    /// `CANCEL` named a tag with no request in flight.
    UnknownTag = 37,
    /// Request table full; retry later.
    Overloaded = 64,
    /// Admin reply larger than the capacity given.
    ReplyTruncated = 65,
    /// The daemon is draining and refuses new work.
    ShuttingDown = 66,
    /// The client may not run this admin query.
    PermissionDenied = 67,
    /// Daemon-side failure; details in the daemon's log.
    Internal = 68,
}

impl StatusCode {
    /// Every code, in numeric order (for tables, the C header test and exhaustive tests).
    pub const ALL: [StatusCode; 30] = [
        Self::Ok,
        Self::UnknownOpcode,
        Self::UnsupportedVersion,
        Self::ReservedFlags,
        Self::ReservedNonZero,
        Self::BadPromptKind,
        Self::EmptyPrompt,
        Self::MisalignedTokenIds,
        Self::PromptOutOfRange,
        Self::BadMaxTokens,
        Self::BadTemperature,
        Self::BadTopP,
        Self::BadMinP,
        Self::BadRepetitionPenalty,
        Self::BadSampleCount,
        Self::ExtensionOutOfRange,
        Self::BadExtension,
        Self::BadAdminQuery,
        Self::ReplyOutOfRange,
        Self::InvalidUtf8,
        Self::TokenOutOfVocab,
        Self::PromptTooLong,
        Self::BadChatMessages,
        Self::DuplicateTag,
        Self::UnknownTag,
        Self::Overloaded,
        Self::ReplyTruncated,
        Self::ShuttingDown,
        Self::PermissionDenied,
        Self::Internal,
    ];

    /// The wire value.
    pub const fn as_u16(self) -> u16 {
        self as u16
    }

    /// Decode a wire value; `None` for numbers this version does not know.
    pub fn from_u16(value: u16) -> Option<Self> {
        Self::ALL.iter().copied().find(|c| *c as u16 == value)
    }

    /// Short stable name (`snake_case`), for logs and JSON.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::UnknownOpcode => "unknown_opcode",
            Self::UnsupportedVersion => "unsupported_version",
            Self::ReservedFlags => "reserved_flags",
            Self::ReservedNonZero => "reserved_nonzero",
            Self::BadPromptKind => "bad_prompt_kind",
            Self::EmptyPrompt => "empty_prompt",
            Self::MisalignedTokenIds => "misaligned_token_ids",
            Self::PromptOutOfRange => "prompt_out_of_range",
            Self::BadMaxTokens => "bad_max_tokens",
            Self::BadTemperature => "bad_temperature",
            Self::BadTopP => "bad_top_p",
            Self::BadMinP => "bad_min_p",
            Self::BadRepetitionPenalty => "bad_repetition_penalty",
            Self::BadSampleCount => "bad_sample_count",
            Self::ExtensionOutOfRange => "extension_out_of_range",
            Self::BadExtension => "bad_extension",
            Self::BadAdminQuery => "bad_admin_query",
            Self::ReplyOutOfRange => "reply_out_of_range",
            Self::InvalidUtf8 => "invalid_utf8",
            Self::TokenOutOfVocab => "token_out_of_vocab",
            Self::PromptTooLong => "prompt_too_long",
            Self::BadChatMessages => "bad_chat_messages",
            Self::DuplicateTag => "duplicate_tag",
            Self::UnknownTag => "unknown_tag",
            Self::Overloaded => "overloaded",
            Self::ReplyTruncated => "reply_truncated",
            Self::ShuttingDown => "shutting_down",
            Self::PermissionDenied => "permission_denied",
            Self::Internal => "internal",
        }
    }

    /// One-line human description (the client's error-string function returns this).
    pub const fn description(self) -> &'static str {
        match self {
            Self::Ok => "success",
            Self::UnknownOpcode => "descriptor opcode not known to this daemon",
            Self::UnsupportedVersion => "descriptor layout version not supported",
            Self::ReservedFlags => "a flag bit this version does not define was set",
            Self::ReservedNonZero => "a field unused by this opcode was not zero",
            Self::BadPromptKind => "prompt kind must be text, token ids or chat JSON",
            Self::EmptyPrompt => "prompt is empty",
            Self::MisalignedTokenIds => "token-id prompt length is not a multiple of 4 bytes",
            Self::PromptOutOfRange => "prompt lies outside the input region",
            Self::BadMaxTokens => "max_tokens must be at least 1",
            Self::BadTemperature => "temperature must be finite and >= 0",
            Self::BadTopP => "top_p must be in (0, 1]",
            Self::BadMinP => "min_p must be in [0, 1]",
            Self::BadRepetitionPenalty => "repetition penalty must be finite and > 0",
            Self::BadSampleCount => "n_samples must be between 1 and MAX_SAMPLES",
            Self::ExtensionOutOfRange => "extension block lies outside the input region",
            Self::BadExtension => "extension block is malformed",
            Self::BadAdminQuery => "admin query kind not known",
            Self::ReplyOutOfRange => "admin reply buffer lies outside the output region",
            Self::InvalidUtf8 => "prompt text is not valid UTF-8",
            Self::TokenOutOfVocab => "a prompt token id is outside the vocabulary",
            Self::PromptTooLong => {
                "the prompt leaves no room to generate within the context length"
            }
            Self::BadChatMessages => "chat messages are malformed or the model has no template",
            Self::DuplicateTag => "a request with this tag is already in flight",
            Self::UnknownTag => "no request with this tag is in flight",
            Self::Overloaded => "daemon request table is full; retry later",
            Self::ReplyTruncated => "admin reply did not fit the buffer given",
            Self::ShuttingDown => "daemon is shutting down",
            Self::PermissionDenied => "not permitted for this client",
            Self::Internal => "internal daemon error (see the daemon log)",
        }
    }
}

impl core::fmt::Display for StatusCode {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{} ({})", self.description(), *self as u16)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_and_unknown_is_none() {
        for code in StatusCode::ALL {
            assert_eq!(StatusCode::from_u16(code.as_u16()), Some(code));
            assert!(!code.name().is_empty() && !code.description().is_empty());
        }
        assert_eq!(StatusCode::from_u16(19), None);
        assert_eq!(StatusCode::from_u16(u16::MAX), None);
        let mut seen = std::collections::HashSet::new();
        for code in StatusCode::ALL {
            assert!(seen.insert(code.as_u16()), "duplicate {code:?}");
        }
    }
}

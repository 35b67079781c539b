//! What the daemon reports back: events per request and sample.

use std::time::Duration;

use nerva_rings::status::StatusCode;

/// A request's tag: chosen by the client at submit, carried by every event of that request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Tag(pub u64);

/// Why a sample ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum FinishReason {
    /// An end-of-sequence id, a stop token id or a stop string.
    Stop = 0,
    /// `max_tokens` reached.
    Length = 1,
    /// The model's context length reached.
    ContextLength = 2,
    /// Cancelled by [`crate::Client::cancel`].
    Cancelled = 3,
    /// The daemon failed this sample.
    Error = 4,
    /// The daemon shut down before the sample finished.
    Shutdown = 5,
}

impl FinishReason {
    /// Short name for displays.
    pub const fn name(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::ContextLength => "context_length",
            FinishReason::Cancelled => "cancelled",
            FinishReason::Error => "error",
            FinishReason::Shutdown => "shutdown",
        }
    }
}

/// Per-sample timings measured by the daemon.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Timings {
    /// Received by the daemon → first scheduled.
    pub queue: Duration,
    /// Received → first token.
    pub time_to_first_token: Duration,
    /// First token → last token.
    pub decode: Duration,
    /// Prompt tokens processed.
    pub prompt_tokens: u32,
    /// Tokens generated in this sample.
    pub generated_tokens: u32,
}

impl Timings {
    /// Mean time between consecutive tokens (zero with fewer than two tokens).
    pub fn inter_token(&self) -> Duration {
        if self.generated_tokens > 1 {
            self.decode / (self.generated_tokens - 1)
        } else {
            Duration::ZERO
        }
    }
}

/// One event, borrowing from the client's buffers: valid during the callback of
/// [`crate::Client::poll_with`] only.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum EventRef<'a> {
    /// Newly generated token ids, with the log-probability of each (may be empty when the
    /// request did not ask for log-probabilities).
    Tokens {
        /// Request.
        tag: Tag,
        /// The caller's `user_data` of the request ([`crate::GenerateParams::user_data`]).
        user_data: u64,
        /// Sample index.
        sample: u16,
        /// Ids in order.
        ids: &'a [u32],
        /// Log-probabilities, one per id, or empty.
        logprobs: &'a [f32],
    },
    /// The most likely alternatives for the last token (only with `top_logprobs > 0`).
    TopLogprobs {
        /// Request.
        tag: Tag,
        /// The caller's `user_data` of the request ([`crate::GenerateParams::user_data`]).
        user_data: u64,
        /// Sample index.
        sample: u16,
        /// Index of the generated token these alternatives are for.
        position: u32,
        /// Alternative ids, most likely first.
        ids: &'a [u32],
        /// Their log-probabilities.
        logprobs: &'a [f32],
    },
    /// A piece of output text: whole UTF-8 code points only.
    Text {
        /// Request.
        tag: Tag,
        /// The caller's `user_data` of the request ([`crate::GenerateParams::user_data`]).
        user_data: u64,
        /// Sample index.
        sample: u16,
        /// The piece.
        text: &'a str,
    },
    /// A sample ended. Exactly one per sample of every accepted request.
    Done {
        /// Request.
        tag: Tag,
        /// The caller's `user_data` of the request ([`crate::GenerateParams::user_data`]).
        user_data: u64,
        /// Sample index.
        sample: u16,
        /// Why.
        reason: FinishReason,
        /// Timings.
        timings: Timings,
    },
    /// The request failed as a whole (no `Done` follows for it).
    Error {
        /// Request.
        tag: Tag,
        /// The caller's `user_data` of the request ([`crate::GenerateParams::user_data`]).
        user_data: u64,
        /// Why, as the daemon's status code (raw value kept if unknown to this version);
        /// [`status_code`] decodes it.
        status: u16,
        /// Short detail from the daemon (may be empty).
        detail: &'a str,
    },
    /// The daemon is shutting down: no new work is accepted; in-flight requests end with
    /// `Done { reason: Shutdown }` (or finish normally within the drain time).
    Shutdown,
}

impl EventRef<'_> {
    /// The request tag (none for `Shutdown`).
    pub fn tag(&self) -> Option<Tag> {
        match *self {
            EventRef::Tokens { tag, .. }
            | EventRef::TopLogprobs { tag, .. }
            | EventRef::Text { tag, .. }
            | EventRef::Done { tag, .. }
            | EventRef::Error { tag, .. } => Some(tag),
            EventRef::Shutdown => None,
        }
    }

    /// The caller's `user_data` of the request (none for `Shutdown`).
    pub fn user_data(&self) -> Option<u64> {
        match *self {
            EventRef::Tokens { user_data, .. }
            | EventRef::TopLogprobs { user_data, .. }
            | EventRef::Text { user_data, .. }
            | EventRef::Done { user_data, .. }
            | EventRef::Error { user_data, .. } => Some(user_data),
            EventRef::Shutdown => None,
        }
    }

    /// An owned copy.
    pub fn to_owned(&self) -> Event {
        match *self {
            EventRef::Tokens {
                tag,
                user_data,
                sample,
                ids,
                logprobs,
            } => Event::Tokens {
                tag,
                user_data,
                sample,
                ids: ids.to_vec(),
                logprobs: logprobs.to_vec(),
            },
            EventRef::TopLogprobs {
                tag,
                user_data,
                sample,
                position,
                ids,
                logprobs,
            } => Event::TopLogprobs {
                tag,
                user_data,
                sample,
                position,
                ids: ids.to_vec(),
                logprobs: logprobs.to_vec(),
            },
            EventRef::Text {
                tag,
                user_data,
                sample,
                text,
            } => Event::Text {
                tag,
                user_data,
                sample,
                text: text.to_string(),
            },
            EventRef::Done {
                tag,
                user_data,
                sample,
                reason,
                timings,
            } => Event::Done {
                tag,
                user_data,
                sample,
                reason,
                timings,
            },
            EventRef::Error {
                tag,
                user_data,
                status,
                detail,
            } => Event::Error {
                tag,
                user_data,
                status,
                detail: detail.to_string(),
            },
            EventRef::Shutdown => Event::Shutdown,
        }
    }
}

/// An owned event (see [`EventRef`] for the meaning of each variant).
#[derive(Debug, Clone, PartialEq)]
#[allow(missing_docs)] // fields mirror EventRef's, documented there
pub enum Event {
    /// See [`EventRef::Tokens`].
    Tokens {
        tag: Tag,
        user_data: u64,
        sample: u16,
        ids: Vec<u32>,
        logprobs: Vec<f32>,
    },
    /// See [`EventRef::TopLogprobs`].
    TopLogprobs {
        tag: Tag,
        user_data: u64,
        sample: u16,
        position: u32,
        ids: Vec<u32>,
        logprobs: Vec<f32>,
    },
    /// See [`EventRef::Text`].
    Text {
        tag: Tag,
        user_data: u64,
        sample: u16,
        text: String,
    },
    /// See [`EventRef::Done`].
    Done {
        tag: Tag,
        user_data: u64,
        sample: u16,
        reason: FinishReason,
        timings: Timings,
    },
    /// See [`EventRef::Error`].
    Error {
        tag: Tag,
        user_data: u64,
        status: u16,
        detail: String,
    },
    /// See [`EventRef::Shutdown`].
    Shutdown,
}

impl Event {
    /// The request tag (none for `Shutdown`).
    pub fn tag(&self) -> Option<Tag> {
        match self {
            Event::Tokens { tag, .. }
            | Event::TopLogprobs { tag, .. }
            | Event::Text { tag, .. }
            | Event::Done { tag, .. }
            | Event::Error { tag, .. } => Some(*tag),
            Event::Shutdown => None,
        }
    }

    /// The caller's `user_data` of the request (none for `Shutdown`).
    pub fn user_data(&self) -> Option<u64> {
        self.to_ref().user_data()
    }

    /// Borrow this owned event as an [`EventRef`].
    pub fn to_ref(&self) -> EventRef<'_> {
        match self {
            Event::Tokens {
                tag,
                user_data,
                sample,
                ids,
                logprobs,
            } => EventRef::Tokens {
                tag: *tag,
                user_data: *user_data,
                sample: *sample,
                ids,
                logprobs,
            },
            Event::TopLogprobs {
                tag,
                user_data,
                sample,
                position,
                ids,
                logprobs,
            } => EventRef::TopLogprobs {
                tag: *tag,
                user_data: *user_data,
                sample: *sample,
                position: *position,
                ids,
                logprobs,
            },
            Event::Text {
                tag,
                user_data,
                sample,
                text,
            } => EventRef::Text {
                tag: *tag,
                user_data: *user_data,
                sample: *sample,
                text,
            },
            Event::Done {
                tag,
                user_data,
                sample,
                reason,
                timings,
            } => EventRef::Done {
                tag: *tag,
                user_data: *user_data,
                sample: *sample,
                reason: *reason,
                timings: *timings,
            },
            Event::Error {
                tag,
                user_data,
                status,
                detail,
            } => EventRef::Error {
                tag: *tag,
                user_data: *user_data,
                status: *status,
                detail,
            },
            Event::Shutdown => EventRef::Shutdown,
        }
    }
}

/// The status code of an `Error` event, if this version knows it.
pub fn status_code(status: u16) -> Option<StatusCode> {
    StatusCode::from_u16(status)
}

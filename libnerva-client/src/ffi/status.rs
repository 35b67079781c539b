//! Return codes of the C ABI and their text.

use core::ffi::{c_char, c_int};
use std::ffi::CString;
use std::sync::OnceLock;

use nerva_rings::StatusCode;

use crate::{Error, ErrorCode};

/// Return codes of every `int`-returning `nerva_` function: `NERVA_OK` (0) or a negative code.
/// The numbers equal the Rust API's `ErrorCode`s (one table for both languages); -100 and below
/// belong to the C layer alone.
///
/// | code | name                        | meaning                                             | state after the failed call                          |
/// |-----:|-----------------------------|-----------------------------------------------------|------------------------------------------------------|
/// |    0 | NERVA_OK                    | success                                             | -                                                    |
/// |   -1 | NERVA_E_INVALID_ARGUMENT    | NULL pointer, bad length, parameter out of range, text not UTF-8 | nothing sent, nothing changed           |
/// |   -2 | NERVA_E_NO_DAEMON           | not connected: no daemon listens at the socket path (`errno` says why) | connect: `*out` is NULL; start nervad or fix the path |
/// |   -3 | NERVA_E_PERMISSION_DENIED   | the daemon's access policy refused this process     | connect: `*out` is NULL                              |
/// |   -4 | NERVA_E_VERSION_MISMATCH    | library and daemon speak different wire versions    | connect: `*out` is NULL; upgrade one side            |
/// |   -5 | NERVA_E_TOO_MANY_CLIENTS    | the daemon serves its maximum number of clients     | connect: `*out` is NULL; retry later                 |
/// |   -6 | NERVA_E_RESOURCE_EXHAUSTED  | the daemon could not create this client's segment   | connect: `*out` is NULL; retry later                 |
/// |   -7 | NERVA_E_DAEMON_GONE         | the daemon exited, crashed or dropped this client   | the client is dead, later calls fail; close it       |
/// |   -8 | NERVA_E_RING_FULL           | submission ring or input area full *now*            | nothing sent; poll events (or wait), then retry      |
/// |   -9 | NERVA_E_TIMEOUT             | nothing arrived within the timeout                  | nothing changed; call again                          |
/// |  -10 | NERVA_E_SHUTTING_DOWN       | the daemon is draining and accepts no new work      | nothing sent; in-flight requests still finish        |
/// |  -11 | NERVA_E_REJECTED            | the daemon refused the request                      | that request is over; nothing else changed           |
/// |  -12 | NERVA_E_PROTOCOL            | the daemon broke the protocol (corrupt ring/segment)| the client is unusable; close it                     |
/// |  -13 | NERVA_E_IO                  | an operating-system call failed (`errno` is kept)   | connect: `*out` is NULL; otherwise close the client  |
/// |  -14 | NERVA_E_TOO_LARGE           | the request can never fit the client's data area    | nothing sent; shorten the prompt or stop lists       |
/// |  -15 | NERVA_E_UNKNOWN_TAG         | no request with this tag is in flight               | nothing changed (harmless after a race with DONE)    |
/// | -100 | NERVA_E_CLIENT_IN_USE       | reserved: no longer returned (calls on one client now serialize) | -                            |
/// | -101 | NERVA_E_INTERNAL            | a bug in the library, caught before it reached C    | the client is poisoned, later calls fail; close it   |
/// | -102 | NERVA_E_CLOSED              | another thread closed the client during this call   | the handle is being freed; do not use it again       |
///
/// A request that fails inside the daemon (a prompt longer than the context, a token id
/// outside the vocabulary) is reported by a `NERVA_EVENT_ERROR` event whose `status` is a
/// `nerva_request_status`, not by a return code.
#[repr(i32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum nerva_status {
    /// Success.
    NERVA_OK = 0,
    /// A NULL pointer, a bad length, a parameter out of range or text that is not UTF-8.
    NERVA_E_INVALID_ARGUMENT = -1,
    /// Not connected: no daemon listens at the socket path.
    NERVA_E_NO_DAEMON = -2,
    /// The daemon's access policy refused this process.
    NERVA_E_PERMISSION_DENIED = -3,
    /// Library and daemon speak different wire versions.
    NERVA_E_VERSION_MISMATCH = -4,
    /// The daemon serves its maximum number of clients; retry later.
    NERVA_E_TOO_MANY_CLIENTS = -5,
    /// The daemon could not create this client's segment; retry later.
    NERVA_E_RESOURCE_EXHAUSTED = -6,
    /// The daemon exited, crashed or dropped this client; the client is dead.
    NERVA_E_DAEMON_GONE = -7,
    /// No room in the submission ring or input area now; poll events, then retry.
    NERVA_E_RING_FULL = -8,
    /// Nothing arrived within the timeout.
    NERVA_E_TIMEOUT = -9,
    /// The daemon is shutting down and accepts no new work.
    NERVA_E_SHUTTING_DOWN = -10,
    /// The daemon refused the request.
    NERVA_E_REJECTED = -11,
    /// The daemon broke the protocol; the client is unusable.
    NERVA_E_PROTOCOL = -12,
    /// An operating-system call failed; `errno` holds the reason.
    NERVA_E_IO = -13,
    /// The request can never fit the client's data area.
    NERVA_E_TOO_LARGE = -14,
    /// No request with this tag is in flight.
    NERVA_E_UNKNOWN_TAG = -15,
    /// Reserved (number kept, never reused): returned by earlier versions for overlapping
    /// calls on one client, which now serialize instead.
    NERVA_E_CLIENT_IN_USE = -100,
    /// A bug inside the library; the client is poisoned.
    NERVA_E_INTERNAL = -101,
    /// Another thread closed the client while this call was inside it; the call did
    /// nothing more and the handle is being freed.
    NERVA_E_CLOSED = -102,
}

impl nerva_status {
    /// Every code, in table order. (A function, not an associated const: cbindgen would export
    /// the const into the header.)
    pub fn all() -> [nerva_status; 19] {
        [
            Self::NERVA_OK,
            Self::NERVA_E_INVALID_ARGUMENT,
            Self::NERVA_E_NO_DAEMON,
            Self::NERVA_E_PERMISSION_DENIED,
            Self::NERVA_E_VERSION_MISMATCH,
            Self::NERVA_E_TOO_MANY_CLIENTS,
            Self::NERVA_E_RESOURCE_EXHAUSTED,
            Self::NERVA_E_DAEMON_GONE,
            Self::NERVA_E_RING_FULL,
            Self::NERVA_E_TIMEOUT,
            Self::NERVA_E_SHUTTING_DOWN,
            Self::NERVA_E_REJECTED,
            Self::NERVA_E_PROTOCOL,
            Self::NERVA_E_IO,
            Self::NERVA_E_TOO_LARGE,
            Self::NERVA_E_UNKNOWN_TAG,
            Self::NERVA_E_CLIENT_IN_USE,
            Self::NERVA_E_INTERNAL,
            Self::NERVA_E_CLOSED,
        ]
    }

    /// The code as returned through the C ABI.
    pub const fn code(self) -> c_int {
        self as c_int
    }

    /// The status with this code, if any.
    pub fn from_code(code: c_int) -> Option<Self> {
        Self::all().into_iter().find(|s| s.code() == code)
    }

    /// NUL-terminated English description (static storage).
    const fn message(self) -> &'static core::ffi::CStr {
        match self {
            Self::NERVA_OK => c"success",
            Self::NERVA_E_INVALID_ARGUMENT => c"invalid argument",
            Self::NERVA_E_NO_DAEMON => c"not connected: no daemon listens at the socket path",
            Self::NERVA_E_PERMISSION_DENIED => c"permission denied by the daemon's access policy",
            Self::NERVA_E_VERSION_MISMATCH => c"library and daemon wire versions differ",
            Self::NERVA_E_TOO_MANY_CLIENTS => c"the daemon serves its maximum number of clients",
            Self::NERVA_E_RESOURCE_EXHAUSTED => {
                c"the daemon could not create this client's segment"
            }
            Self::NERVA_E_DAEMON_GONE => {
                c"the daemon is gone (exited, killed or dropped this client)"
            }
            Self::NERVA_E_RING_FULL => c"submission ring or input area full; poll events and retry",
            Self::NERVA_E_TIMEOUT => c"timed out",
            Self::NERVA_E_SHUTTING_DOWN => c"the daemon is shutting down",
            Self::NERVA_E_REJECTED => c"the daemon rejected the request",
            Self::NERVA_E_PROTOCOL => c"protocol error: the daemon sent malformed data",
            Self::NERVA_E_IO => c"operating-system call failed (see errno)",
            Self::NERVA_E_TOO_LARGE => c"request too large for the client's data area",
            Self::NERVA_E_UNKNOWN_TAG => c"no request with this tag is in flight",
            Self::NERVA_E_CLIENT_IN_USE => c"the client is in use by another thread (reserved)",
            Self::NERVA_E_CLOSED => c"the client was closed by another thread during the call",
            Self::NERVA_E_INTERNAL => c"internal error in libnerva-client; close the client",
        }
    }
}

/// The description of a return code, as a NUL-terminated string in static storage (never
/// NULL, never to be freed). Unknown codes give "unknown nerva status code".
#[unsafe(no_mangle)]
pub extern "C" fn nerva_strerror(code: c_int) -> *const c_char {
    // No panic is possible here (a table look-up), so no unwind guard is needed.
    match nerva_status::from_code(code) {
        Some(status) => status.message().as_ptr(),
        None => c"unknown nerva status code".as_ptr(),
    }
}

/// Why the daemon refused or failed one request: the `status` of a `NERVA_EVENT_ERROR` event.
/// The numbers are the wire protocol's status codes (never renumbered, only added to); a newer
/// daemon may send a number this header does not list, so compare against the names you handle
/// and treat the rest as a generic failure. `nerva_request_status_string` describes any code.
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum nerva_request_status {
    /// Success.
    NERVA_REQUEST_OK = 0,
    /// Descriptor opcode not known to this daemon.
    NERVA_REQUEST_UNKNOWN_OPCODE = 1,
    /// Descriptor layout version not supported.
    NERVA_REQUEST_UNSUPPORTED_VERSION = 2,
    /// A flag bit this version does not define was set.
    NERVA_REQUEST_RESERVED_FLAGS = 3,
    /// A field unused by this opcode was not zero.
    NERVA_REQUEST_RESERVED_NON_ZERO = 4,
    /// Prompt kind not text / token ids / chat JSON.
    NERVA_REQUEST_BAD_PROMPT_KIND = 5,
    /// Prompt length is zero.
    NERVA_REQUEST_EMPTY_PROMPT = 6,
    /// Token-id prompt length is not a multiple of 4.
    NERVA_REQUEST_MISALIGNED_TOKEN_IDS = 7,
    /// Prompt (offset, len) lies outside the input region.
    NERVA_REQUEST_PROMPT_OUT_OF_RANGE = 8,
    /// `max_tokens` is zero.
    NERVA_REQUEST_BAD_MAX_TOKENS = 9,
    /// Temperature is not finite or is negative.
    NERVA_REQUEST_BAD_TEMPERATURE = 10,
    /// `top_p` is not in (0, 1].
    NERVA_REQUEST_BAD_TOP_P = 11,
    /// `min_p` is not in [0, 1].
    NERVA_REQUEST_BAD_MIN_P = 12,
    /// Repetition penalty is not finite and > 0.
    NERVA_REQUEST_BAD_REPETITION_PENALTY = 13,
    /// `n_samples` is 0, above [`crate::MAX_SAMPLES`], or above the daemon's `--max-batch`
    /// (the detail says which, with the numbers).
    NERVA_REQUEST_BAD_SAMPLE_COUNT = 14,
    /// Extension (offset, len) lies outside the input region.
    NERVA_REQUEST_EXTENSION_OUT_OF_RANGE = 15,
    /// Extension block malformed.
    NERVA_REQUEST_BAD_EXTENSION = 16,
    /// Admin query kind not known.
    NERVA_REQUEST_BAD_ADMIN_QUERY = 17,
    /// Admin reply (offset, capacity) lies outside the output region.
    NERVA_REQUEST_REPLY_OUT_OF_RANGE = 18,
    /// Text prompt or chat JSON is not UTF-8.
    NERVA_REQUEST_INVALID_UTF8 = 32,
    /// A prompt token id is outside the model's vocabulary.
    NERVA_REQUEST_TOKEN_OUT_OF_VOCAB = 33,
    /// The prompt alone leaves no room to generate within the context length (or the KV
    /// pool); the detail carries both numbers. A `max_tokens` beyond the context is not
    /// refused: generation stops there with NERVA_FINISH_CONTEXT_LENGTH.
    NERVA_REQUEST_PROMPT_TOO_LONG = 34,
    /// Chat JSON is not a valid message list, or the model has no chat template.
    NERVA_REQUEST_BAD_CHAT_MESSAGES = 35,
    /// A request with this tag is already in flight for this client.
    NERVA_REQUEST_DUPLICATE_TAG = 36,
    /// `CANCEL` named a tag with no request in flight.
    NERVA_REQUEST_UNKNOWN_TAG = 37,
    /// Request table full; retry later.
    NERVA_REQUEST_OVERLOADED = 64,
    /// Admin reply larger than the capacity given.
    NERVA_REQUEST_REPLY_TRUNCATED = 65,
    /// The daemon is draining and refuses new work.
    NERVA_REQUEST_SHUTTING_DOWN = 66,
    /// The client may not run this admin query.
    NERVA_REQUEST_PERMISSION_DENIED = 67,
    /// Daemon-side failure; details in the daemon's log.
    NERVA_REQUEST_INTERNAL = 68,
}

/// Every wire status next to its C name (for the tests that keep both tables equal).
#[cfg(test)]
fn request_status_pairs() -> Vec<(StatusCode, nerva_request_status)> {
    vec![
        (StatusCode::Ok, nerva_request_status::NERVA_REQUEST_OK),
        (
            StatusCode::UnknownOpcode,
            nerva_request_status::NERVA_REQUEST_UNKNOWN_OPCODE,
        ),
        (
            StatusCode::UnsupportedVersion,
            nerva_request_status::NERVA_REQUEST_UNSUPPORTED_VERSION,
        ),
        (
            StatusCode::ReservedFlags,
            nerva_request_status::NERVA_REQUEST_RESERVED_FLAGS,
        ),
        (
            StatusCode::ReservedNonZero,
            nerva_request_status::NERVA_REQUEST_RESERVED_NON_ZERO,
        ),
        (
            StatusCode::BadPromptKind,
            nerva_request_status::NERVA_REQUEST_BAD_PROMPT_KIND,
        ),
        (
            StatusCode::EmptyPrompt,
            nerva_request_status::NERVA_REQUEST_EMPTY_PROMPT,
        ),
        (
            StatusCode::MisalignedTokenIds,
            nerva_request_status::NERVA_REQUEST_MISALIGNED_TOKEN_IDS,
        ),
        (
            StatusCode::PromptOutOfRange,
            nerva_request_status::NERVA_REQUEST_PROMPT_OUT_OF_RANGE,
        ),
        (
            StatusCode::BadMaxTokens,
            nerva_request_status::NERVA_REQUEST_BAD_MAX_TOKENS,
        ),
        (
            StatusCode::BadTemperature,
            nerva_request_status::NERVA_REQUEST_BAD_TEMPERATURE,
        ),
        (
            StatusCode::BadTopP,
            nerva_request_status::NERVA_REQUEST_BAD_TOP_P,
        ),
        (
            StatusCode::BadMinP,
            nerva_request_status::NERVA_REQUEST_BAD_MIN_P,
        ),
        (
            StatusCode::BadRepetitionPenalty,
            nerva_request_status::NERVA_REQUEST_BAD_REPETITION_PENALTY,
        ),
        (
            StatusCode::BadSampleCount,
            nerva_request_status::NERVA_REQUEST_BAD_SAMPLE_COUNT,
        ),
        (
            StatusCode::ExtensionOutOfRange,
            nerva_request_status::NERVA_REQUEST_EXTENSION_OUT_OF_RANGE,
        ),
        (
            StatusCode::BadExtension,
            nerva_request_status::NERVA_REQUEST_BAD_EXTENSION,
        ),
        (
            StatusCode::BadAdminQuery,
            nerva_request_status::NERVA_REQUEST_BAD_ADMIN_QUERY,
        ),
        (
            StatusCode::ReplyOutOfRange,
            nerva_request_status::NERVA_REQUEST_REPLY_OUT_OF_RANGE,
        ),
        (
            StatusCode::InvalidUtf8,
            nerva_request_status::NERVA_REQUEST_INVALID_UTF8,
        ),
        (
            StatusCode::TokenOutOfVocab,
            nerva_request_status::NERVA_REQUEST_TOKEN_OUT_OF_VOCAB,
        ),
        (
            StatusCode::PromptTooLong,
            nerva_request_status::NERVA_REQUEST_PROMPT_TOO_LONG,
        ),
        (
            StatusCode::BadChatMessages,
            nerva_request_status::NERVA_REQUEST_BAD_CHAT_MESSAGES,
        ),
        (
            StatusCode::DuplicateTag,
            nerva_request_status::NERVA_REQUEST_DUPLICATE_TAG,
        ),
        (
            StatusCode::UnknownTag,
            nerva_request_status::NERVA_REQUEST_UNKNOWN_TAG,
        ),
        (
            StatusCode::Overloaded,
            nerva_request_status::NERVA_REQUEST_OVERLOADED,
        ),
        (
            StatusCode::ReplyTruncated,
            nerva_request_status::NERVA_REQUEST_REPLY_TRUNCATED,
        ),
        (
            StatusCode::ShuttingDown,
            nerva_request_status::NERVA_REQUEST_SHUTTING_DOWN,
        ),
        (
            StatusCode::PermissionDenied,
            nerva_request_status::NERVA_REQUEST_PERMISSION_DENIED,
        ),
        (
            StatusCode::Internal,
            nerva_request_status::NERVA_REQUEST_INTERNAL,
        ),
    ]
}

/// The description of a request status (the `status` of a `NERVA_EVENT_ERROR` event), as a
/// NUL-terminated string in static storage (never NULL, never to be freed). Codes this library
/// does not know give "unknown request status".
#[unsafe(no_mangle)]
pub extern "C" fn nerva_request_status_string(status: u32) -> *const c_char {
    // Built once from the wire table so the text cannot drift from the daemon's. `guard`
    // cannot be used here (no int to return); the body allocates once and cannot panic on any
    // input: unknown codes fall through to a literal.
    static TEXTS: OnceLock<Vec<(u32, CString)>> = OnceLock::new();
    let texts = TEXTS.get_or_init(|| {
        StatusCode::ALL
            .iter()
            .filter_map(|code| {
                let text = CString::new(code.description()).ok()?;
                Some((u32::from(code.as_u16()), text))
            })
            .collect()
    });
    texts
        .iter()
        .find(|(code, _)| *code == status)
        .map_or(c"unknown request status".as_ptr(), |(_, text)| {
            text.as_ptr()
        })
}

impl From<&Error> for nerva_status {
    fn from(error: &Error) -> Self {
        match error.code() {
            ErrorCode::Ok => Self::NERVA_OK,
            ErrorCode::InvalidArgument => Self::NERVA_E_INVALID_ARGUMENT,
            ErrorCode::NoDaemon => Self::NERVA_E_NO_DAEMON,
            ErrorCode::PermissionDenied => Self::NERVA_E_PERMISSION_DENIED,
            ErrorCode::VersionMismatch => Self::NERVA_E_VERSION_MISMATCH,
            ErrorCode::TooManyClients => Self::NERVA_E_TOO_MANY_CLIENTS,
            ErrorCode::ResourceExhausted => Self::NERVA_E_RESOURCE_EXHAUSTED,
            ErrorCode::DaemonGone => Self::NERVA_E_DAEMON_GONE,
            ErrorCode::QueueFull => Self::NERVA_E_RING_FULL,
            ErrorCode::Timeout => Self::NERVA_E_TIMEOUT,
            ErrorCode::ShuttingDown => Self::NERVA_E_SHUTTING_DOWN,
            ErrorCode::Rejected => Self::NERVA_E_REJECTED,
            ErrorCode::Protocol => Self::NERVA_E_PROTOCOL,
            ErrorCode::Io => Self::NERVA_E_IO,
            ErrorCode::TooLarge => Self::NERVA_E_TOO_LARGE,
            ErrorCode::UnknownTag => Self::NERVA_E_UNKNOWN_TAG,
        }
    }
}

impl From<Error> for nerva_status {
    fn from(error: Error) -> Self {
        // Keep errno for C callers of an operating-system failure, as the header promises
        // (and for a failed connect: ENOENT vs ECONNREFUSED tells a typo from a dead daemon).
        let errno = match &error {
            Error::Io(io) | Error::NoDaemon { source: io, .. } => io.raw_os_error(),
            _ => None,
        };
        if let Some(errno) = errno {
            set_errno(errno);
        }
        Self::from(&error)
    }
}

fn set_errno(errno: i32) {
    // SAFETY: __errno_location returns this thread's errno slot, valid for the thread's life.
    unsafe { *libc::__errno_location() = errno };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_has_a_distinct_message_and_round_trips() {
        let mut seen = std::collections::HashSet::new();
        for status in nerva_status::all() {
            assert_eq!(nerva_status::from_code(status.code()), Some(status));
            assert!(
                seen.insert(status.message().to_bytes()),
                "{status:?} shares its text"
            );
        }
        assert_eq!(nerva_status::from_code(1), None);
        assert_eq!(nerva_status::from_code(-16), None);
        assert_eq!(nerva_status::from_code(-103), None);
    }

    #[test]
    fn c_codes_equal_the_rust_error_codes() {
        for rust in ErrorCode::ALL {
            let c = match nerva_status::from_code(rust.as_i32()) {
                Some(c) => c,
                None => panic!("{rust:?} has no C code"),
            };
            assert_eq!(c.code(), rust.as_i32(), "{rust:?}");
        }
        for c in nerva_status::all() {
            let rust_only = matches!(
                c,
                nerva_status::NERVA_E_CLIENT_IN_USE
                    | nerva_status::NERVA_E_INTERNAL
                    | nerva_status::NERVA_E_CLOSED
            );
            assert_eq!(ErrorCode::from_i32(c.code()).is_some(), !rust_only, "{c:?}");
        }
    }

    #[test]
    fn request_statuses_mirror_the_wire_table() {
        let pairs = request_status_pairs();
        assert_eq!(
            pairs.len(),
            StatusCode::ALL.len(),
            "a wire status has no C name"
        );
        for (wire, c) in pairs {
            assert_eq!(u32::from(wire.as_u16()), c as u32, "{wire:?}");
            // SAFETY: nerva_request_status_string returns a static NUL-terminated string.
            let text = unsafe { core::ffi::CStr::from_ptr(nerva_request_status_string(c as u32)) };
            assert_eq!(text.to_str(), Ok(wire.description()));
        }
        // SAFETY: as above.
        let unknown = unsafe { core::ffi::CStr::from_ptr(nerva_request_status_string(9999)) };
        assert_eq!(unknown.to_bytes(), b"unknown request status");
    }
}

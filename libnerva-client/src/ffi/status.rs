//! Return codes of the C ABI and their text.

use core::ffi::{c_char, c_int};

/// Return codes of every `int`-returning `nerva_` function: `NERVA_OK` (0) or a negative code.
///
/// | code | name                         | meaning                                              | state after the failed call                                   |
/// |-----:|------------------------------|------------------------------------------------------|---------------------------------------------------------------|
/// |    0 | NERVA_OK                     | success                                              | -                                                             |
/// |   -1 | NERVA_E_INVALID_ARGUMENT     | NULL pointer, bad length, parameter out of range, text not UTF-8 | nothing sent, nothing changed; fix the call           |
/// |   -2 | NERVA_E_NOT_CONNECTED        | no daemon listens at the socket path                 | connect: `*out` is NULL; start nervad or fix the path        |
/// |   -3 | NERVA_E_DAEMON_GONE          | the daemon hung up, crashed or was killed            | the client is dead: every later call fails; close it         |
/// |   -4 | NERVA_E_RING_FULL            | no room in the submission ring or input area *now*   | nothing sent; poll/wait for events, then retry                |
/// |   -5 | NERVA_E_VERSION_MISMATCH     | library and daemon speak different wire versions     | connect: `*out` is NULL; upgrade one side                     |
/// |   -6 | NERVA_E_PERMISSION_DENIED    | the daemon's access policy refused this process      | connect: `*out` is NULL                                       |
/// |   -7 | NERVA_E_TIMEOUT              | nothing arrived within the timeout                   | nothing changed; call again                                   |
/// |   -8 | NERVA_E_TOO_LARGE            | the request can never fit the client's data area     | nothing sent; shorten the prompt or stop strings              |
/// |   -9 | NERVA_E_BUSY                 | the daemon is at its client limit or out of memory   | connect: `*out` is NULL; retry later                          |
/// |  -10 | NERVA_E_SHUTTING_DOWN        | the daemon is draining and accepts no new work       | in-flight requests still finish; close the client             |
/// |  -11 | NERVA_E_PROTOCOL             | the daemon sent something malformed                  | the client is unusable; close it                              |
/// |  -12 | NERVA_E_IO                   | a system call failed (`errno` is kept)               | connect: `*out` is NULL; otherwise close the client           |
/// |  -13 | NERVA_E_UNKNOWN_TAG          | the tag is not in flight (finished or never issued)  | nothing changed; harmless after a race with completion       |
/// |  -14 | NERVA_E_CLIENT_IN_USE        | another thread is inside a call on this client       | nothing done; serialize calls on one client                   |
/// |  -15 | NERVA_E_INTERNAL             | a bug inside the library (caught, never unwound into C) | the client is poisoned: later calls fail; close it         |
///
/// Errors that belong to one request (a parameter the daemon rejected, a prompt longer than the
/// model's context) arrive as `NERVA_EVENT_ERROR` events with the same codes in `status`.
#[repr(i32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum nerva_status {
    /// Success.
    NERVA_OK = 0,
    /// A NULL pointer, a bad length, a parameter out of range or text that is not UTF-8.
    NERVA_E_INVALID_ARGUMENT = -1,
    /// No daemon listens at the socket path.
    NERVA_E_NOT_CONNECTED = -2,
    /// The daemon hung up, crashed or was killed; the client is dead.
    NERVA_E_DAEMON_GONE = -3,
    /// No room in the submission ring or input area now; retry after polling events.
    NERVA_E_RING_FULL = -4,
    /// Library and daemon speak different wire versions.
    NERVA_E_VERSION_MISMATCH = -5,
    /// The daemon's access policy refused this process.
    NERVA_E_PERMISSION_DENIED = -6,
    /// Nothing arrived within the timeout.
    NERVA_E_TIMEOUT = -7,
    /// The request can never fit the client's data area.
    NERVA_E_TOO_LARGE = -8,
    /// The daemon is at its client limit or out of memory; retry later.
    NERVA_E_BUSY = -9,
    /// The daemon is shutting down and accepts no new work.
    NERVA_E_SHUTTING_DOWN = -10,
    /// The daemon sent something malformed; the client is unusable.
    NERVA_E_PROTOCOL = -11,
    /// A system call failed; `errno` holds the reason.
    NERVA_E_IO = -12,
    /// The tag is not in flight.
    NERVA_E_UNKNOWN_TAG = -13,
    /// Another thread is inside a call on this client.
    NERVA_E_CLIENT_IN_USE = -14,
    /// A bug inside the library; the client is poisoned.
    NERVA_E_INTERNAL = -15,
}

impl nerva_status {
    /// Every code, in table order. (A function, not an associated const: cbindgen would export
    /// the const into the header.)
    pub fn all() -> [nerva_status; 16] {
        [
        Self::NERVA_OK,
        Self::NERVA_E_INVALID_ARGUMENT,
        Self::NERVA_E_NOT_CONNECTED,
        Self::NERVA_E_DAEMON_GONE,
        Self::NERVA_E_RING_FULL,
        Self::NERVA_E_VERSION_MISMATCH,
        Self::NERVA_E_PERMISSION_DENIED,
        Self::NERVA_E_TIMEOUT,
        Self::NERVA_E_TOO_LARGE,
        Self::NERVA_E_BUSY,
        Self::NERVA_E_SHUTTING_DOWN,
        Self::NERVA_E_PROTOCOL,
        Self::NERVA_E_IO,
        Self::NERVA_E_UNKNOWN_TAG,
        Self::NERVA_E_CLIENT_IN_USE,
        Self::NERVA_E_INTERNAL,
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
            Self::NERVA_E_NOT_CONNECTED => c"no daemon listens at the socket path",
            Self::NERVA_E_DAEMON_GONE => c"the daemon is gone (hung up or killed)",
            Self::NERVA_E_RING_FULL => c"submission ring or input area full; poll events and retry",
            Self::NERVA_E_VERSION_MISMATCH => c"library and daemon wire versions differ",
            Self::NERVA_E_PERMISSION_DENIED => c"permission denied by the daemon's access policy",
            Self::NERVA_E_TIMEOUT => c"timed out",
            Self::NERVA_E_TOO_LARGE => c"request too large for the client's data area",
            Self::NERVA_E_BUSY => c"daemon busy (client limit or out of memory); retry later",
            Self::NERVA_E_SHUTTING_DOWN => c"the daemon is shutting down",
            Self::NERVA_E_PROTOCOL => c"protocol error: the daemon sent malformed data",
            Self::NERVA_E_IO => c"system call failed (see errno)",
            Self::NERVA_E_UNKNOWN_TAG => c"no request with this tag is in flight",
            Self::NERVA_E_CLIENT_IN_USE => c"the client is in use by another thread",
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_has_a_distinct_message_and_round_trips() {
        let mut seen = std::collections::HashSet::new();
        for status in nerva_status::all() {
            assert_eq!(nerva_status::from_code(status.code()), Some(status));
            assert!(seen.insert(status.message().to_bytes()), "{status:?} shares its text");
        }
        assert_eq!(nerva_status::from_code(1), None);
        assert_eq!(nerva_status::from_code(-16), None);
    }
}

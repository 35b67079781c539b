//! Errors of the client API, each with a stable numeric [`ErrorCode`] (the C ABI returns them).

use std::fmt;
use std::io;

use nerva_rings::status::StatusCode;

/// Stable error numbers. ABI: never renumber, only add. 0 is success; errors are negative.
///
/// | code | name | meaning | state after the failure |
/// | ---: | --- | --- | --- |
/// | 0 | `Ok` | success | — |
/// | -1 | `InvalidArgument` | a parameter is out of range or malformed | unchanged; nothing sent |
/// | -2 | `NoDaemon` | no daemon listens on the socket path | no client |
/// | -3 | `PermissionDenied` | the daemon's access policy refused this process | no client |
/// | -4 | `VersionMismatch` | client and daemon ABI versions differ | no client |
/// | -5 | `TooManyClients` | the daemon serves its maximum number of clients | no client; retry later |
/// | -6 | `ResourceExhausted` | the daemon could not create this client's segment | no client |
/// | -7 | `DaemonGone` | the daemon exited or dropped this client | client unusable; close it |
/// | -8 | `QueueFull` | submission ring or input region full | unchanged; poll, then retry |
/// | -9 | `Timeout` | the wait timed out | unchanged |
/// | -10 | `ShuttingDown` | the daemon is draining; no new work | in-flight requests still finish |
/// | -11 | `Rejected` | the daemon refused a request (see the status code) | that request is over |
/// | -12 | `Protocol` | the daemon broke the protocol (corrupt ring, bad segment) | client unusable |
/// | -13 | `Io` | an operating-system call failed | depends; usually unusable |
/// | -14 | `TooLarge` | prompt or reply larger than the segment can ever hold | unchanged; nothing sent |
/// | -15 | `UnknownTag` | no request with this tag is in flight | unchanged |
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(i32)]
#[non_exhaustive]
pub enum ErrorCode {
    /// Success.
    Ok = 0,
    /// A parameter is out of range or malformed.
    InvalidArgument = -1,
    /// No daemon listens on the socket path.
    NoDaemon = -2,
    /// The daemon's access policy refused this process.
    PermissionDenied = -3,
    /// Client and daemon ABI versions differ.
    VersionMismatch = -4,
    /// The daemon serves its maximum number of clients.
    TooManyClients = -5,
    /// The daemon could not create this client's segment.
    ResourceExhausted = -6,
    /// The daemon exited or dropped this client.
    DaemonGone = -7,
    /// Submission ring or input region full: poll for events, then retry.
    QueueFull = -8,
    /// The wait timed out.
    Timeout = -9,
    /// The daemon is draining and takes no new work.
    ShuttingDown = -10,
    /// The daemon refused a request.
    Rejected = -11,
    /// The daemon broke the protocol.
    Protocol = -12,
    /// An operating-system call failed.
    Io = -13,
    /// Larger than the segment can ever hold.
    TooLarge = -14,
    /// No request with this tag is in flight.
    UnknownTag = -15,
}

impl ErrorCode {
    /// Every code, in order (for tables and tests).
    pub const ALL: [ErrorCode; 16] = [
        Self::Ok,
        Self::InvalidArgument,
        Self::NoDaemon,
        Self::PermissionDenied,
        Self::VersionMismatch,
        Self::TooManyClients,
        Self::ResourceExhausted,
        Self::DaemonGone,
        Self::QueueFull,
        Self::Timeout,
        Self::ShuttingDown,
        Self::Rejected,
        Self::Protocol,
        Self::Io,
        Self::TooLarge,
        Self::UnknownTag,
    ];

    /// The numeric value.
    pub const fn as_i32(self) -> i32 {
        self as i32
    }

    /// Decode a numeric value.
    pub fn from_i32(value: i32) -> Option<Self> {
        Self::ALL.iter().copied().find(|c| *c as i32 == value)
    }

    /// One-line description (the C ABI's error-string function returns this).
    pub const fn description(self) -> &'static str {
        match self {
            Self::Ok => "success",
            Self::InvalidArgument => "invalid argument",
            Self::NoDaemon => "no daemon is listening on the socket",
            Self::PermissionDenied => "the daemon's access policy refused this process",
            Self::VersionMismatch => "client and daemon ABI versions differ",
            Self::TooManyClients => "the daemon serves its maximum number of clients",
            Self::ResourceExhausted => "the daemon could not create this client's segment",
            Self::DaemonGone => "the daemon exited or dropped this client",
            Self::QueueFull => "submission queue full; poll for events and retry",
            Self::Timeout => "timed out",
            Self::ShuttingDown => "the daemon is shutting down",
            Self::Rejected => "the daemon rejected the request",
            Self::Protocol => "the daemon broke the protocol",
            Self::Io => "operating-system error",
            Self::TooLarge => "larger than the shared segment can hold",
            Self::UnknownTag => "no request with this tag is in flight",
        }
    }
}

/// What went wrong.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// A parameter is out of range or malformed.
    InvalidArgument(String),
    /// Nothing listens on the socket path.
    NoDaemon {
        /// The path tried.
        path: std::path::PathBuf,
        /// The connect error.
        source: io::Error,
    },
    /// The daemon's access policy refused this process.
    PermissionDenied(String),
    /// ABI versions differ.
    VersionMismatch {
        /// This library's version.
        client: u32,
        /// The daemon's version.
        daemon: u32,
    },
    /// The daemon serves its maximum number of clients.
    TooManyClients(String),
    /// The daemon could not create this client's segment.
    ResourceExhausted(String),
    /// The daemon exited or dropped this client.
    DaemonGone,
    /// Submission ring or input region full.
    QueueFull,
    /// A wait timed out.
    Timeout,
    /// The daemon is draining.
    ShuttingDown,
    /// The daemon refused a request.
    Rejected(StatusCode),
    /// The daemon refused a query, saying why (e.g. a token id outside the vocabulary).
    Refused {
        /// The wire status.
        status: StatusCode,
        /// The daemon's detail.
        detail: String,
    },
    /// The daemon broke the protocol.
    Protocol(String),
    /// An operating-system call failed.
    Io(io::Error),
    /// Larger than the segment can ever hold.
    TooLarge {
        /// Bytes needed.
        needed: u64,
        /// Bytes the region has.
        capacity: u64,
    },
    /// No request with this tag is in flight.
    UnknownTag(u64),
}

impl Error {
    /// The stable code.
    pub fn code(&self) -> ErrorCode {
        match self {
            Error::InvalidArgument(_) => ErrorCode::InvalidArgument,
            Error::NoDaemon { .. } => ErrorCode::NoDaemon,
            Error::PermissionDenied(_) => ErrorCode::PermissionDenied,
            Error::VersionMismatch { .. } => ErrorCode::VersionMismatch,
            Error::TooManyClients(_) => ErrorCode::TooManyClients,
            Error::ResourceExhausted(_) => ErrorCode::ResourceExhausted,
            Error::DaemonGone => ErrorCode::DaemonGone,
            Error::QueueFull => ErrorCode::QueueFull,
            Error::Timeout => ErrorCode::Timeout,
            Error::ShuttingDown => ErrorCode::ShuttingDown,
            Error::Rejected(_) | Error::Refused { .. } => ErrorCode::Rejected,
            Error::Protocol(_) => ErrorCode::Protocol,
            Error::Io(_) => ErrorCode::Io,
            Error::TooLarge { .. } => ErrorCode::TooLarge,
            Error::UnknownTag(_) => ErrorCode::UnknownTag,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::InvalidArgument(what) => write!(f, "invalid argument: {what}"),
            Error::NoDaemon { path, source } => {
                write!(f, "no daemon on {}: {source}", path.display())
            }
            Error::PermissionDenied(m) => write!(f, "permission denied by the daemon: {m}"),
            Error::VersionMismatch { client, daemon } => {
                write!(f, "ABI version mismatch: client {client}, daemon {daemon}")
            }
            Error::TooManyClients(m) => write!(f, "daemon is full: {m}"),
            Error::ResourceExhausted(m) => write!(f, "daemon out of resources: {m}"),
            Error::DaemonGone => f.write_str("the daemon exited or dropped this client"),
            Error::QueueFull => f.write_str("submission queue full; poll and retry"),
            Error::Timeout => f.write_str("timed out"),
            Error::ShuttingDown => f.write_str("the daemon is shutting down"),
            Error::Rejected(code) => write!(f, "rejected by the daemon: {code}"),
            Error::Refused { status, detail } => {
                write!(f, "rejected by the daemon: {status}: {detail}")
            }
            Error::Protocol(m) => write!(f, "protocol error: {m}"),
            Error::Io(e) => write!(f, "i/o error: {e}"),
            Error::TooLarge { needed, capacity } => {
                write!(f, "{needed} bytes do not fit a region of {capacity} bytes")
            }
            Error::UnknownTag(t) => write!(f, "no request with tag {t} is in flight"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::NoDaemon { source, .. } => Some(source),
            Error::Io(e) => Some(e),
            _ => None,
        }
    }
}

impl From<io::Error> for Error {
    fn from(e: io::Error) -> Self {
        Error::Io(e)
    }
}

impl From<nix::Error> for Error {
    fn from(e: nix::Error) -> Self {
        Error::Io(io::Error::from(e))
    }
}

/// Result with the client's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_unique_and_round_trip() {
        let mut seen = std::collections::HashSet::new();
        for c in ErrorCode::ALL {
            assert!(seen.insert(c.as_i32()));
            assert_eq!(ErrorCode::from_i32(c.as_i32()), Some(c));
            assert!(!c.description().is_empty());
        }
        assert_eq!(Error::QueueFull.code(), ErrorCode::QueueFull);
        assert_eq!(ErrorCode::from_i32(1), None);
    }
}
